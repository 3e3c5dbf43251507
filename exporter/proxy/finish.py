"""The end of one measured request: verdict, metrics, record, observers; the capture (when
kept) is hashed and written in a thread first, so that the record can name its SHA-256."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from exporter.core.analysis import Result, StreamAnalyzer
from exporter.core.timefmt import iso

from .records import write_capture

if TYPE_CHECKING:
    from .exchange import Exchange

__all__ = ["judge", "write_record", "finish_with_capture"]

log = logging.getLogger("llmbench.proxy")


def judge(ex: Exchange, meta: dict[str, Any], error: str | None, detail: str | None
          ) -> tuple[Result, dict[str, Any], Callable[[], tuple[str, str]] | None]:
    """Judge and count ``ex``; return its result, its record, and the capture writer (None
    when no capture is kept).  Synchronous: nothing here waits."""
    state = ex.state
    now = time.monotonic()
    analyzer = ex.analyzer
    if analyzer is None:  # no response at all: judge an empty one
        analyzer = StreamAnalyzer(ex.t0, None, ex.spec, streaming=False)
    result = analyzer.finish(ex.end_t if ex.end_t is not None else now, error, detail)
    state.metrics.observe(meta["engine"], meta["scenario"], result)
    record: dict[str, Any] = {
        **meta,
        "start": iso(ex.wall, ms=True),
        "start_unix": round(ex.wall, 6),
        **result.as_dict(),
        "usage_injected": ex.usage_injected,
        "timing_uncertainty_s": round(state.loop_lag.max_since(ex.lag_mark), 6),
        "capture": None,
        "capture_sha256": None,
    }
    cap = ex.capture
    if cap is None or ex.analyzer is None or (state.config.capture_raw_sse != "all" and result.ok):
        return result, record, None
    return result, record, functools.partial(write_capture, state.captures_dir, ex.id, cap, {
        "status": result.status,
        "streaming": ex.analyzer.streaming,
        "expected_tokens": result.expected_tokens,
        "transport_error": error,
        "end_offset": round(now - ex.t0, 6),
        "verdict": {"outcome": result.outcome, "reason": result.reason},
        "record": {k: meta[k] for k in ("engine", "scenario", "round", "route")},
    })


def write_record(ex: Exchange, record: dict[str, Any]) -> None:
    """One line in requests.jsonl, then the observers (OTLP...)."""
    state = ex.state
    try:
        state.requests_log.write(record)
    except (OSError, ValueError) as exc:
        log.error("record %s not written: %s", ex.id, exc)
    for observer in state.observers:
        try:
            observer.observe(record)
        except Exception:  # an observer's bug must not cost the request
            log.exception("observer %s failed on %s", type(observer).__name__, ex.id)


async def finish_with_capture(ex: Exchange, record: dict[str, Any], write: Callable[[], tuple[str, str]]) -> None:
    """Hash and write the capture in a thread (never on the loop), then the record."""
    try:
        record["capture"], record["capture_sha256"] = await asyncio.get_running_loop().run_in_executor(None, write)
    except OSError as exc:
        log.error("capture %s not written: %s", ex.id, exc)
    write_record(ex, record)
