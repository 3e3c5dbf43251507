"""One proxied, measured request: forward it, stream the answer through, judge it, record it.

Response bodies stream through read by read, byte for byte (:mod:`exporter.proxy.hop`); the
measuring core (:mod:`exporter.core.analysis`) looks at each read right after it was passed
on, in the same callback.  Every request that reaches a measured route gets exactly one
record, whatever happens: a header that cannot be parsed counts as absent, and a fault of
the proxy itself is recorded as ``proxy_error``, never blamed on the engine or the client.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from typing import Any

from aiohttp import web

from exporter.core.analysis import RequestSpec, Result, StreamAnalyzer
from exporter.core.content import is_event_stream
from exporter.core.usage import UsageEventFilter, inject_usage

from .clientsock import cap_unsent
from .config import Engine
from .finish import Measurement
from .hop import ClientGone, Splice
from .records import Capture
from .scenarios import MAX_ROUND
from .state import ProxyState
from .transport import transport_reason
from .upstream import HOP_BY_HOP, origin_of, request_head

__all__ = ["Exchange", "json_error"]

log = logging.getLogger("llmbench.proxy")

_SAFE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_ROUND = re.compile(r"[0-9]{1,7}")  # ASCII digits only: "²" passes str.isdigit() but not int()


def json_error(status: int, message: str, kind: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "code": status}, "object": "error"}
    return web.json_response(body, status=status)


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


class Exchange:
    """One proxied request: forwards it, measures it, records it exactly once."""

    def __init__(self, state: ProxyState, request: web.Request, engine: Engine, path: str) -> None:
        self.state = state
        self.request = request
        self.engine = engine
        self.url = state.urls[(engine.name, path)]
        self.path = path
        self.id = uuid.uuid4().hex
        self.response: web.StreamResponse | None = None
        self.analyzer: StreamAnalyzer | None = None
        self.capture: Capture | None = None
        self.spec = RequestSpec()
        self.usage_filter: Any = None  # strips the usage-only event the client did not ask for
        self.usage_injected = False
        self.end_t: float | None = None  # the stream's end, when not "now" at finish
        self.t0 = 0.0
        self.wall = 0.0
        self.done_t: float | None = None  # arrival of the read that completed data: [DONE]
        self.splice: Splice | None = None
        self.lag_mark = state.loop_lag.mark()

    async def run(self) -> web.StreamResponse:
        state = self.state
        meta = self._meta()
        state.metrics.arrivals.labels(self.engine.name, meta["scenario"]).inc()
        gauge = state.metrics.in_flight.labels(self.engine.name)
        gauge.inc()
        state.in_flight += 1
        self.wall, self.t0 = time.time(), time.monotonic()
        task = asyncio.current_task()
        if task is not None:
            state.exchanges.add(task)
        try:
            try:
                error, detail = await self._guarded(meta)
            except asyncio.CancelledError:
                error, detail = self._cancel_reason()
                self._finish(meta, error, detail)
                raise
        finally:
            gauge.dec()
            state.in_flight -= 1
            state.exchanges.discard(task)
        result, pending = self._finish(meta, error, detail)
        if pending is not None:  # shielded: a client that leaves now must not cost the record
            await asyncio.shield(pending)
        return await self._close_client(result)

    def _finish(self, meta: dict[str, Any], error: str | None, detail: str | None
                ) -> tuple[Result, asyncio.Task[None] | None]:
        """Hand the measurement over; with a capture to write, the record follows it (a task)."""
        m = self._measure(meta, error, detail)
        return m.result, self.state.finisher.finish(m)

    def _measure(self, meta: dict[str, Any], error: str | None, detail: str | None) -> Measurement:
        """The core's verdict on what came back, with this request's identity and timings."""
        now = time.monotonic()
        analyzer = self.analyzer
        if analyzer is None:  # no response at all: judge an empty one
            analyzer = StreamAnalyzer(self.t0, None, self.spec, streaming=False)
        result = analyzer.finish(self.end_t if self.end_t is not None else now, error, detail)
        kept = self.capture if self.analyzer is not None else None
        return Measurement(
            id=self.id, run_id=self.state.worker.run_id, labels=meta, result=result, start_unix=self.wall,
            usage_injected=self.usage_injected,
            timing_uncertainty_s=self.state.loop_lag.max_since(self.lag_mark),
            client_backpressure_s=self.splice.backpressure_s(now) if self.splice is not None else 0.0,
            capture=kept,
            capture_meta={} if kept is None else {
                "status": result.status,
                "streaming": analyzer.streaming,
                "expected_tokens": result.expected_tokens,
                "transport_error": error,
                "end_offset": round(now - self.t0, 6),
                "verdict": {"outcome": result.outcome, "reason": result.reason},
                "record": {k: meta[k] for k in ("engine", "scenario", "round", "route")},
            },
        )

    def _meta(self) -> dict[str, Any]:
        """The request's labels from its headers; anything unparseable counts as absent."""
        headers = self.request.headers
        try:
            scenario, rnd = self.state.scenarios.resolve(self.engine.name, headers.get("X-Bench-Scenario"))
        except Exception:  # a bug of ours must not cost the record: label it "none"
            log.exception("request %s: scenario not resolved", self.id)
            scenario, rnd = "none", None
        header_round = headers.get("X-Bench-Round", "").strip()
        if _ROUND.fullmatch(header_round) and int(header_round) <= MAX_ROUND:
            rnd = int(header_round)
        client_id = headers.get("X-Request-Id")
        return {
            "id": self.id,
            "client_request_id": client_id if client_id and _SAFE_ID.fullmatch(client_id) else None,
            "engine": self.engine.name,
            "scenario": scenario,
            "round": rnd,
            "route": "/" + self.path,
            "stream": self.spec.stream,
            "model": None,
        }

    async def _guarded(self, meta: dict[str, Any]) -> tuple[str | None, str | None]:
        """Read the request, forward it, stream the answer; return (transport reason, detail)."""
        try:
            body = await self.request.read()
            self._inspect(body, meta)
            # t0 = request read, about to be sent; start_unix + ttft_s is then
            # the wall-clock time of the first text (the timing error's ground truth, docs/timing.md)
            self.wall, self.t0 = time.time(), time.monotonic()
            await self._stream(self._inject(body))
        except ClientGone:
            return self._hangup_reason()
        except web.HTTPRequestEntityTooLarge as exc:
            limit = self.state.config.max_request_body_bytes
            self.response = exc  # answered 413 by _close_client
            return "proxy_error", f"request body over max_request_body_bytes={limit}: refused with 413"
        except Exception as exc:
            error = transport_reason(exc)
            if error is None:  # a bug of ours must not lose the record, nor be the engine's fault
                log.exception("request %s failed inside the proxy", self.id)
                return "proxy_error", f"internal error: {type(exc).__name__}: {exc}"[:300]
            if error == "timeout":
                return error, self._timeout_detail()
            return error, f"{type(exc).__name__}: {exc}"[:300]
        return None, None

    def _inspect(self, body: bytes, meta: dict[str, Any]) -> None:
        self.spec = spec = RequestSpec.from_body(body)
        meta["stream"] = spec.stream
        meta["model"] = getattr(spec, "model", None)
        if self.state.config.capture_raw_sse != "none":
            self.capture = Capture(self.state.config.max_capture_bytes)

    def _inject(self, body: bytes) -> bytes:
        """``usage: inject``: ask for usage upstream for a client that did not."""
        if self.engine.usage != "inject" or not self.spec.stream:
            return body
        changed = inject_usage(body, self.spec)
        if changed is None:
            return body
        self.usage_filter = UsageEventFilter(self.state.config.max_event_bytes)
        self.usage_injected = True
        return bytes(changed)

    def _hangup_reason(self) -> tuple[str | None, str | None]:
        """A client that hangs up after it was sent [DONE] has the whole
        response: the request is judged on the stream."""
        if self.analyzer is not None and self.analyzer.done:
            self.end_t = self.done_t
            return None, None
        return "client_abort", "client closed the connection"

    def _cancel_reason(self) -> tuple[str | None, str | None]:
        if self.state.stopping and not _client_gone(self.request):
            return "proxy_error", "the proxy shut down while the request was in flight"
        return self._hangup_reason()

    def _timeout_detail(self) -> str:
        t = self.state.config.timeouts
        if self.analyzer is None or self.analyzer.nbytes == 0:
            return f"no response body within first_byte_s={t.first_byte_s}"
        return f"no data within idle_s={t.idle_s} or total_s={t.total_s}"

    def _on_read(self, data: bytes, now: float) -> None:
        analyzer = self.analyzer
        assert analyzer is not None
        done = analyzer.done
        analyzer.feed(data, now)
        if analyzer.done and not done:
            self.done_t = now
        if self.capture is not None:
            self.capture.add(data, now - self.t0)

    async def _stream(self, body: bytes) -> None:
        cfg = self.state.config
        pool = self.state.pool
        assert pool is not None, "proxy used before start-up"
        t = cfg.timeouts
        loop = asyncio.get_running_loop()
        end = loop.time() + t.total_s
        first_byte_at = time.monotonic() + t.first_byte_s
        request = self.request
        head = request_head(request.method, self.url, request.raw_headers, len(body))
        async with asyncio.timeout_at(min(loop.time() + t.first_byte_s, end)) as deadline:
            upstream = await pool.request(origin_of(self.url), head, body)
            try:
                deadline.reschedule(end)  # from here the splice watches first byte and idle
                streaming = is_event_stream(upstream.headers.get("Content-Type"), self.spec.stream)
                self.analyzer = self._analyzer(upstream.status, streaming)
                writer = await self._prepare(upstream)
                transport = request.transport
                if transport is None:
                    raise ClientGone()
                if streaming:
                    cap_unsent(transport)  # a slow client's bytes wait where the splice sees them
                filt = self.usage_filter if upstream.status == 200 and streaming else None
                self.usage_filter = filt
                self.splice = splice = Splice(transport, writer.chunked, self._on_read,
                                              filt.feed if filt is not None else None)
                await splice.run(upstream, writer, first_byte_at, t.idle_s)
            finally:
                upstream.release()

    def _analyzer(self, status: int, streaming: bool) -> StreamAnalyzer:
        cfg = self.state.config
        return StreamAnalyzer(self.t0, status, self.spec, streaming=streaming,
                              max_line_bytes=cfg.max_line_bytes, max_event_bytes=cfg.max_event_bytes)

    async def _prepare(self, upstream: Any) -> Any:
        """Send the client the upstream's status and headers; return the response's writer."""
        resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for k, v in upstream.headers.items():
            if k.lower() not in HOP_BY_HOP:
                resp.headers.add(k, v)
        # Always chunked (HTTP/1.1 clients): the client sees the end of the body only after
        # the request's record is written (a Content-Length body would end with its last byte).
        resp.headers["X-LLMBench-Request-Id"] = self.id
        self.response = resp
        try:
            writer = await resp.prepare(self.request)  # headers buffered: the splice sends them
            assert writer is not None
        except ConnectionError as exc:
            raise ClientGone() from exc
        return writer

    async def _close_client(self, result: Result) -> web.StreamResponse:
        resp = self.response
        reason = result.reason
        if isinstance(resp, web.HTTPException):  # refused before forwarding (413)
            return web.Response(status=resp.status, text=resp.text, content_type="text/plain")
        if resp is None or not resp.prepared:
            if reason == "client_abort":
                return web.Response(status=499)
            if reason == "timeout":
                return json_error(504, result.detail or "upstream timed out", "upstream_timeout")
            return json_error(502, result.detail or "upstream unavailable", reason or "bad_gateway")
        if reason in ("upstream_disconnect", "timeout", "client_abort", "proxy_error"):
            # End the client's stream the way the upstream's ended: cut, not completed.
            transport = self.request.transport
            if transport is not None:
                transport.abort()
            return resp
        try:
            rest = self.usage_filter.flush() if self.usage_filter is not None else b""
            await resp.write_eof(rest)
        except ConnectionError:
            pass
        return resp

