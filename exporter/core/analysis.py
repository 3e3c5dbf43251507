"""The measuring core: visible text, timing and the verdict of one request.

Pure code, no sockets and no clock of its own: callers pass arrival times (monotonic
seconds).  The proxy, the load driver and ``evidence decode`` all use this module, so the
project has exactly one definition of TTFT, TPOT, E2E and success (SPEC sections 3 and 4).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from types import ModuleType
from typing import Any

from exporter.core.sse import SSEParser

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

_orjson: ModuleType | None
try:  # the ``fast`` extra: about 5x quicker per event than the standard library
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the install
    _orjson = None


def loads(data: bytes) -> Any:
    """Parse one event's JSON.  orjson when installed; what it refuses (NaN, Infinity,
    integers over 64 bits) goes to the standard library, so the verdict never depends on
    which parser is installed.  Raises ValueError (or UnicodeDecodeError) when invalid."""
    if _orjson is not None:
        try:
            return _orjson.loads(data)
        except _orjson.JSONDecodeError:
            pass
    return json.loads(data.decode("utf-8"))


#: Failure reasons in order of precedence (SPEC section 4): the first that applies wins.
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


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What the client asked for, as far as the verdict needs it."""

    stream: bool = True
    expected_tokens: int | None = None  # set only when ignore_eos fixes the length

    @classmethod
    def from_body(cls, body: bytes) -> RequestSpec:
        """Read ``stream``, ``ignore_eos`` and the max-token fields; tolerate any garbage."""
        try:
            req = json.loads(body) if body else None
        except (ValueError, UnicodeDecodeError):
            return cls()
        if not isinstance(req, dict):
            return cls()
        stream = req.get("stream") is True
        expected = None
        if req.get("ignore_eos") is True:
            for key in ("max_completion_tokens", "max_tokens"):
                n = req.get(key)
                if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                    expected = n
                    break
        return cls(stream=stream, expected_tokens=expected)


def _text_len(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):  # content parts: [{"type": "text", "text": "..."}]
        return sum(_text_len(p.get("text")) for p in value if isinstance(p, dict))
    return 0


def _message_chars(msg: dict[str, Any]) -> int:
    n = _text_len(msg.get("content"))
    reasoning = msg.get("reasoning")
    reasoning_content = msg.get("reasoning_content")
    n += _text_len(reasoning)
    if reasoning_content != reasoning:  # some servers send both spellings, same text
        n += _text_len(reasoning_content)
    calls = msg.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                n += _text_len(fn.get("name")) + _text_len(fn.get("arguments"))
    return n


def visible_chars(choices: Any) -> int:
    """Characters of visible text in a ``choices`` list (stream chunk or full response).

    Completions ``text``; chat ``delta``/``message`` ``content``, ``reasoning`` /
    ``reasoning_content`` and tool-call name and argument fragments.  Role-only chunks,
    empty strings and ``choices: []`` give 0.
    """
    if not isinstance(choices, list):
        return 0
    n = 0
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        n += _text_len(choice.get("text"))
        for key in ("delta", "message"):
            msg = choice.get(key)
            if isinstance(msg, dict):
                n += _message_chars(msg)
    return n


def _usage(obj: Any) -> tuple[int, int] | None:
    if not isinstance(obj, dict):
        return None
    p, c = obj.get("prompt_tokens"), obj.get("completion_tokens")
    if type(p) is int and type(c) is int:
        return p, c
    return None


def _error_message(obj: dict[str, Any]) -> str | None:
    err = obj.get("error")
    if err:
        if isinstance(err, dict):
            return str(err.get("message") or err.get("type") or "error")
        return str(err)
    if obj.get("object") == "error":
        return str(obj.get("message") or "error")
    return None


@dataclass(slots=True)
class Result:
    """Everything measured about one request; ``outcome`` is success, failure or client_abort."""

    outcome: str
    reason: str | None
    detail: str | None
    status: int | None
    ttft_s: float | None
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

    @property
    def ok(self) -> bool:
        return self.outcome == "success"

    @property
    def empty_text_200(self) -> bool:
        """HTTP 200, stream ended by the server, and not one visible character."""
        return (
            self.status == 200
            and self.visible_chars == 0
            and self.reason not in TRANSPORT_REASONS
        )

    def as_dict(self) -> dict[str, Any]:
        # every field is a scalar: a shallow copy, not dataclasses.asdict's deep one
        return {name: getattr(self, name) for name in _RESULT_FIELDS}


_RESULT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Result))


