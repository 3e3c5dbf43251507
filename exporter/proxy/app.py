"""The measuring reverse proxy: an aiohttp app factory and its handlers.

Only ``POST /<engine>/v1/completions``, ``POST /<engine>/v1/chat/completions``, ``POST
/<engine>/v1/responses``, ``POST /<engine>/v1/messages``, ``POST /<engine>/v1/embeddings``, ``POST
/<engine>/v1/rerank``, ``GET /<engine>/v1/models`` and ``GET /<engine>/health`` are forwarded, always
to the upstream fixed by the config (no open proxy); the last two unmeasured.  One request's work is
:mod:`exporter.proxy.exchange`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import hdrs, web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from yarl import URL

from .config import Config, Engine
from .drain import SCRAPER_HEADER, refuse, scraper_of, tracked
from .engines import EngineWatch
from .exchange import Exchange, json_error
from .exposition import metrics_response
from .gpu import GpuCollector, make_source, poll_forever
from .metrics import EngineCollector, ProxyInfoCollector
from .scenario_api import scenario_handler, scenarios_handler
from .state import CONFIG, METRICS_SESSION, STATE, ProxyState, Worker
from .wire.server import mark_responses
from .wire.upstream import Pool, origin_of, request_head

__all__ = ["create_app", "CONFIG", "STATE", "ProxyState", "Worker"]

log = logging.getLogger("llmbench.proxy")
ENGINE_WATCH = web.AppKey("engine_watch", EngineWatch)


class _OneLineBadRequests(logging.Filter):
    """aiohttp logs a request it refuses (a header with a control character, junk bytes)
    with a traceback: one line names the cause instead (the client still gets its 400)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, aiohttp.http_exceptions.HttpProcessingError):
            why = " ".join(line.strip() for line in str(exc.message).splitlines() if line.strip() != "^")
            record.msg, record.args = "refused a malformed request (HTTP %s): %s", (exc.code, why[:300])
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def quiet_bad_requests() -> None:
    for name in ("aiohttp.server", "aiohttp.web", "aiohttp.access"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _OneLineBadRequests) for f in logger.filters):
            logger.addFilter(_OneLineBadRequests())


#: what the proxy serves of each engine (measured: POST; passed through: GET)
MEASURED_PATHS = ("v1/completions", "v1/chat/completions", "v1/responses", "v1/messages", "v1/embeddings", "v1/rerank")
PASSED_PATHS = ("v1/models", "health")


