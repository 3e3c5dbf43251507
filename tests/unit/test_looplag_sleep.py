"""The loop-lag probe slows down while no request is in flight (an idle proxy barely wakes a
core), keeps sampling, and samples fast again from the next request on."""

from __future__ import annotations

import asyncio

import pytest

from exporter.proxy import looplag


async def _until(predicate: object) -> None:
    async with asyncio.timeout(30):  # only against a hang
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(looplag.PERIOD_S)


@pytest.mark.parametrize("kind", ["timerfd", "timer"])
async def test_the_probe_idles_slowly_and_wakes_with_a_request(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if kind == "timer":
        monkeypatch.setattr(looplag, "_timerfd", lambda period_s: None)
    monkeypatch.setattr(looplag, "LINGER_S", 0.05)
    monkeypatch.setattr(looplag, "IDLE_PERIOD_S", 0.02)
    samples: list[float] = []
    lag = looplag.LoopLag(samples.append)
    lag.start(asyncio.get_running_loop())
    try:
        assert lag.kind == kind and lag.armed
        await _until(lambda: not lag.armed)  # nothing in flight: slow after the linger
        assert lag._period == looplag.IDLE_PERIOD_S
        asleep = len(samples)
        await _until(lambda: len(samples) >= asleep + 2)  # still sampled while idle, slowly
        mark = lag.mark()  # a request: sampling fast again
        assert lag.armed and lag._period == looplag.PERIOD_S
        await _until(lambda: len(samples) >= asleep + 3)
        await asyncio.sleep(0.1)
        assert lag.armed  # still in flight: awake past the linger
        lag.release(mark)  # the request is done
        await _until(lambda: not lag.armed)
    finally:
        lag.stop()
