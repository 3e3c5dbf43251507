"""The engine's own clock for one request, where the engine tells it: where the TTFT went.

Two sources, one shape (:class:`EngineTiming`, seconds):

* vLLM started with ``--enable-per-request-metrics`` puts a ``metrics`` object in the final
  usage chunk of a stream (and in a non-streamed answer): ``queue_time_ms`` (queued to
  scheduled), ``time_to_first_token_ms`` (scheduled to the first token: the prefill, as the
  engine saw it), ``generation_time_ms`` (first to last token).  :func:`from_vllm_metrics`.
* SGLang started with ``--enable-metrics --export-metrics-to-file`` writes one JSON line per
  request with its stamps; :func:`from_sglang_line` reads the timing and nothing else (the line
  also holds the prompt, which must reach no output).

``ttft_outside_engine_s`` = the proxy's TTFT − queue − prefill: HTTP, tokenizing, hand-offs,
detokenizing and the network, everything the engine's own clock does not see.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["EngineTiming", "from_vllm_metrics", "from_sglang_line", "outside_engine", "missing_parts"]

PARTS = ("queue_s", "prefill_s", "decode_s")


@dataclass(frozen=True, slots=True)
class EngineTiming:
    """One request's time inside the engine (None: the engine did not say)."""

    queue_s: float | None
    prefill_s: float | None
    decode_s: float | None
    source: str  # "stream" (vLLM's metrics object) or "engine-log" (SGLang's request file)

    def fields(self) -> dict[str, float | str | None]:
        """The record's fields for it."""
        return {"engine_queue_s": self.queue_s, "engine_prefill_s": self.prefill_s,
                "engine_decode_s": self.decode_s, "engine_timing": self.source}


def _seconds(obj: Mapping[str, Any], key: str, scale: float) -> float | None:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        return None
    return float(value) * scale


def from_vllm_metrics(metrics: object) -> EngineTiming | None:
    """vLLM's per-request ``metrics`` object, or None when it holds no timing."""
    if not isinstance(metrics, dict):
        return None
    timing = EngineTiming(_seconds(metrics, "queue_time_ms", 1e-3), _seconds(metrics, "time_to_first_token_ms", 1e-3),
                          _seconds(metrics, "generation_time_ms", 1e-3), "stream")
    return None if timing.queue_s is timing.prefill_s is timing.decode_s is None else timing


def _span(obj: Mapping[str, Any], start: str, end: str) -> float | None:
    a, b = _seconds(obj, start, 1.0), _seconds(obj, end, 1.0)
    return None if a is None or b is None or b < a else b - a


def from_sglang_line(line: Mapping[str, Any]) -> EngineTiming | None:
    """SGLang's per-request line: queue = its ``queue_time`` (seconds), prefill =
    ``prefill_finished_time`` − ``forward_entry_time``, decode = ``request_finished_ts`` −
    ``prefill_finished_time`` (unix seconds).  A stamp that is missing leaves its part None
    (without ``--enable-metrics`` the line holds only ``e2e_latency``: no part at all)."""
    queue = _seconds(line, "queue_time", 1.0)
    prefill = _span(line, "forward_entry_time", "prefill_finished_time")
    decode = _span(line, "prefill_finished_time", "request_finished_ts")
    timing = EngineTiming(queue, prefill, decode, "engine-log")
    return None if queue is prefill is decode is None else timing


def outside_engine(ttft_s: float | None, timing: EngineTiming | None) -> float | None:
    """TTFT − queue − prefill, where all three are known."""
    if ttft_s is None or timing is None or timing.queue_s is None or timing.prefill_s is None:
        return None
    return ttft_s - timing.queue_s - timing.prefill_s


def missing_parts(timing: EngineTiming | None) -> list[str]:
    """The parts the engine did not give (all of them without timing)."""
    if timing is None:
        return list(PARTS)
    return [part for part in PARTS if getattr(timing, part) is None]
