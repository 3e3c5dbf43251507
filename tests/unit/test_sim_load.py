"""Simulated engines, the load driver, and their agreement with the proxy."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from exporter.core.analysis import RequestSpec, StreamAnalyzer
from exporter.harness.load import Cell, Driver, Plan, Stage, load_plan
from exporter.harness.sim import build_params, count_prompt_tokens, create_sim_app

from tests.helpers import INTENDED, read_records


@pytest.mark.parametrize("profile", ["vllm", "sglang"])
@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("fault", list(INTENDED))
async def test_sim_fault_gives_intended_verdict(aiohttp_client: Any, profile: str, chat: bool, fault: str | None) -> None:
    client = await aiohttp_client(create_sim_app(build_params(profile, speed=50.0)))
    body: dict[str, Any] = {"model": "m", "max_tokens": 6, "ignore_eos": True, "stream": True,
                            "stream_options": {"include_usage": True}}
    if chat:
        body["messages"] = [{"role": "user", "content": "one two three"}]
    else:
        body["prompt"] = "one two three"
    headers = {"X-Sim-Fault": fault} if fault else {}
    resp = await client.post("/v1/chat/completions" if chat else "/v1/completions", json=body, headers=headers)
    an = StreamAnalyzer(0.0, resp.status, RequestSpec(True, 6),
                        streaming="text/event-stream" in resp.headers.get("Content-Type", ""))
    error = None
    try:
        async for chunk in resp.content.iter_any():
            an.feed(chunk, 0.1)
    except Exception:  # the disconnect fault cuts the stream
        error = "upstream_disconnect"
    r = an.finish(0.2, error)
    assert r.reason == INTENDED[fault], r.detail
    if fault in (None, "slow_first_byte", "empty_text", "missing_done"):
        assert (r.prompt_tokens, r.completion_tokens) == (3, 6)


async def test_sim_engine_metrics_names(aiohttp_client: Any) -> None:
    names = {
        "vllm": ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
                 "vllm:request_queue_time_seconds_bucket", "vllm:prompt_tokens_total", "vllm:generation_tokens_total"],
        "sglang": ["sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:gen_throughput",
                   "sglang:time_to_first_token_seconds_bucket", "sglang:e2e_request_latency_seconds_bucket",
                   "sglang:prompt_tokens_total", "sglang:generation_tokens_total"],
    }
    for profile, expected in names.items():
        client = await aiohttp_client(create_sim_app(build_params(profile, speed=50.0)))
        await (await client.post("/v1/completions", json={"prompt": "a b", "max_tokens": 2, "stream": True})).read()
        text = await (await client.get("/metrics")).text()
        for name in expected:
            assert f"\n{name}{{" in text, (profile, name)
        assert 'model_name="' in text
        assert (await client.get("/health")).status == 200
        models = await (await client.get("/v1/models")).json()
        assert models["data"][0]["id"]


def test_sim_params_validation(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="add up"):
        build_params("vllm", fault_empty_text=0.7, fault_http_500=0.5)
    with pytest.raises(ValueError, match="unknown profile"):
        build_params("tgi")
    cfg = tmp_path / "sim.yaml"
    cfg.write_text("decode_base_s: 0.5\nbogus: 1\n")
    with pytest.raises(ValueError, match="bogus"):
        build_params("vllm", str(cfg))
    cfg.write_text("decode_base_s: 0.5\n")
    assert build_params("sglang", str(cfg), speed=2.0).decode_base_s == 0.5
    assert count_prompt_tokens({"messages": [{"content": "a b"}, {"content": [{"type": "text", "text": "c"}]}]}) == 3


async def test_driver_ttft_agrees_with_proxy_record(aiohttp_server: Any, proxy_factory: Any, tmp_path: Path) -> None:
    sim = await aiohttp_server(create_sim_app(build_params("vllm", speed=5.0)))
    proxy = await proxy_factory(sim.port)
    base = str(proxy.make_url("/vllm"))
    # the warm-up opens the connections, so the rounds compare steady-state timings
    cell = Cell("short-c1", input_tokens=50, output_tokens=8, requests=12, concurrency=4, rounds=1, warmup=4)
    async with Driver(base, tmp_path / "load") as driver:
        summary = await driver.run_plan(Plan([Stage("core", [cell])]))
    proxy_recs = {r["client_request_id"]: r for r in read_records(tmp_path)}
    drv = [r for r in summary["cells"][0]["rounds"]]
    assert drv[0]["success"] == 12
    seen = 0
    for line in (tmp_path / "load" / "requests.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["scenario"] == "warmup":
            continue
        prox = proxy_recs[rec["id"]]
        assert prox["id"] == rec["proxy_id"] and prox["outcome"] == rec["outcome"] == "success"
        assert (prox["scenario"], prox["round"]) == ("short-c1", 1)
        # Both stamp the same events, on one clock (unix seconds; records keep microseconds):
        # the driver sends before the proxy forwards, and sees the first text and the end only
        # after the proxy received them.  Causality, not a ratio: it holds on any machine.
        eps = 2e-6
        assert rec["start_unix"] <= prox["start_unix"] + eps
        assert prox["start_unix"] + prox["ttft_s"] <= rec["start_unix"] + rec["ttft_s"] + eps
        assert prox["start_unix"] + prox["e2e_s"] <= rec["start_unix"] + rec["e2e_s"] + eps
        seen += 1
    assert seen == 12


async def test_plan_stop_rule(aiohttp_server: Any, tmp_path: Path) -> None:
    sim = await aiohttp_server(create_sim_app(build_params("vllm", speed=50.0, fault_http_500=1.0)))
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(
        "defaults: {input_tokens: 4, output_tokens: 2, requests: 2}\n"
        "stages:\n"
        "  - name: rate-sweep\n    stop_after_failed_rounds: 3\n    cells:\n"
        "      - {scenario: r1, rate: 50, rounds: 2}\n"
        "      - {scenario: r2, rate: 50, rounds: 2}\n"
        "      - {scenario: r3, rate: 50, rounds: 2}\n"
    )
    plan = load_plan(plan_file)
    async with Driver(f"http://127.0.0.1:{sim.port}", tmp_path / "out", model="m") as driver:
        summary = await driver.run_plan(plan)
    assert [c["cell"]["scenario"] for c in summary["cells"]] == ["r1", "r2"]
    assert [len(c["rounds"]) for c in summary["cells"]] == [2, 1]
    assert summary["stops"] == [{"stage": "rate-sweep", "after": "r2#1",
                                 "reason": "3 consecutive rounds with a failed request", "skipped": ["r3"],
                                 "first_error": "http_status: HTTP 500"}]
    assert summary["first_error"] == "http_status: HTTP 500"
    csv_lines = (tmp_path / "out" / "rounds.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + 3
    assert summary["cells"][0]["median"]["success"] == 0 and summary["cells"][0]["median"]["requests"] == 4


def test_plan_errors(tmp_path: Path) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text("stages:\n  - cells:\n      - {scenario: x, input_tokens: 1, output_tokens: 1, requests: 1}\n")
    with pytest.raises(ValueError, match="stages.0.cells.0: give exactly one of concurrency and rate"):
        load_plan(bad)
    bad.write_text("- 1\n")
    with pytest.raises(ValueError, match="stages"):
        load_plan(bad)


def test_example_plans_load() -> None:
    root = Path(__file__).resolve().parents[2] / "examples" / "plans"
    seed = load_plan(root / "seed.yaml")
    core, sweep = seed.stages
    assert len(core.cells) == 12 and all(c.rounds == 3 and c.warmup == 2 for c in core.cells)
    assert {(c.input_tokens, c.output_tokens) for c in core.cells} == {(1024, 128), (8192, 128), (1024, 512), (24576, 128)}
    assert {c.concurrency: c.requests for c in core.cells} == {1: 8, 8: 16, 32: 64}
    assert [c.rate for c in sweep.cells] == [0.3, 0.48, 0.66] and sweep.stop_after_failed_rounds == 3
    assert all(c.requests == 200 and c.rounds == 3 for c in sweep.cells)
    assert load_plan(root / "demo.yaml").stages
    cap = load_plan(root / "capacity.yaml")
    assert [st.sweep.over for st in cap.stages if st.sweep] == ["concurrency", "rate"]
    assert [c.concurrency for c in cap.stages[0].cells] == [1, 2, 4, 8, 16, 32, 64]
    assert all(c.warmup == 0 and c.requests == 200 for c in cap.stages[1].cells)
    assert sorted(p.name for p in root.glob("*.yaml")) == ["capacity.yaml", "demo.yaml", "seed.yaml"]


@pytest.mark.slow  # a subprocess or a whole-tree tool: runs in the full suite
async def test_load_cli(aiohttp_server: Any, tmp_path: Path) -> None:
    import asyncio
    import sys

    sim = await aiohttp_server(create_sim_app(build_params("sglang", speed=50.0)))

    async def cli(*args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "exporter.cli", "load", "--no-proxy", "--base-url", f"http://127.0.0.1:{sim.port}",
            *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
        return proc.returncode or 0, out.decode()

    rc, out = await cli("--scenario", "short-c2", "--concurrency", "2", "--requests", "6", "--rounds", "2",
                        "--input-tokens", "8", "--output-tokens", "4", "--chat", "--out", str(tmp_path / "o"),
                        "--label", "sglang")
    assert rc == 0, out
    assert re.search(r"^sglang\s+short-c2\s+12/12\s", out, re.M), out
    rows = (tmp_path / "o" / "rounds.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[1].startswith("sglang,adhoc,short-c2,1,6,6,0,")
    assert "goodput %" in out and "SLO: TTFT <= 3.0 s and TPOT <= 50 ms" in out
    assert "sglang short-c2#1: 6/6 requests" not in out and "sglang short-c2: 12/12 requests" in out  # progress
    rc, again = await cli("--scenario", "short-c2", "--concurrency", "2", "--requests", "3",
                          "--input-tokens", "8", "--output-tokens", "4", "--out", str(tmp_path / "o"))
    assert rc == 2 and "is not empty" in again and "--force" in again, again
    assert len((tmp_path / "o" / "requests.jsonl").read_text().splitlines()) == 12  # untouched
    rc, again = await cli("--scenario", "short-c2", "--concurrency", "2", "--requests", "3",
                          "--input-tokens", "8", "--output-tokens", "4", "--out", str(tmp_path / "o"), "--force")
    assert rc == 0, again
    assert len((tmp_path / "o" / "requests.jsonl").read_text().splitlines()) == 3  # this run's only
    assert len((tmp_path / "o" / "rounds.csv").read_text().splitlines()) == 2
    rc, out = await cli("--rate", "5", "--requests", "3", "--input-tokens", "8", "--output-tokens", "4")
    assert rc == 0 and re.search(r"\sadhoc\s+3/3\s", out), out
    rc, out = await cli("--concurrency", "2", "--input-tokens", "8")
    assert rc == 2 and "--requests" in out and "Traceback" not in out
    failing = await aiohttp_server(create_sim_app(build_params("vllm", speed=50.0, fault_http_500=1.0)))
    rc, out = await cli("--concurrency", "2", "--requests", "3", "--input-tokens", "8", "--output-tokens", "4",
                        "--base-url", f"http://127.0.0.1:{failing.port}")
    assert rc == 1 and "Traceback" not in out, out
    assert "no request succeeded; failures: http_status 3; first error: http_status: HTTP 500" in out, out


@pytest.mark.parametrize("stream", [True, False])
async def test_sim_is_quiet_when_a_client_hangs_up(caplog: pytest.LogCaptureFixture, stream: bool) -> None:
    """A client that leaves mid-answer is an everyday event for an engine: no traceback."""
    import logging

    from aiohttp import web

    from exporter.harness.sim import SIM

    caplog.set_level(logging.INFO)
    app = create_sim_app(build_params("vllm", speed=1.0))
    runner = web.AppRunner(app, access_log=None)  # as `sim` runs it (run_app): handlers are not cancelled
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        await _hang_up(app[SIM], port, stream)
    finally:
        await runner.cleanup()
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], caplog.text
    assert "Traceback" not in caplog.text


async def _hang_up(sim: Any, port: int, stream: bool) -> None:
    """A request whose client leaves mid-answer; returns once the sim's handler has ended."""
    import asyncio

    body = json.dumps({"prompt": "a b c", "max_tokens": 100, "stream": stream}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    await writer.drain()
    if stream:
        assert b" 200 " in await reader.readuntil(b"\r\n")  # the answer has begun
    while sim.running == 0:
        await asyncio.sleep(0.01)
    writer.transport.abort()
    while sim.running:  # the handler has ended
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert sim.hangups == (1 if stream else 0)
