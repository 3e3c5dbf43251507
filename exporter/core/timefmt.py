"""The one timestamp format of records, events and evidence: RFC 3339, UTC, ``Z``."""

from __future__ import annotations

import math
import time

__all__ = ["iso"]

_second: list[tuple[int, str]] = [(0, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(0)))]  # the last one spelled


def iso(ts: float, ms: bool = False) -> str:
    """Unix seconds as RFC 3339 UTC (``2026-11-30T12:00:00Z``); with ``ms``, milliseconds too,
    as every record spells its times.  Truncates, never rounds up into the next second."""
    second = math.floor(ts)
    last, text = _second[0]
    if second != last:  # a record a request: the second is usually the last one's
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _second[0] = (second, text)
    return text + (f".{int(ts % 1 * 1000):03d}Z" if ms else "Z")
