"""SGLang's metric prefix (issue 20 item 5): servers are seen with ``sglang:NAME`` and with
``sglang_NAME``; every SGLang query of the engine-internals board finds either spelling.

A real Prometheus scrapes two tiny SGLang look-alikes (aiohttp apps in this test), one per
spelling, under the board's ``sglang`` job; each board query, for each server on its own (the
board's engine-instance variable), must return data.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from dashboards.catalogue import MIXIN, PANELS, expand
from exporter.evidence.promapi import Prometheus
from exporter.harness.stack import render_prometheus_config, wait_for_scrapes

from tests.helpers import require_prometheus, scrapes_since, start_prometheus_on_port_0

SPELLINGS = ("sglang:", "sglang_")
_BUCKETS = (0.1, 0.5, 1.0)


def _exposition(prefix: str, n: int) -> str:
    """An SGLang /metrics page at its ``n``-th scrape: counters and a histogram that grow."""
    labels = '{model_name="m"}'
    lines = [f"{prefix}num_running_reqs{labels} 3", f"{prefix}num_queue_reqs{labels} 1",
             f"{prefix}token_usage{labels} 0.25", f"{prefix}generation_tokens_total{labels} {100 * n}",
             f"{prefix}prompt_tokens_total{labels} {400 * n}"]
    ttft = f"{prefix}time_to_first_token_seconds"
    lines += [f'{ttft}_bucket{{model_name="m",le="{le}"}} {n * (i + 1)}' for i, le in enumerate(_BUCKETS)]
    lines += [f'{ttft}_bucket{{model_name="m",le="+Inf"}} {n * 3}', f"{ttft}_sum{labels} {0.4 * n}",
              f"{ttft}_count{labels} {n * 3}"]
    return "\n".join(lines) + "\n"


class Servers:
    """One aiohttp app per spelling, on a loop in a thread."""

    def __init__(self) -> None:
        self.ports: dict[str, int] = {}  # bound to port 0 in _serve, read back
        self.loop = asyncio.new_event_loop()
        self.runners: list[web.AppRunner] = []
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _serve(self, prefix: str) -> None:
        scrapes = {"n": 0}

        async def metrics(_: web.Request) -> web.Response:
            scrapes["n"] += 1
            return web.Response(text=_exposition(prefix, scrapes["n"]), content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        self.ports[prefix] = runner.addresses[0][1]
        self.runners.append(runner)

    def start(self) -> None:
        self.thread.start()
        for prefix in SPELLINGS:
            asyncio.run_coroutine_threadsafe(self._serve(prefix), self.loop).result(10)

    def stop(self) -> None:
        for runner in self.runners:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def prom(tmp_path: Path) -> Iterator[tuple[Prometheus, dict[str, str]]]:
    require_prometheus()
    servers = Servers()
    servers.start()
    instances = {p: f"127.0.0.1:{port}" for p, port in servers.ports.items()}
    config = render_prometheus_config({MIXIN.sglang_job: list(instances.values())}, tmp_path / "prometheus",
                                      scrape_interval="1s")
    child, url = start_prometheus_on_port_0(config, tmp_path / "prometheus" / "data", tmp_path / "logs")
    try:
        wait_for_scrapes(url, 2)
        since = time.time()
        for instance in instances.values():  # a few scrapes of each: rates over them
            scrapes_since(url, instance, since, n=5, rules=True)
        yield Prometheus(url), instances
    finally:
        child.stop()
        servers.stop()


def _sglang_queries() -> list[tuple[str, str, str]]:
    return [(key, q.ref, q.expr) for key, p in PANELS.items() if p.key.startswith("engine_")
            for q in p.queries if "sglang" in q.expr]


def test_every_sglang_query_finds_either_spelling(prom: tuple[Prometheus, dict[str, str]]) -> None:
    api, instances = prom
    queries = _sglang_queries()
    assert {k for k, _, _ in queries} >= {"engine_running", "engine_waiting", "engine_kv_cache",
                                          "engine_ttft_vs_proxy", "engine_generation", "engine_prompt"}
    now = time.time()
    for prefix, instance in instances.items():
        for key, ref, expr in queries:
            got = api.query(expand(expr, engine_instance=instance.replace(".", "\\\\.")), now)
            values = [float(s["value"][1]) for s in got]
            assert values and all(not math.isnan(v) for v in values), (prefix, key, ref)
    # each spelling alone, and both summed where a board sums (two servers, one per spelling)
    running = next(q.expr for q in PANELS["engine_running"].queries if "sglang" in q.expr)
    assert float(api.query(expand(running), now)[0]["value"][1]) == 2 * 3
