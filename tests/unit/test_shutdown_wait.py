"""Issue 26: a worker's shutdown waits on its requests in flight, as they leave, not by looking
every few milliseconds (exporter/proxy/state.py ``InFlight``, ``ProxyState.stop_exchanges``)."""

from __future__ import annotations

import asyncio
from typing import Any

from exporter.proxy.state import STATE, InFlight, ProxyState


async def _turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def _exchange(state: ProxyState) -> None:
    """A request's handler as exchange.py runs it: in the set until its ``finally``."""
    task = asyncio.current_task()
    assert task is not None
    state.exchanges.add(task)
    try:
        await asyncio.sleep(30)
    finally:
        state.exchanges.discard(task)


async def test_wait_empty_returns_as_the_last_one_leaves() -> None:
    tasks = InFlight()
    assert await tasks.wait_empty(0)  # none in flight
    a, b = (asyncio.create_task(asyncio.sleep(30)) for _ in range(2))
    tasks.add(a)
    tasks.add(b)
    waiting = asyncio.create_task(tasks.wait_empty())
    tasks.discard(a)
    await _turns()
    assert not waiting.done() and list(tasks) == [b]
    tasks.discard(b)
    await _turns()
    assert waiting.done() and waiting.result() is True and len(tasks) == 0
    tasks.add(a)
    assert await tasks.wait_empty(0.01) is False
    for t in (a, b):
        t.cancel()


async def test_shutdown_returns_when_the_last_request_ends(upstream: Any, proxy_factory: Any) -> None:
    """Within a few turns of the loop (the old loop looked every 50 ms)."""
    client = await proxy_factory(upstream[1].port)
    state = client.app[STATE]
    one = asyncio.create_task(_exchange(state))
    await _turns()
    stopping = asyncio.create_task(state.stop_exchanges())
    await asyncio.sleep(0.02)
    assert not stopping.done()
    state.exchanges.discard(one)  # the request left the set (its finally ran)
    await _turns()
    assert stopping.done() and not one.cancelled()
    one.cancel()


async def test_shutdown_cancels_what_is_left_after_the_grace(upstream: Any, proxy_factory: Any) -> None:
    client = await proxy_factory(upstream[1].port)
    state = client.app[STATE]
    state.shutdown_grace_s = 0.05
    one = asyncio.create_task(_exchange(state))
    await _turns()
    await asyncio.wait_for(state.stop_exchanges(), 10)
    assert one.cancelled() and len(state.exchanges) == 0