class StreamAnalyzer:
    """Measure and judge one response from its bytes and their arrival times.

    ``streaming`` selects SSE parsing; otherwise the body is one JSON document (kept up to
    ``max_line_bytes``).  Call :meth:`feed` per read, then :meth:`finish` once.
    """

    __slots__ = (
        "t0", "status", "spec", "streaming", "_parser", "_body", "_max",
        "first_t", "last_t", "visible", "done", "usage", "error", "malformed",
        "events", "nbytes", "response_id",
    )

    def __init__(
        self,
        t0: float,
        status: int | None,
        spec: RequestSpec,
        *,
        streaming: bool,
        max_line_bytes: int = 16 << 20,
    ) -> None:
        self.t0 = t0
        self.status = status
        self.spec = spec
        self.streaming = streaming
        self._max = max_line_bytes
        self._parser = SSEParser(max_line_bytes) if streaming else None
        self._body: bytearray | None = None if streaming else bytearray()
        self.first_t: float | None = None
        self.last_t: float | None = None
        self.visible = 0
        self.done = False
        self.usage: tuple[int, int] | None = None
        self.error: str | None = None
        self.malformed: str | None = None
        self.events = 0
        self.nbytes = 0
        self.response_id: str | None = None

    def feed(self, chunk: bytes, now: float) -> None:
        """One read from the upstream, arrived at monotonic time ``now``."""
        self.nbytes += len(chunk)
        if self.status != 200:
            return
        parser = self._parser
        if parser is None:
            body = self._body
            if body is not None:
                if len(body) + len(chunk) > self._max:
                    self._body = None
                    self.malformed = self.malformed or f"response body over {self._max} bytes"
                else:
                    body += chunk
            return
        for event in parser.feed(chunk):
            self._on_event(event.name, event.data, now)
        if parser.overflow and not self.malformed:
            self.malformed = f"SSE line over {self._max} bytes"

    def finish(
        self, now: float, transport_error: str | None = None, detail: str | None = None
    ) -> Result:
        """End of the response at ``now``; ``transport_error`` is one of TRANSPORT_REASONS."""
        if self.status == 200 and transport_error is None:
            if self._parser is not None:
                for event in self._parser.close():
                    self._on_event(event.name, event.data, now)
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
        ttft = tpot = None
        if self.first_t is not None:
            ttft = self.first_t - self.t0
            if completion is not None and completion > 1 and self.last_t is not None:
                tpot = (self.last_t - self.first_t) / (completion - 1)
        return Result(
            outcome=outcome,
            reason=reason,
            detail=detail if transport_error else why,
            status=self.status,
            ttft_s=ttft,
            tpot_s=tpot,
            e2e_s=now - self.t0,
            prompt_tokens=prompt,
            completion_tokens=completion,
            expected_tokens=self.spec.expected_tokens,
            visible_chars=self.visible,
            done=self.done,
            usage=self.usage is not None,
            events=self.events,
            bytes=self.nbytes,
            response_id=self.response_id,
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
        if self.streaming and not self.done:
            return "missing_done", "stream ended without data: [DONE]"
        if self.visible == 0:
            return "empty_text", "no visible text in the response"
        if self.usage is None:
            return "missing_usage", "no usage object with integer prompt_tokens and completion_tokens"
        expected = self.spec.expected_tokens
        if expected is not None and self.usage[1] != expected:
            return "length_mismatch", f"completion_tokens {self.usage[1]} != requested {expected}"
        return None, None

    def _on_event(self, name: str | None, data: bytes, now: float) -> None:
        self.events += 1
        if self.done:
            return
        if data == b"[DONE]":
            self.done = True
            return
        if name == "error" and self.error is None:
            self.error = data.decode("utf-8", "replace")[:200]
        self._on_document(data, now)

    def _on_document(self, data: bytes, now: float) -> None:
        try:
            obj = loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            if self.malformed is None:
                self.malformed = f"unparseable event JSON: {exc}"[:200]
            return
        if not isinstance(obj, dict):
            if self.malformed is None:
                self.malformed = f"event JSON is a {type(obj).__name__}, not an object"
            return
        if self.response_id is None and isinstance(obj.get("id"), str):
            self.response_id = obj["id"]
        err = _error_message(obj)
        if err is not None and self.error is None:
            self.error = err[:200]
        usage = _usage(obj.get("usage"))
        if usage is not None:
            self.usage = usage
        n = visible_chars(obj.get("choices"))
        if n:
            if self.first_t is None:
                self.first_t = now
            self.last_t = now
            self.visible += n


def analyze_bytes(
    chunks: list[tuple[float, bytes]],
    *,
    status: int | None = 200,
    spec: RequestSpec | None = None,
    streaming: bool = True,
    end: float | None = None,
    transport_error: str | None = None,
    max_line_bytes: int = 16 << 20,
) -> Result:
    """Judge a whole recorded response: ``chunks`` are (offset from t0, bytes) pairs."""
    analyzer = StreamAnalyzer(0.0, status, spec or RequestSpec(), streaming=streaming,
                              max_line_bytes=max_line_bytes)
    last = 0.0
    for t, chunk in chunks:
        analyzer.feed(chunk, t)
        last = t
    return analyzer.finish(last if end is None else end, transport_error)
