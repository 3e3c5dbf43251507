"""The measuring core: visible text, timing and the verdict of one request.

Pure code, no sockets and no clock of its own: callers pass arrival times (monotonic
seconds).  The proxy, the load driver and ``evidence decode`` all use this module, so the
project has exactly one definition of TTFT, TPOT, E2E and success.
"""

from __future__ import annotations

from typing import Any

from exporter.core.decode import DEFAULT_STALL_S, DecodeTrack, spec_counts
from exporter.core.endpoints import POOLING, pooling_problem, reader_for
from exporter.core.enginetime import EngineTiming, from_vllm_metrics, outside_engine
from exporter.core.jsondepth import loads, loads_exact
from exporter.core.request import RequestSpec
from exporter.core.result import REASONS, TRANSPORT_REASONS, Result
from exporter.core.sse import SSEParser
from exporter.core.visible import cached_tokens, error_message, has_float_tokens, usage_tokens, visible_chars

__all__ = [
    "REASONS",
    "TRANSPORT_REASONS",
    "RequestSpec",
    "Result",
    "StreamAnalyzer",
    "visible_chars",
    "analyze_bytes",
    "loads",
]

#: Default bound of one line and of one event (or non-streaming body) held in memory.
DEFAULT_MAX_BYTES = 16 << 20


def _exact_usage(data: bytes) -> tuple[int, int] | None:
    """The usage as the standard library reads it (integers of any size)."""
    try:
        doc = loads_exact(data)
    except ValueError:
        return None
    return usage_tokens(doc.get("usage")) if isinstance(doc, dict) else None


def _since(t: float | None, t0: float) -> float | None:
    return None if t is None else t - t0


