"""Issue 27: ``load`` leaves no announcement behind when it is stopped, says the proxy's reason when
the engine is down, and ``GET /-/scenarios`` tells what is announced now (in-process servers only)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from aiohttp import web

from exporter.harness.load import Cell, Driver, Plan, Stage, proxy_verdict
from exporter.harness.tables import failure_summary
from exporter.proxy.app import create_app

from tests.helpers import make_config


async def _active(session: Any, proxy: str) -> dict[str, Any]:
    async with session.get(f"{proxy}/-/scenarios") as r:
        doc = await r.json()
    return dict(doc["active"])


async def test_scenarios_lists_what_is_announced_per_engine(aiohttp_client: Any, tmp_path: Path) -> None:
    client = await aiohttp_client(create_app(make_config(tmp_path, 1)))
    r = await client.get("/-/scenarios")
    assert (await r.json())["active"] == {"vllm": None, "sglang": None}
    await client.post("/-/scenario", json={"scenario": "short-c32", "round": 2, "engine": "vllm"})
    r = await client.get("/-/scenarios")
    assert (await r.json())["active"] == {"vllm": {"scenario": "short-c32", "round": 2}, "sglang": None}
    await client.post("/-/scenario", json={"scenario": "short-c1", "round": 1})  # every engine
    r = await client.get("/-/scenarios")
    assert (await r.json())["active"] == {"vllm": {"scenario": "short-c1", "round": 1},
                                          "sglang": {"scenario": "short-c1", "round": 1}}
    await client.post("/-/scenario", json={"scenario": None})
    r = await client.get("/-/scenarios")
    assert (await r.json())["active"] == {"vllm": None, "sglang": None}


async def test_a_load_stopped_mid_round_clears_the_scenario_it_announced(aiohttp_server: Any, aiohttp_client: Any,
                                                                        tmp_path: Path) -> None:
    """issue 27: `load` interrupted with Ctrl-C left its scenario announced in the proxy, so the next
    client's requests were labelled with it.  The CLI turns SIGINT and SIGTERM into this
    cancellation (tests/e2e/test_load_signals.py sends the signals)."""
    arrived = asyncio.Event()

    async def hang(request: web.Request) -> web.StreamResponse:
        if request.method == "POST":
            arrived.set()
            await asyncio.Event().wait()  # the engine never answers: the round stays mid-flight
        return web.json_response({"data": [{"id": "m"}]})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", hang)
    engine = await aiohttp_server(app)
    proxy_client = await aiohttp_client(create_app(make_config(tmp_path, engine.port)))
    proxy = f"http://127.0.0.1:{proxy_client.server.port}"
    plan = Plan([Stage("s", [Cell("short-c32", 4, 2, 4, concurrency=2, rounds=2)])])
    driver = Driver(f"{proxy}/vllm", model="m")
    async with driver:
        run = asyncio.create_task(driver.run_plan(plan))
        await arrived.wait()
        assert (await _active(driver.session, proxy))["vllm"] == {"scenario": "short-c32", "round": 1}
        run.cancel()
        try:
            await run
        except asyncio.CancelledError:
            pass
    assert driver.cleared == "the scenario it announced is cleared"
    r = await proxy_client.get("/-/scenarios")
    assert (await r.json())["active"]["vllm"] is None
    events = [json.loads(x) for x in (tmp_path / "run" / "scenarios.jsonl").read_text().splitlines()]
    assert events[-1]["scenario"] is None and events[-1]["engines"] == ["vllm"]


async def test_a_finished_load_leaves_nothing_to_clear(aiohttp_server: Any, aiohttp_client: Any,
                                                       tmp_path: Path) -> None:
    from exporter.harness.sim import build_params, create_sim_app

    sim = await aiohttp_server(create_sim_app(build_params("vllm", speed=50.0)))
    proxy_client = await aiohttp_client(create_app(make_config(tmp_path, sim.port)))
    proxy = f"http://127.0.0.1:{proxy_client.server.port}"
    async with Driver(f"{proxy}/vllm", model="m") as driver:
        await driver.run_plan(Plan([Stage("s", [Cell("short-c1", 4, 2, 2, concurrency=1)])]))
    assert driver.cleared is None  # the runner cleared it after the cell; no second POST was needed
    r = await proxy_client.get("/-/scenarios")
    assert (await r.json())["active"]["vllm"] is None


async def test_an_engine_that_is_down_is_named_by_the_proxys_reason(aiohttp_client: Any, tmp_path: Path,
                                                                    unused_tcp_port: int) -> None:
    """issue 27: with the engine down, `load` said "first error: http_status: HTTP 502"; the proxy's
    record said connect_error, and its JSON error body carries that reason as its type."""
    proxy_client = await aiohttp_client(create_app(make_config(tmp_path, unused_tcp_port)))
    proxy = f"http://127.0.0.1:{proxy_client.server.port}"
    async with Driver(f"{proxy}/vllm", tmp_path / "load", model="m") as driver:
        summary = await driver.run_plan(Plan([Stage("s", [Cell("short-c1", 4, 2, 2, concurrency=1)])]))
    assert driver.first_error is not None and driver.first_error.startswith("connect_error: ")
    assert "HTTP 502" in driver.first_error  # what the client saw, said second
    line = failure_summary([summary])
    assert line is not None and "first error: connect_error: " in line
    assert "the proxy's records: connect_error 2" in line
    mine = [json.loads(x) for x in (tmp_path / "load" / "requests.jsonl").read_text().splitlines()]
    assert {r["proxy_reason"] for r in mine} == {"connect_error"} and {r["reason"] for r in mine} == {"http_status"}
    proxy_records = [json.loads(x) for x in (tmp_path / "run" / "requests.jsonl").read_text().splitlines()]
    assert {r["reason"] for r in proxy_records} == {"connect_error"}


def test_only_a_proxy_verdict_is_taken_from_an_error_body() -> None:
    body = json.dumps({"error": {"message": "upstream timed out", "type": "upstream_timeout", "code": 504}}).encode()
    assert proxy_verdict(504, body) == ("timeout", "upstream timed out")
    engine_own = json.dumps({"error": {"message": "bad", "type": "BadRequestError", "code": 502}}).encode()
    assert proxy_verdict(502, engine_own) is None  # an engine's own error type is no record reason
    assert proxy_verdict(500, b'{"error": {"type": "connect_error"}}') is None
    assert proxy_verdict(502, b"<html>Bad Gateway</html>") is None
