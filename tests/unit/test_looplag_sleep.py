"""The loop-lag probe sleeps while no request is in flight (an idle proxy wakes no core) and
samples again from the next request on."""

from __future__ import annotations

import asyncio

import pytest

from exporter.proxy import looplag


async def _until(predicate: object) -> None:
    async with asyncio.timeout(30):  # only against a hang
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(looplag.PERIOD_S)


@pytest.mark.parametrize("kind", ["timerfd", "timer"])
async def test_the_probe_sleeps_when_idle_and_wakes_with_a_request(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if kind == "timer":
        monkeypatch.setattr(looplag, "_timerfd", lambda period_s: None)
    monkeypatch.setattr(looplag, "LINGER_S", 0.05)
    samples: list[float] = []
    lag = looplag.LoopLag(samples.append)
    lag.start(asyncio.get_running_loop())
    try:
        assert lag.kind == kind and lag.armed
        await _until(lambda: not lag.armed)  # nothing in flight: asleep after the linger
        asleep = len(samples)
        await asyncio.sleep(20 * looplag.PERIOD_S)
        assert len(samples) == asleep  # no sample while asleep
        assert lag.pending(10**9) == 0.0  # nothing is pending on a sleeping probe
        mark = lag.mark()  # a request: sampling again
        assert lag.armed
        await _until(lambda: len(samples) >= asleep + 3)
        await asyncio.sleep(0.1)
        assert lag.armed  # still in flight: awake past the linger
        lag.max_since(mark)  # the request is done
        await _until(lambda: not lag.armed)
    finally:
        lag.stop()
