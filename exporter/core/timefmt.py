"""The one timestamp format of records, events and evidence: RFC 3339, UTC, ``Z``."""

from __future__ import annotations

import time

__all__ = ["iso"]


def iso(ts: float, ms: bool = False) -> str:
    """Unix seconds as RFC 3339 UTC (``2026-11-30T12:00:00Z``); with ``ms``, milliseconds too,
    as every record spells its times.  Truncates, never rounds up into the next second."""
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts))
    return text + (f".{int(ts % 1 * 1000):03d}Z" if ms else "Z")
