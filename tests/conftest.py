from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from exporter.config import validate
from exporter.proxy import create_app

from .transcripts import sse

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

OK_EVENTS = [
    '{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"Hel","logprobs":null,"finish_reason":null,"stop_reason":null}]}',
    '{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"lo","logprobs":null,"finish_reason":"length","stop_reason":null}]}',
    '{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":4,"total_tokens":6,"completion_tokens":2}}',
    "[DONE]",
]
OK_BODY = sse(*OK_EVENTS)


async def stream_events(request: web.Request, events: list[bytes], delay: float = 0.0,
                        headers: dict[str, str] | None = None) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **(headers or {})})
    await resp.prepare(request)
    for ev in events:
        if delay:
            await asyncio.sleep(delay)
        await resp.write(ev)
    await resp.write_eof()
    return resp


class Upstream:
    """An in-process aiohttp upstream whose behaviour each test sets."""

    def __init__(self) -> None:
        self.handler: Handler = self.ok
        self.seen: list[dict[str, Any]] = []

    async def ok(self, request: web.Request) -> web.StreamResponse:
        return await stream_events(request, [e.encode() + b"\n\n" for e in (f"data: {x}" for x in OK_EVENTS)])

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append({"path": request.path, "headers": dict(request.headers), "body": body})
        return await self.handler(request)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self.dispatch)
        return app


@pytest.fixture
async def upstream(aiohttp_server: Any) -> tuple[Upstream, TestServer]:
    up = Upstream()
    server = await aiohttp_server(up.app())
    return up, server


def make_config(tmp_path: Path, port: int, **extra: Any):
    data = {
        "engines": [{"name": "vllm", "upstream": f"http://127.0.0.1:{port}"},
                    {"name": "sglang", "upstream": f"http://127.0.0.1:{port}"}],
        "scenarios": ["short-c1", "short-c32"],
        "records_dir": str(tmp_path / "run"),
        **extra,
    }
    return validate(data)


@pytest.fixture
def proxy_factory(aiohttp_client: Any, tmp_path: Path) -> Callable[..., Awaitable[TestClient]]:
    async def make(port: int, **extra: Any) -> TestClient:
        app = create_app(make_config(tmp_path, port, **extra))
        return await aiohttp_client(app, server_kwargs={"handler_cancellation": True})
    return make


def read_records(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "run" / "requests.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


async def wait_for_records(tmp_path: Path, n: int, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """The records once there are ``n`` (an aborted request is recorded after the client left)."""
    for _ in range(int(timeout_s / 0.02)):
        records = read_records(tmp_path)
        if len(records) >= n:
            return records
        await asyncio.sleep(0.02)
    return read_records(tmp_path)


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples that match ``labels`` in Prometheus text format (0 when none)."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


@pytest.fixture(scope="session")
def live_stack(tmp_path_factory: pytest.TempPathFactory):
    """Simulated engines, the real proxy (4 simulated GPUs) and a real Prometheus with the
    repo's prometheus.yml and rules, fed by the load driver through both engines in turn."""
    from .prom import require_prometheus
    from .stack_run import run_live_stack

    require_prometheus()
    with run_live_stack(tmp_path_factory.mktemp("live")) as stack:
        yield stack
