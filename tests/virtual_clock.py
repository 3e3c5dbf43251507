"""An event loop on a virtual clock, for tests whose verdicts hang on durations.

:class:`VirtualClockLoop`'s clock (``loop.time()``) stands still while anything is ready to run
or to read, and jumps to the next timer when nothing is: ``asyncio.sleep(0.03)`` takes no real
time, and a duration measured with ``loop.time`` is exactly what the code under test slept,
however busy the machine.  The sockets are real.  Over Unix-domain sockets a write is in the
peer's receive queue when ``send`` returns, so "nothing readable now" means nothing is on its
way, and the clock never jumps past data in flight (over TCP loopback the kernel may deliver a
moment later, so a test on this loop talks over Unix sockets: :func:`unix_site`).

Where nothing is ready and no timer is due, the loop waits for real (a worker thread's result,
say) without moving the clock.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from exporter.harness.load import Driver, Plan

__all__ = ["VirtualClockLoop", "unix_site", "run_plan"]


class _Selector(selectors.BaseSelector):
    """The real selector, asked without waiting; an empty answer moves the loop's clock to the
    timeout, the next timer."""

    def __init__(self, loop: VirtualClockLoop) -> None:
        self._real = selectors.DefaultSelector()
        self._loop = loop

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer: only a thread (or a signal) can wake the loop
            return self._real.select(None)
        self._loop.advance(timeout)
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """See the module's docstring.  ``time()`` starts at 0."""

    def __init__(self) -> None:
        self._now = 0.0
        super().__init__(_Selector(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds


async def unix_site(app: web.Application, path: Path) -> web.AppRunner:
    """``app`` served on the Unix socket ``path``; the caller cleans the runner up."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.UnixSite(runner, str(path)).start()
    return runner


def run_plan(app: web.Application, plan: Plan, sock: Path, out: Path, **driver: Any) -> dict[str, Any]:
    """``plan`` run by the load driver (records and tables in ``out``) against ``app`` (served on
    the Unix socket ``sock``), both on one :class:`VirtualClockLoop`: the driver's stamps are the
    loop's clock; its summary."""

    async def main() -> dict[str, Any]:
        runner = await unix_site(app, sock)
        try:
            async with Driver("http://engine", out, clock=asyncio.get_running_loop().time,
                              connector=lambda: aiohttp.UnixConnector(path=str(sock), limit=0), **driver) as d:
                return await d.run_plan(plan)
        finally:
            await runner.cleanup()

    with asyncio.Runner(loop_factory=VirtualClockLoop) as run:
        return run.run(main())
