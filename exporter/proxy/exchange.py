"""One proxied, measured request: forward it, stream the answer through, judge it, record it.

Response bodies stream through read by read, byte for byte; the measuring core
(:mod:`exporter.core.analysis`) looks at each read after it has been passed on.
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
from exporter.core.timefmt import iso

from .config import Engine
from .records import Capture, write_capture
from .scenarios import MAX_ROUND
from .state import ProxyState
from .transport import transport_reason

__all__ = ["Exchange", "json_error", "forward_headers"]

log = logging.getLogger("llmbench.proxy")

# Headers that belong to one hop (RFC 9110 7.6.1) or that aiohttp recomputes.
_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length",
})
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def json_error(status: int, message: str, kind: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "code": status}, "object": "error"}
    return web.json_response(body, status=status)


def forward_headers(headers: Any) -> dict[str, str]:
    out = {k: v for k, v in headers.items() if k.lower() not in _HOP}
    out["Accept-Encoding"] = "identity"  # the core must read plain text
    return out


class _ClientGone(Exception):
    """Writing to the client failed: it went away."""


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
        self.t0 = 0.0

    async def run(self, body: bytes) -> web.StreamResponse:
        cfg = self.state.config
        request = self.request
        self.spec = spec = RequestSpec.from_body(body)
        header_round = request.headers.get("X-Bench-Round")
        scenario, rnd = self.state.scenarios.resolve(self.engine.name, request.headers.get("X-Bench-Scenario"))
        if header_round is not None and header_round.isdigit() and int(header_round) <= MAX_ROUND:
            rnd = int(header_round)
        client_id = request.headers.get("X-Request-Id")
        meta = {
            "id": self.id,
            "client_request_id": client_id if client_id and _SAFE_ID.match(client_id) else None,
            "engine": self.engine.name,
            "scenario": scenario,
            "round": rnd,
            "route": "/" + self.path,
            "stream": spec.stream,
        }
        if cfg.capture_raw_sse != "none":
            self.capture = Capture(cfg.max_capture_bytes)
        gauge = self.state.metrics.in_flight.labels(self.engine.name)
        gauge.inc()
        self.state.in_flight += 1
        wall = time.time()
        self.t0 = time.monotonic()
        error: str | None = None
        detail: str | None = None
        try:
            try:
                await self._stream(body, spec)
            except _ClientGone:
                error, detail = "client_abort", "client closed the connection"
            except asyncio.CancelledError:
                error, detail = "client_abort", "client closed the connection"
                self._finish(meta, wall, error, detail)
                raise
            except Exception as exc:
                error = transport_reason(exc)
                if error is None:  # a bug of ours must not lose the request's record
                    log.exception("request %s failed inside the proxy", self.id)
                    error, detail = "upstream_disconnect", f"internal error: {type(exc).__name__}: {exc}"
                elif error == "timeout":
                    detail = self._timeout_detail()
                else:
                    detail = f"{type(exc).__name__}: {exc}"
            result = self._finish(meta, wall, error, detail)
        finally:
            gauge.dec()
            self.state.in_flight -= 1
        return await self._close_client(result)

    def _timeout_detail(self) -> str:
        t = self.state.config.timeouts
        if self.analyzer is None or self.analyzer.nbytes == 0:
            return f"no response body within first_byte_s={t.first_byte_s}"
        return f"no data within idle_s={t.idle_s} or total_s={t.total_s}"

    async def _stream(self, body: bytes, spec: RequestSpec) -> None:
        cfg = self.state.config
        session = self.state.session
        assert session is not None, "proxy used before start-up"
        t = cfg.timeouts
        t0 = self.t0
        loop = asyncio.get_running_loop()
        end = loop.time() + t.total_s
        async with asyncio.timeout_at(min(loop.time() + t.first_byte_s, end)) as deadline:
            async with session.request(
                self.request.method, self.url, data=body,
                headers=forward_headers(self.request.headers), allow_redirects=False,
            ) as upstream:
                streaming = is_event_stream(upstream.headers.get("Content-Type"), spec.stream)
                self.analyzer = analyzer = StreamAnalyzer(
                    t0, upstream.status, spec, streaming=streaming,
                    max_line_bytes=cfg.max_line_bytes,
                )
                resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for k, v in upstream.headers.items():
                    if k.lower() not in _HOP:
                        resp.headers.add(k, v)
                if upstream.content_length is not None:
                    resp.content_length = upstream.content_length
                resp.headers["X-LLMBench-Request-Id"] = self.id
                self.response = resp
                await self._write(resp.prepare(self.request))
                capture = self.capture
                idle = t.idle_s
                armed = 0.0  # re-arm the idle deadline at most once a second: a timer per read is costly
                async for chunk in upstream.content.iter_any():
                    now = time.monotonic()
                    if now - armed >= 1.0:
                        armed = now
                        deadline.reschedule(min(loop.time() + idle, end))
                    await self._write(resp.write(chunk))
                    analyzer.feed(chunk, now)
                    if capture is not None:
                        capture.add(chunk, now - t0)

    @staticmethod
    async def _write(op: Any) -> None:
        try:
            await op
        except (ConnectionError, RuntimeError) as exc:
            raise _ClientGone() from exc

    def _finish(self, meta: dict[str, Any], wall: float, error: str | None, detail: str | None) -> Result:
        now = time.monotonic()
        analyzer = self.analyzer
        if analyzer is None:  # no response at all: judge an empty one
            analyzer = StreamAnalyzer(self.t0, None, self.spec, streaming=False)
        result = analyzer.finish(now, error, detail)
        state = self.state
        state.metrics.observe(meta["engine"], meta["scenario"], result)
        record: dict[str, Any] = {
            **meta,
            "start": iso(wall, ms=True),
            "start_unix": round(wall, 6),
            **result.as_dict(),
            "capture": None,
            "capture_sha256": None,
        }
        mode = state.config.capture_raw_sse
        cap = self.capture
        if cap is not None and (mode == "all" or not result.ok) and self.analyzer is not None:
            try:
                path, digest = write_capture(state.captures_dir, self.id, cap, {
                    "status": result.status,
                    "streaming": self.analyzer.streaming,
                    "expected_tokens": result.expected_tokens,
                    "transport_error": error,
                    "end_offset": round(now - self.t0, 6),
                    "verdict": {"outcome": result.outcome, "reason": result.reason},
                    "record": {k: meta[k] for k in ("engine", "scenario", "round", "route")},
                })
                record["capture"] = path
                record["capture_sha256"] = digest
            except OSError as exc:
                log.error("capture %s not written: %s", self.id, exc)
        try:
            state.requests_log.write(record)
        except (OSError, ValueError) as exc:
            log.error("record %s not written: %s", self.id, exc)
        for observer in state.observers:
            try:
                observer.observe(record)
            except Exception:  # an observer's bug must not cost the request
                log.exception("observer %s failed on %s", type(observer).__name__, self.id)
        return result

    async def _close_client(self, result: Result) -> web.StreamResponse:
        resp = self.response
        reason = result.reason
        if resp is None or not resp.prepared:
            if reason == "client_abort":
                return web.Response(status=499)
            if reason == "timeout":
                return json_error(504, result.detail or "upstream timed out", "upstream_timeout")
            return json_error(502, result.detail or "upstream unavailable", reason or "bad_gateway")
        if reason in ("upstream_disconnect", "timeout", "client_abort"):
            # End the client's stream the way the upstream's ended: cut, not completed.
            transport = self.request.transport
            if transport is not None:
                transport.abort()
            return resp
        try:
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        return resp