def _engine_route(name: str, path: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The handler of one configured engine's route: a plain path, found by the router's index
    at once (the pattern route below it answers unknown engines)."""
    async def handler(request: web.Request) -> web.StreamResponse:
        return await _engine_request(request, name, path)
    return handler


async def _engine_handler(request: web.Request) -> web.StreamResponse:
    return await _engine_request(request, request.match_info["engine"], request.match_info["path"])


async def _engine_request(request: web.Request, name: str, path: str) -> web.StreamResponse:
    state = request.app[STATE]
    engine = state.config.engine(name)
    if engine is None:
        return json_error(404, "unknown engine", "not_found")
    if state.draining:  # SIGTERM: nothing new is sent upstream
        return refuse(state.metrics, engine.name)
    if request.method == "GET":
        return await _passthrough(state, request, engine, path)
    return await Exchange(state, request, engine, path).run()


async def _passthrough(state: ProxyState, request: web.Request, engine: Engine, path: str) -> web.Response:
    """GET /v1/models and GET /health: forwarded, not measured."""
    assert state.pool is not None, "proxy used before start-up"
    url = URL(f"{engine.base_url}/{path}")
    try:
        async with asyncio.timeout(state.config.timeouts.first_byte_s):
            up = await state.pool.request(origin_of(url), request_head("GET", url, request.raw_headers, 0), b"")
            try:
                data = await up.read()
            finally:
                up.release()
    except (OSError, TimeoutError) as exc:  # UpstreamConnectError and UpstreamClosed are OSErrors
        return json_error(502, f"{type(exc).__name__}: {exc}", "bad_gateway")
    ctype = up.headers.get("Content-Type", "application/json")
    return web.Response(status=up.status, body=data, headers={"Content-Type": ctype})


async def _metrics_handler(request: web.Request) -> web.Response:
    session = request.app.get(METRICS_SESSION)
    if session is None:  # in-process app (tests, embedding): rendered here, in a thread
        return await metrics_response(request, request.app[STATE].shown)
    # serve: the supervisor renders every worker's values, in its own process; the format and
    # the compression it chose pass through as they are
    asked: dict[str, str] = {k: v for k in (hdrs.ACCEPT, hdrs.ACCEPT_ENCODING)
                             if (v := ",".join(request.headers.getall(k, [])))}
    asked.setdefault(hdrs.ACCEPT_ENCODING, "identity")  # else aiohttp's client asks for gzip on its behalf
    asked[SCRAPER_HEADER] = scraper_of(request)  # the supervisor counts each scraper's scrapes (a drain's last)
    try:
        async with session.get("http://supervisor/metrics", headers=asked, params=request.rel_url.query) as resp:
            headers = {hdrs.CONTENT_TYPE: resp.headers.get(hdrs.CONTENT_TYPE, CONTENT_TYPE_LATEST)}
            if hdrs.CONTENT_ENCODING in resp.headers:
                headers[hdrs.CONTENT_ENCODING] = resp.headers[hdrs.CONTENT_ENCODING]
            return web.Response(status=resp.status, body=await resp.read(), headers=headers)
    except (aiohttp.ClientError, OSError) as exc:
        return web.Response(status=503, text=f"metrics renderer unavailable: {exc}\n")


async def _engines(request: web.Request) -> web.Response:
    """``GET /-/engines``: what the engine watch found (under ``serve``, the supervisor's)."""
    watch = request.app.get(ENGINE_WATCH)
    if watch is not None:
        return web.json_response(watch.snapshot())
    session = request.app.get(METRICS_SESSION)
    if session is None:
        return json_error(503, "no engine watch in this process", "unavailable")
    try:
        async with session.get("http://supervisor/-/engines") as resp:
            return web.Response(status=resp.status, body=await resp.read(), content_type="application/json")
    except (aiohttp.ClientError, OSError) as exc:
        return json_error(503, f"engine watch unavailable: {exc}", "unavailable")


async def _engine_watch(app: web.Application) -> AsyncIterator[None]:
    state, watch = app[STATE], app[ENGINE_WATCH]
    assert state.pool is not None, "the upstream pool starts first"
    watch.start(state.pool)
    try:
        yield
    finally:
        await watch.stop()


async def _healthy(request: web.Request) -> web.Response:
    return web.Response(text="llm-bench-exporter is healthy\n")


async def _ready(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.draining:
        return web.Response(status=503, text="draining\n")
    sock = state.worker.metrics_socket
    if state.pool is None or (sock is not None and not sock.exists()):  # serve: the renderer too
        return web.Response(status=503, text="starting\n")
    return web.Response(text="llm-bench-exporter is ready\n")


async def _upstream_session(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    state.pool = Pool(state.config.timeouts.connect_s)
    sock = state.worker.metrics_socket
    if sock is not None:
        app[METRICS_SESSION] = aiohttp.ClientSession(connector=aiohttp.UnixConnector(str(sock)),
                                                     auto_decompress=False)
    state.loop_lag.start(asyncio.get_running_loop())
    try:
        yield
    finally:
        state.loop_lag.stop()
        await state.drain()
        state.pool.close()
        if sock is not None:
            await app[METRICS_SESSION].close()
        state.pool = None
        state.close()


async def _on_shutdown(app: web.Application) -> None:
    await app[STATE].stop_exchanges()


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


def create_app(config: Config, registry: CollectorRegistry | None = None, worker: Worker | None = None) -> web.Application:
    """The proxy app; pass ``handler_cancellation=True`` to the runner to see client aborts early.

    ``worker`` (from ``serve``): this process's part in a supervised set of workers; the GPU
    collector then runs in the supervisor, not here."""
    quiet_bad_requests()
    app = web.Application(client_max_size=config.max_request_body_bytes)
    app[CONFIG] = config
    app[STATE] = state = ProxyState(config, registry if registry is not None else CollectorRegistry(), worker)
    if config.otlp is not None:  # the OpenTelemetry SDK is imported only when asked for
        from .otlp import OtlpObserver

        state.observers.append(OtlpObserver(config))
    app.cleanup_ctx.append(_upstream_session)
    if not state.worker.multiprocess:  # under serve, the supervisor watches the engines and the GPUs
        app[ENGINE_WATCH] = watch = EngineWatch(config, state.worker.run_id)
        state.registry.register(EngineCollector(watch.rows))
        state.registry.register(ProxyInfoCollector(watch.proxy))
        app.cleanup_ctx.append(_engine_watch)
        app.cleanup_ctx.append(_gpu_collector)
    app.on_shutdown.append(_on_shutdown)
    mark_responses(app)  # a connection's next read starts its next request (wire.server)
    app.router.add_get("/metrics", _metrics_handler if state.worker.multiprocess else tracked(_metrics_handler,
                                                                                             state.scrapes))
    app.router.add_get("/-/healthy", _healthy)
    app.router.add_get("/-/ready", _ready)
    app.router.add_post("/-/scenario", scenario_handler)
    app.router.add_get("/-/scenarios", scenarios_handler)
    app.router.add_get("/-/engines", _engines)
    for engine in config.engines:
        for path in MEASURED_PATHS:
            app.router.add_post(f"/{engine.name}/{path}", _engine_route(engine.name, path))
        for path in PASSED_PATHS:
            app.router.add_get(f"/{engine.name}/{path}", _engine_route(engine.name, path))
    app.router.add_post(r"/{engine}/{path:" + "|".join(MEASURED_PATHS) + "}", _engine_handler)
    app.router.add_get(r"/{engine}/{path:" + "|".join(PASSED_PATHS) + "}", _engine_handler)
    return app
