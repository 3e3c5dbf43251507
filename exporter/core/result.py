"""One request's measurement as the core hands it over: :class:`Result`, and the failure reasons in
their order of precedence."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from exporter.core.decode import Gaps

__all__ = ["REASONS", "TRANSPORT_REASONS", "Result"]

#: Failure reasons in order of precedence: the first that applies wins.
REASONS: tuple[str, ...] = (
    "client_abort",
    "proxy_error",  # a fault of the proxy itself: never blamed on the engine
    "connect_error",
    "timeout",
    "upstream_disconnect",
    "http_status",
    "sse_error",
    "malformed",
    "missing_done",
    "empty_text",
    "missing_usage",
    "length_mismatch",
)
#: Reasons decided by the transport, not by the bytes; the caller passes them to finish().
TRANSPORT_REASONS: frozenset[str] = frozenset(REASONS[:5])


@dataclass(slots=True)
class Result:
    """Everything measured about one request; ``outcome`` is success, failure or client_abort.

    Times are seconds from t0.  ``ttft_s``: first event with visible text.  ``ttfb_s``:
    first response body byte.  ``ttfe_s``: first SSE data event whose ``choices`` list is
    non-empty, text or not (what vLLM's bench client calls TTFT).  A non-streaming
    body is one document that arrives whole: its ``ttft_s`` and ``ttfe_s`` are the time it was
    complete (when it has text / choices), its ``ttfb_s`` the first byte as for a stream.
    """

    outcome: str
    reason: str | None
    detail: str | None
    status: int | None
    ttft_s: float | None
    ttfb_s: float | None
    ttfe_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    expected_tokens: int | None
    visible_chars: int
    done: bool
    usage: bool
    events: int
    bytes: int
    response_id: str | None
    engine_queue_s: float | None = None  # the engine's own clock, where it tells it (core.enginetime)
    engine_prefill_s: float | None = None
    engine_decode_s: float | None = None
    ttft_outside_engine_s: float | None = None  # TTFT − queue − prefill
    engine_timing: str | None = None  # "stream", "engine-log" or None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, where the engine tells it
    # decode truth (core.decode): per-token gaps and the channels
    itl_p50_s: float | None = None
    itl_p95_s: float | None = None
    itl_p99_s: float | None = None
    itl_max_s: float | None = None
    text_events: int | None = None
    tokens_per_event: float | None = None
    decode_stalls: int | None = None
    merged_reads: int | None = None
    ttst_s: float | None = None
    ttfo_s: float | None = None
    reasoning_s: float | None = None
    reasoning_tokens: int | None = None
    ttftc_s: float | None = None
    spec_draft_tokens: int | None = None
    spec_accepted_tokens: int | None = None
    #: the per-token gaps, for the ITL histogram (not a record field)
    itl_gaps: Gaps | None = field(default=None, repr=False)
    #: an embeddings or rerank answer: counted, timed apart, never a generation (not a record field)
    pooling: bool = field(default=False, repr=False)

    @property
    def ok(self) -> bool:
        return self.outcome == "success"

    @property
    def empty_text_200(self) -> bool:
        """HTTP 200, stream ended by the server, and not one visible character (of a generation)."""
        return (
            not self.pooling
            and self.status == 200
            and self.visible_chars == 0
            and self.reason not in TRANSPORT_REASONS
        )

    def as_dict(self) -> dict[str, Any]:
        # every field is a scalar: a shallow copy, not dataclasses.asdict's deep one
        return {name: getattr(self, name) for name in _RESULT_FIELDS}


_RESULT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Result) if f.name not in ("itl_gaps", "pooling"))