class StreamAnalyzer:
    """Measure and judge one response from its bytes and their arrival times.

    ``streaming`` selects SSE parsing; otherwise the body is one JSON document, kept up to
    ``max_event_bytes``.  A line over ``max_line_bytes`` or an event over ``max_event_bytes``
    makes the response ``malformed`` (memory stays bounded; parsing goes on).  The response is
    judged on its bytes up to ``data: [DONE]``: what follows it is counted in ``bytes`` and
    E2E, and changes nothing else.  Call :meth:`feed` per read, then :meth:`finish` once.
    """

    __slots__ = (
        "t0", "status", "spec", "streaming", "_parser", "_body", "_max_event",
        "first_t", "last_t", "first_byte_t", "first_event_t", "visible", "done", "usage",
        "error", "malformed", "events", "nbytes", "response_id", "engine_time", "cached", "decode", "stall_s",
        "_reader", "_pool",
    )

    def __init__(
        self,
        t0: float,
        status: int | None,
        spec: RequestSpec,
        *,
        streaming: bool,
        max_line_bytes: int = DEFAULT_MAX_BYTES,
        max_event_bytes: int = DEFAULT_MAX_BYTES,
        stall_s: float = DEFAULT_STALL_S,
    ) -> None:
        self.t0 = t0
        self.status = status
        self.spec = spec
        self.streaming = streaming
        self._max_event = max_event_bytes
        self._parser = SSEParser(max_line_bytes, max_event_bytes) if streaming else None
        self._body: bytearray | None = None if streaming else bytearray()
        self.first_t: float | None = None
        self.last_t: float | None = None
        self.first_byte_t: float | None = None
        self.first_event_t: float | None = None
        self.visible = 0
        self.done = False
        self.usage: tuple[int, int] | None = None
        self.error: str | None = None
        self.malformed: str | None = None
        self.events = 0
        self.nbytes = 0
        self.response_id: str | None = None
        self.engine_time: EngineTiming | None = None  # the engine's own clock (vLLM's metrics object)
        self.cached: int | None = None  # prompt tokens from the engine's prefix cache, where it says
        self.decode = DecodeTrack()  # every gap, every channel (core.decode)
        self.stall_s = stall_s
        self._reader: Any = reader_for(spec.endpoint)  # Responses, Messages: their own documents
        #: embeddings, rerank: what is wrong with the answer (until one is read: that there is none)
        self._pool: tuple[str, str] | None = ("malformed", "no answer document") if spec.endpoint in POOLING else None

    def feed(self, chunk: bytes, now: float) -> None:
        """One read from the upstream, arrived at monotonic time ``now``."""
        if not chunk:
            return
        self.nbytes += len(chunk)
        if self.first_byte_t is None:
            self.first_byte_t = now
        if self.status != 200 or self.done:
            return
        parser = self._parser
        if parser is None:
            body = self._body
            if body is not None:
                if len(body) + len(chunk) > self._max_event:
                    self._body = None
                    self.malformed = self.malformed or f"response body over {self._max_event} bytes"
                else:
                    body += chunk
            return
        for name, data, problem in parser.feed(chunk):
            self._on_event(name, data, problem, now)
            if self.done:
                break

    def finish(
        self, now: float, transport_error: str | None = None, detail: str | None = None
    ) -> Result:
        """End of the response at ``now``; ``transport_error`` is one of TRANSPORT_REASONS."""
        if self.status == 200 and transport_error is None and not self.done:
            if self._parser is not None:
                for event in self._parser.close():
                    self._on_event(event.name, event.data, event.problem, now)
            elif self._body is not None:
                self._on_document(bytes(self._body), now)
        reason, why = self._verdict(transport_error)
        if reason is None:
            outcome = "success"
        elif reason == "client_abort":
            outcome = "client_abort"
        else:
            outcome = "failure"
        prompt, completion = self.usage if self.usage else (None, None)
        tpot = None
        if self.first_t is not None and completion is not None and completion > 1 and self.last_t is not None:
            tpot = (self.last_t - self.first_t) / (completion - 1)
        t0 = self.t0
        ttft = _since(self.first_t, t0)
        timing = self.engine_time
        decode, gaps = self.decode.summary(t0, completion, self.stall_s)
        return Result(
            outcome=outcome,
            reason=reason,
            detail=detail if transport_error else why,
            status=self.status,
            ttft_s=ttft,
            ttfb_s=_since(self.first_byte_t, t0),
            ttfe_s=_since(self.first_event_t, t0),
            tpot_s=tpot,
            e2e_s=now - t0,
            prompt_tokens=prompt,
            completion_tokens=completion,
            expected_tokens=self.spec.expected_tokens,
            visible_chars=self.visible,
            done=self.done,
            usage=self.usage is not None,
            events=self.events,
            bytes=self.nbytes,
            response_id=self.response_id,
            engine_queue_s=timing.queue_s if timing else None,
            engine_prefill_s=timing.prefill_s if timing else None,
            engine_decode_s=timing.decode_s if timing else None,
            ttft_outside_engine_s=outside_engine(ttft, timing),
            engine_timing=timing.source if timing else None,
            cached_tokens=self.cached if self.usage is not None else None,
            **decode,
            itl_gaps=gaps,
            pooling=self.spec.endpoint in POOLING,
        )

    # -- internals -------------------------------------------------------------------------

    def _verdict(self, transport_error: str | None) -> tuple[str | None, str | None]:
        if transport_error is not None:
            return transport_error, None
        if self.status != 200:
            return "http_status", f"HTTP {self.status}"
        if self.error is not None:
            return "sse_error", self.error
        if self.malformed is not None:
            return "malformed", self.malformed
        if self.spec.endpoint in POOLING:
            return self._pool or (None, None)
        if self.streaming and not self.done:
            end = "data: [DONE]" if self._reader is None else self._reader.end_name
            return "missing_done", f"stream ended without {end}"
        if self.visible == 0:
            return "empty_text", "no visible text in the response"
        if self.usage is None:
            return "missing_usage", "no usage object with integer prompt_tokens and completion_tokens"
        expected = self.spec.expected_tokens
        if expected is not None and self.usage[1] != expected:
            prompt, done = self.usage
            short = (f" (prompt {prompt} + completion {done} = {prompt + done} tokens: the model's context length, "
                     f"if it is {prompt + done})") if done < expected else ""
            return "length_mismatch", f"completion_tokens {done} != requested {expected}{short}"
        return None, None

    def _on_event(self, name: str | None, data: bytes, problem: str | None, now: float) -> None:
        if self.done:  # the response is judged up to [DONE]; later bytes change nothing
            return
        if problem is not None:
            if self.malformed is None:
                self.malformed = problem
            return
        self.events += 1
        if data == b"[DONE]":
            self.done = True
            return
        if name == "error" and self.error is None and self._reader is None:  # a reader reads its own
            self.error = data.decode("utf-8", "replace")[:200]
        self._on_document(data, now)

    def _on_document(self, data: bytes, now: float) -> None:
        try:
            obj = loads(data)
        except ValueError as exc:  # UnicodeDecodeError is a ValueError
            if self.malformed is None:
                self.malformed = f"unparseable event JSON: {exc}"[:200]
            return
        if self.spec.endpoint in POOLING:
            self._pooled(obj)
            return
        if not isinstance(obj, dict):
            if self.malformed is None:
                self.malformed = f"event JSON is a {type(obj).__name__}, not an object"
            return
        if self.response_id is None and isinstance(rid := obj.get("id"), str):
            self.response_id = rid[:200]
        if self._reader is not None:
            self._read_other(obj, now)
            return
        err = error_message(obj)
        if err is not None and self.error is None:
            self.error = err
        raw_usage = obj.get("usage")
        usage = usage_tokens(raw_usage)
        if usage is None and raw_usage is not None and has_float_tokens(raw_usage):  # maybe an integer over 64 bits
            usage = _exact_usage(data)
        if usage is not None:
            self.usage = usage
            self.cached = cached_tokens(raw_usage)
            if "metrics" in obj:  # vLLM --enable-per-request-metrics: on the usage chunk
                self.engine_time = from_vllm_metrics(obj["metrics"]) or self.engine_time
                self.decode.spec = spec_counts(obj) or self.decode.spec
        choices = obj.get("choices")
        if self.first_event_t is None and isinstance(choices, list) and choices:
            self.first_event_t = now
        n = visible_chars(choices)
        if n:
            if self.first_t is None:
                self.first_t = now
            self.last_t = now
            self.visible += n
            self.decode.text(now, choices, None if usage is None else usage[1])
        elif "sglext" in obj:  # SGLang's spec_tokens_details: a chunk of its own
            self.decode.spec = spec_counts(obj) or self.decode.spec
        if usage is not None:
            self.decode.usage(usage[1], raw_usage, obj)


    def _pooled(self, obj: Any) -> None:
        err = error_message(obj) if isinstance(obj, dict) else None
        if err is not None and self.error is None:
            self.error = err
        spec = self.spec
        self._pool = pooling_problem(spec.endpoint, obj, spec.inputs, spec.top_n)
        usage = usage_tokens(obj.get("usage")) if isinstance(obj, dict) else None
        if usage is not None:
            self.usage = usage

    def _read_other(self, obj: dict[str, Any], now: float) -> None:
        """A Responses or Messages document: the reader says what it holds."""
        got = self._reader.read(obj) if self.streaming else self._reader.whole(obj)
        if got.error is not None and self.error is None:
            self.error = got.error
        if got.usage is not None:
            self.usage = got.usage
        if got.chars:
            if self.first_t is None:
                self.first_t = now
            self.last_t = now
            self.visible += got.chars
            self.decode.channel_text(now, got.mask)
        if got.end and self.streaming:
            self.done = True


def analyze_bytes(
    chunks: list[tuple[float, bytes]],
    *,
    status: int | None = 200,
    spec: RequestSpec | None = None,
    streaming: bool = True,
    end: float | None = None,
    transport_error: str | None = None,
    max_line_bytes: int = DEFAULT_MAX_BYTES,
    max_event_bytes: int = DEFAULT_MAX_BYTES,
    stall_s: float = DEFAULT_STALL_S,
) -> Result:
    """Judge a whole recorded response: ``chunks`` are (offset from t0, bytes) pairs."""
    analyzer = StreamAnalyzer(0.0, status, spec or RequestSpec(), streaming=streaming,
                              max_line_bytes=max_line_bytes, max_event_bytes=max_event_bytes, stall_s=stall_s)
    last = 0.0
    for t, chunk in chunks:
        analyzer.feed(chunk, t)
        last = t
    return analyzer.finish(last if end is None else end, transport_error)
