"""The measuring reverse proxy: an aiohttp app factory and its handlers.

Only ``POST /<engine>/v1/completions``, ``POST /<engine>/v1/chat/completions`` and
``GET /<engine>/v1/models`` are forwarded, always to the upstream fixed by the config (no
open proxy).  One request's work is :mod:`exporter.proxy.exchange`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .config import Config, Engine
from .exchange import Exchange, forward_headers, json_error
from .gpu import GpuCollector, make_source, poll_forever
from .scenario_api import scenario_handler
from .state import CONFIG, STATE, ProxyState

__all__ = ["create_app", "CONFIG", "STATE", "ProxyState"]

log = logging.getLogger("llmbench.proxy")




async def _engine_handler(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    engine = state.config.engine(request.match_info["engine"])
    if engine is None:
        return json_error(404, "unknown engine", "not_found")
    path = request.match_info["path"]
    body = await request.read()
    if path == "v1/models":
        return await _passthrough(state, request, engine, path)
    return await Exchange(state, request, engine, path).run(body)


async def _passthrough(state: ProxyState, request: web.Request, engine: Engine, path: str) -> web.Response:
    """GET /v1/models: forwarded, not measured."""
    assert state.session is not None
    url = f"{engine.base_url}/{path}"
    try:
        async with asyncio.timeout(state.config.timeouts.first_byte_s):
            async with state.session.get(url, headers=forward_headers(request.headers)) as up:
                data = await up.read()
                ctype = up.headers.get("Content-Type", "application/json")
                return web.Response(status=up.status, body=data, headers={"Content-Type": ctype})
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        return json_error(502, f"{type(exc).__name__}: {exc}", "bad_gateway")


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
    app[STATE] = state = ProxyState(config, registry if registry is not None else CollectorRegistry())
    if config.otlp is not None:  # the OpenTelemetry SDK is imported only when asked for
        from .otlp import OtlpObserver

        state.observers.append(OtlpObserver(config))
    app.cleanup_ctx.append(_upstream_session)
    app.cleanup_ctx.append(_gpu_collector)
    app.router.add_get("/metrics", _metrics_handler)
    app.router.add_get("/-/healthy", _healthy)
    app.router.add_get("/-/ready", _ready)
    app.router.add_post("/-/scenario", scenario_handler)
    app.router.add_post(r"/{engine}/{path:v1/completions|v1/chat/completions}", _engine_handler)
    app.router.add_get(r"/{engine}/{path:v1/models}", _engine_handler)
    return app

