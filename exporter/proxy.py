"""The measuring reverse proxy: an aiohttp app factory and its handlers.

Only ``POST /<engine>/v1/completions``, ``POST /<engine>/v1/chat/completions`` and
``GET /<engine>/v1/models`` are forwarded, always to the upstream fixed by the config (no
open proxy).  Response bodies stream through read by read, byte for byte; the measuring
core (:mod:`exporter.analysis`) looks at each read after it has been passed on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from yarl import URL

from .analysis import RequestSpec, Result, StreamAnalyzer
from .config import Config, Engine
from .gpu import GpuCollector, make_source, poll_forever
from .metrics import ProxyMetrics
from .records import Capture, JsonlWriter, iso_ms, write_capture
from .scenarios import MAX_ROUND, ScenarioBoard
from .transport import transport_reason

__all__ = ["create_app", "CONFIG", "STATE", "ProxyState"]

log = logging.getLogger("llmbench.proxy")

# Headers that belong to one hop (RFC 9110 7.6.1) or that aiohttp recomputes.
_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length",
})
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
MEASURED = {"completions": "v1/completions", "chat": "v1/chat/completions"}


class ProxyState:
    """Everything the handlers share; built at start-up, closed at shutdown."""

    def __init__(self, config: Config, registry: CollectorRegistry) -> None:
        self.config = config
        self.registry = registry
        self.metrics = ProxyMetrics(registry)
        records = config.records_dir
        records.mkdir(parents=True, exist_ok=True)
        self.requests_log = JsonlWriter(records / "requests.jsonl")
        self.scenario_log = JsonlWriter(records / "scenarios.jsonl")
        self.captures_dir = records / "captures"
        self.scenarios = ScenarioBoard(
            config.scenarios, [e.name for e in config.engines], self.metrics, self.scenario_log
        )
        self.session: aiohttp.ClientSession | None = None
        # upstream URLs parsed once, not per request
        self.urls = {(e.name, p): URL(f"{e.base_url}/{p}") for e in config.engines for p in MEASURED.values()}
        self.in_flight = 0  # all engines together; the simulated GPUs follow it
        for e in config.engines:
            self.metrics.initialise(e.name, [*config.scenarios, "none", "other"],
                                    timed=frozenset([*config.scenarios, "none"]))

    def close(self) -> None:
        self.requests_log.close()
        self.scenario_log.close()


CONFIG = web.AppKey("config", Config)
STATE = web.AppKey("state", ProxyState)


def _json_error(status: int, message: str, kind: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "code": status}, "object": "error"}
    return web.json_response(body, status=status)


def _forward_headers(headers: Any) -> dict[str, str]:
    out = {k: v for k, v in headers.items() if k.lower() not in _HOP}
    out["Accept-Encoding"] = "identity"  # the core must read plain text
    return out


class _ClientGone(Exception):
    """Writing to the client failed: it went away."""


class _Exchange:
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
                headers=_forward_headers(self.request.headers), allow_redirects=False,
            ) as upstream:
                ctype = upstream.headers.get("Content-Type", "")
                streaming = "text/event-stream" in ctype or (not ctype and spec.stream)
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
            "start": iso_ms(wall),
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
        return result

    async def _close_client(self, result: Result) -> web.StreamResponse:
        resp = self.response
        reason = result.reason
        if resp is None or not resp.prepared:
            if reason == "client_abort":
                return web.Response(status=499)
            if reason == "timeout":
                return _json_error(504, result.detail or "upstream timed out", "upstream_timeout")
            return _json_error(502, result.detail or "upstream unavailable", reason or "bad_gateway")
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


async def _engine_handler(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    engine = state.config.engine(request.match_info["engine"])
    if engine is None:
        return _json_error(404, "unknown engine", "not_found")
    path = request.match_info["path"]
    body = await request.read()
    if path == "v1/models":
        return await _passthrough(state, request, engine, path)
    return await _Exchange(state, request, engine, path).run(body)


async def _passthrough(state: ProxyState, request: web.Request, engine: Engine, path: str) -> web.Response:
    """GET /v1/models: forwarded, not measured."""
    assert state.session is not None
    url = f"{engine.base_url}/{path}"
    try:
        async with asyncio.timeout(state.config.timeouts.first_byte_s):
            async with state.session.get(url, headers=_forward_headers(request.headers)) as up:
                data = await up.read()
                ctype = up.headers.get("Content-Type", "application/json")
                return web.Response(status=up.status, body=data, headers={"Content-Type": ctype})
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        return _json_error(502, f"{type(exc).__name__}: {exc}", "bad_gateway")


async def _scenario_handler(request: web.Request) -> web.Response:
    state = request.app[STATE]
    try:
        doc = await request.json()
    except (ValueError, UnicodeDecodeError):
        return _json_error(400, "body must be JSON: {\"scenario\": NAME, \"round\": N}", "invalid_request")
    if not isinstance(doc, dict):
        return _json_error(400, "body must be a JSON object", "invalid_request")
    name, rnd, engine = doc.get("scenario"), doc.get("round", 0), doc.get("engine")
    if name is not None and (not isinstance(name, str) or not name):
        return _json_error(400, "scenario must be a non-empty string or null", "invalid_request")
    if type(rnd) is not int or not 0 <= rnd <= MAX_ROUND:
        return _json_error(400, f"round must be an integer 0..{MAX_ROUND}", "invalid_request")
    if engine is not None and state.config.engine(str(engine)) is None:
        return _json_error(400, "unknown engine", "invalid_request")
    engines = state.scenarios.set(name, rnd, engine)
    label = None if name is None else state.scenarios.label(name)
    return web.json_response({"scenario": label, "round": rnd, "engines": engines})


async def _metrics_handler(request: web.Request) -> web.Response:
    # Rendering thousands of series takes tens of milliseconds: never on the event loop
    # that is timing streams.
    data = await asyncio.to_thread(generate_latest, request.app[STATE].registry)
    return web.Response(body=data, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _healthy(request: web.Request) -> web.Response:
    return web.Response(text="llm-bench-exporter is healthy\n")


async def _ready(request: web.Request) -> web.Response:
    if request.app[STATE].session is None:
        return web.Response(status=503, text="starting\n")
    return web.Response(text="llm-bench-exporter is ready\n")


async def _upstream_session(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    t = state.config.timeouts
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    timeout = aiohttp.ClientTimeout(total=None, connect=t.connect_s, sock_connect=t.connect_s)
    state.session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)
    try:
        yield
    finally:
        await state.session.close()
        state.session = None
        state.close()


async def _gpu_collector(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    source = make_source(state.config.gpu, lambda: state.in_flight)
    if source is None:
        yield
        return
    collector = GpuCollector(state.registry)
    task = asyncio.create_task(poll_forever(source, collector, state.config.gpu_interval_s))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        source.close()


def create_app(config: Config, registry: CollectorRegistry | None = None) -> web.Application:
    """The proxy app; pass ``handler_cancellation=True`` to the runner to see client aborts early."""
    app = web.Application(client_max_size=config.max_request_body_bytes)
    app[CONFIG] = config
    app[STATE] = ProxyState(config, registry if registry is not None else CollectorRegistry())
    app.cleanup_ctx.append(_upstream_session)
    app.cleanup_ctx.append(_gpu_collector)
    app.router.add_get("/metrics", _metrics_handler)
    app.router.add_get("/-/healthy", _healthy)
    app.router.add_get("/-/ready", _ready)
    app.router.add_post("/-/scenario", _scenario_handler)
    app.router.add_post(r"/{engine}/{path:v1/completions|v1/chat/completions}", _engine_handler)
    app.router.add_get(r"/{engine}/{path:v1/models}", _engine_handler)
    return app

