"""The proxy against real in-process aiohttp upstreams."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.helpers import OK_BODY, OK_EVENTS, metric_value, read_records, stream_events, wait_for_records
from tests.transcripts import sse

REQ = {"model": "m", "prompt": "hi", "max_tokens": 2, "ignore_eos": True, "stream": True,
       "stream_options": {"include_usage": True}}


async def test_byte_exact_pass_through_and_success(upstream, proxy_factory, tmp_path: Path) -> None:
    up, server = upstream
    # Reads that split events, CRLF and a UTF-8 character: the client must get the same bytes.
    body = OK_BODY.replace(b'"lo"', "\"l\u00f6\"".encode())
    pieces = [body[i:i + 7] for i in range(0, len(body), 7)]
    up.handler = lambda r: stream_events(r, pieces, headers={"X-Upstream": "yes"})
    client = await proxy_factory(server.port)
    resp = await client.post("/vllm/v1/completions", json=REQ, headers={"X-Request-Id": "req-1"})
    got = await resp.read()
    assert resp.status == 200
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(body).hexdigest()
    assert resp.headers["X-Upstream"] == "yes"
    rec, = read_records(tmp_path)
    assert rec["outcome"] == "success" and rec["reason"] is None
    assert rec["client_request_id"] == "req-1" and rec["id"] == resp.headers["X-LLMBench-Request-Id"]
    assert (rec["completion_tokens"], rec["prompt_tokens"], rec["visible_chars"]) == (2, 4, 5)
    assert rec["ttft_s"] > 0 and rec["e2e_s"] >= rec["ttft_s"] and rec["capture"] is None
    assert (rec["model"], rec["usage_injected"]) == ("m", False)
    # the record's uncertainty is the one the histogram observed (rounded to the microsecond)
    text = await (await client.get("/metrics")).text()
    assert metric_value(text, "llmbench_request_timing_uncertainty_seconds_count", engine="vllm") == 1
    assert rec["timing_uncertainty_s"] >= 0 and rec["timing_uncertainty_s"] == pytest.approx(
        metric_value(text, "llmbench_request_timing_uncertainty_seconds_sum", engine="vllm"), abs=1e-6)
    assert up.seen[0]["path"] == "/v1/completions"
    assert json.loads(up.seen[0]["body"]) == REQ
    assert up.seen[0]["headers"]["Accept-Encoding"] == "identity"


async def test_client_abort_cancels_upstream(upstream, proxy_factory, tmp_path: Path) -> None:
    up, server = upstream
    upstream_cancelled = asyncio.Event()

    async def slow(request: web.Request) -> web.StreamResponse:
        try:
            return await stream_events(request, [f"data: {OK_EVENTS[0]}\n\n".encode()] * 200, delay=0.05)
        except (asyncio.CancelledError, ConnectionError):
            upstream_cancelled.set()
            raise

    up.handler = slow
    client = await proxy_factory(server.port)
    resp = await client.post("/vllm/v1/completions", json=REQ)
    await resp.content.readany()
    resp.close()  # the client goes away mid-stream
    await asyncio.wait_for(upstream_cancelled.wait(), 5)
    rec, = await wait_for_records(tmp_path, 1)
    assert (rec["outcome"], rec["reason"]) == ("client_abort", "client_abort")
    text = await (await client.get("/metrics")).text()
    assert metric_value(text, "llmbench_requests_total", outcome="client_abort", engine="vllm") == 1
    assert metric_value(text, "llmbench_requests_in_flight", engine="vllm") == 0


async def test_upstream_disconnect_mid_stream(upstream, proxy_factory, tmp_path: Path) -> None:
    up, server = upstream

    async def cut(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(f"data: {OK_EVENTS[0]}\n\n".encode())
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.abort()
        return resp

    up.handler = cut
    client = await proxy_factory(server.port)
    resp = await client.post("/vllm/v1/completions", json=REQ)
    assert resp.status == 200
    with pytest.raises(aiohttp.ClientPayloadError):
        await resp.read()  # the client's stream is cut too, not completed
    rec, = read_records(tmp_path)
    assert (rec["outcome"], rec["reason"]) == ("failure", "upstream_disconnect")
    assert rec["capture_sha256"] == hashlib.sha256(f"data: {OK_EVENTS[0]}\n\n".encode()).hexdigest()


async def test_upstream_500_is_passed_and_counted(upstream, proxy_factory, tmp_path: Path) -> None:
    up, server = upstream
    up.handler = lambda r: asyncio.sleep(0, web.json_response({"error": "boom"}, status=500))
    client = await proxy_factory(server.port)
    resp = await client.post("/sglang/v1/chat/completions", json={**REQ, "messages": []})
    assert resp.status == 500 and await resp.json() == {"error": "boom"}
    rec, = read_records(tmp_path)
    assert (rec["reason"], rec["status"], rec["engine"]) == ("http_status", 500, "sglang")


async def test_connection_refused(unused_tcp_port_factory: Any, proxy_factory, tmp_path: Path) -> None:
    client = await proxy_factory(unused_tcp_port_factory())
    resp = await client.post("/vllm/v1/completions", json=REQ)
    assert resp.status == 502
    body = await resp.json()
    assert body["error"]["type"] == "connect_error"
    rec, = read_records(tmp_path)
    assert (rec["outcome"], rec["reason"], rec["status"]) == ("failure", "connect_error", None)


async def test_slow_first_byte_before_headers(upstream, proxy_factory, tmp_path: Path) -> None:
    up, server = upstream

    release = asyncio.Event()  # set once the proxy has answered: only its deadline can end the wait

    async def sleepy(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return web.Response(text="too late")

    up.handler = sleepy
    client = await proxy_factory(server.port, timeouts={"first_byte_s": 0.3})
    resp = await client.post("/vllm/v1/completions", json=REQ)
    release.set()
    assert resp.status == 504
    rec, = read_records(tmp_path)
    assert rec["reason"] == "timeout" and "first_byte_s=0.3" in rec["detail"]


async def test_slow_first_byte_after_headers(upstream, proxy_factory, tmp_path: Path) -> None:
    up, server = upstream

    release = asyncio.Event()  # set once the proxy has cut the stream: only its deadline can end it

    async def prefill(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await release.wait()
        return resp

    up.handler = prefill
    client = await proxy_factory(server.port, timeouts={"first_byte_s": 0.3})
    try:
        resp = await client.post("/vllm/v1/completions", json=REQ)
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()
    finally:
        release.set()
    rec, = read_records(tmp_path)
    assert rec["reason"] == "timeout"


async def test_secrets_never_reach_disk(upstream, proxy_factory, tmp_path: Path) -> None:
    up, server = upstream
    secret = "sk-live-SECRET-0123456789"
    bodies = [OK_BODY, sse(OK_EVENTS[0], "[DONE]"), b""]
    client = await proxy_factory(server.port, capture_raw_sse="all")
    for body in bodies:
        up.handler = lambda r, b=body: stream_events(r, [b])
        resp = await client.post("/vllm/v1/completions", json=REQ,
                                 headers={"Authorization": f"Bearer {secret}", "X-Api-Key": secret})
        await resp.read()
    assert all(s["headers"]["Authorization"] == f"Bearer {secret}" for s in up.seen)  # forwarded
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert len(files) == 3 + 2 * len(bodies)  # requests, scenarios, engines, and a pair per capture
    for p in files:
        assert secret.encode() not in p.read_bytes(), p


async def test_metrics_after_known_mix(upstream, proxy_factory, tmp_path: Path) -> None:
    up, server = upstream
    client = await proxy_factory(server.port)
    empty = sse(*['{"choices":[{"text":""}]}'] * 3,
                '{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2}}', "[DONE]")
    mix = [(OK_BODY, "short-c1"), (OK_BODY, "short-c1"), (OK_BODY, "short-c32"),
           (empty, "short-c1"), (sse(OK_EVENTS[0], "[DONE]"), "short-c1")]
    for body, scenario in mix:
        up.handler = lambda r, b=body: stream_events(r, [b])
        resp = await client.post("/vllm/v1/completions", json=REQ, headers={"X-Bench-Scenario": scenario})
        await resp.read()
    text = await (await client.get("/metrics")).text()

    def m(name: str, **labels: str) -> float:
        return metric_value(text, name, engine="vllm", **labels)

    assert m("llmbench_requests_total", scenario="short-c1", outcome="success", reason="none") == 2
    assert m("llmbench_requests_total", scenario="short-c32", outcome="success") == 1
    assert m("llmbench_requests_total", scenario="short-c1", outcome="failure", reason="empty_text") == 1
    assert m("llmbench_requests_total", scenario="short-c1", outcome="failure", reason="missing_usage") == 1
    assert m("llmbench_empty_text_responses_total", scenario="short-c1") == 1
    assert m("llmbench_output_tokens_total", scenario="short-c1", outcome="success") == 4
    assert m("llmbench_output_tokens_total", scenario="short-c1", outcome="failure") == 2
    assert m("llmbench_prompt_tokens_total", scenario="short-c1") == 18
    assert m("llmbench_time_to_first_token_seconds_count", scenario="short-c1") == 2
    assert m("llmbench_time_per_output_token_seconds_count", scenario="short-c1") == 2
    assert m("llmbench_e2e_request_latency_seconds_count", scenario="short-c32") == 1
    assert m("llmbench_time_to_first_token_seconds_bucket", scenario="short-c1", le="3.0") == 2
    assert m("llmbench_requests_in_flight") == 0
    records = read_records(tmp_path)
    assert len(records) == len(mix)
    assert sum(r["outcome"] == "success" for r in records) == 3
    failed = [r for r in records if r["outcome"] == "failure"]
    assert all(r["capture"] and Path(r["capture"]).read_bytes() for r in failed)  # failures captured


async def test_unknown_scenarios_collapse_to_other(upstream, proxy_factory, tmp_path: Path) -> None:
    up, server = upstream
    client = await proxy_factory(server.port)
    for i in range(20):
        resp = await client.post("/vllm/v1/completions", json=REQ, headers={"X-Bench-Scenario": f"flood-{i}"})
        await resp.read()
    text = await (await client.get("/metrics")).text()
    scenarios = {line.split('scenario="')[1].split('"')[0]
                 for line in text.splitlines() if line.startswith("llmbench_requests_total{")}
    assert scenarios == {"short-c1", "short-c32", "none", "other"}  # configured names, none, other: bounded
    assert metric_value(text, "llmbench_requests_total", scenario="other", outcome="success") == 20


async def test_scenario_endpoint(upstream, proxy_factory, tmp_path: Path) -> None:
    up, server = upstream
    client = await proxy_factory(server.port)
    resp = await client.post("/-/scenario", json={"scenario": "short-c32", "round": 2, "engine": "vllm"})
    assert resp.status == 200 and (await resp.json())["engines"] == ["vllm"]
    await (await client.post("/vllm/v1/completions", json=REQ)).read()
    await (await client.post("/sglang/v1/completions", json=REQ)).read()
    text = await (await client.get("/metrics")).text()
    assert metric_value(text, "llmbench_scenario_info", engine="vllm", scenario="short-c32", round="2") == 1
    recs = read_records(tmp_path)
    assert [(r["engine"], r["scenario"], r["round"]) for r in recs] == [("vllm", "short-c32", 2), ("sglang", "none", None)]
    await client.post("/-/scenario", json={"scenario": None})
    text = await (await client.get("/metrics")).text()
    assert "llmbench_scenario_info{" not in text
    events = [json.loads(x) for x in (tmp_path / "run" / "scenarios.jsonl").read_text().splitlines()]
    assert [e["scenario"] for e in events] == ["short-c32", None]
    for bad in ({"scenario": 3}, {"scenario": "x", "round": -1}, {"scenario": "x", "engine": "nope"}, [1]):
        assert (await client.post("/-/scenario", json=bad)).status == 400
    assert (await client.post("/-/scenario", data=b"{")).status == 400


async def test_only_listed_routes_are_forwarded(upstream, proxy_factory) -> None:
    up, server = upstream
    client = await proxy_factory(server.port)
    for method, path in [("GET", "/vllm/v1/foo"), ("POST", "/nope/v1/completions"), ("POST", "/vllm/v2/completions"),
                         ("GET", "/vllm/v1/completions"), ("POST", "/http://evil.example/v1/completions"),
                         ("POST", "/vllm/v1/completions/../../admin"), ("GET", "/")]:
        resp = await client.request(method, path, json=REQ)
        assert resp.status in (404, 405), (method, path)
    assert up.seen == []
    resp = await client.get("/vllm/v1/models")
    assert resp.status == 200 and up.seen[0]["path"] == "/v1/models"


async def test_health_ready_and_large_body(upstream, proxy_factory, tmp_path: Path) -> None:
    up, server = upstream
    client = await proxy_factory(server.port)
    assert (await client.get("/-/healthy")).status == 200
    assert (await client.get("/-/ready")).status == 200
    big = {**REQ, "prompt": "x" * (3 << 20)}  # over aiohttp's own 1 MiB default
    resp = await client.post("/vllm/v1/completions", json=big)
    assert resp.status == 200
    await resp.read()
    assert len(up.seen[0]["body"]) > 3 << 20


async def test_client_abort_during_prefill(upstream, proxy_factory, tmp_path: Path) -> None:
    """The client gives up before the first byte: counted at once, the upstream request cancelled."""
    up, server = upstream
    cancelled = asyncio.Event()

    async def long_prefill(request: web.Request) -> web.StreamResponse:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return await up.ok(request)

    up.handler = long_prefill
    client = await proxy_factory(server.port)
    sent = time.monotonic()
    with pytest.raises(asyncio.TimeoutError):
        await client.post("/vllm/v1/completions", json=REQ, timeout=aiohttp.ClientTimeout(total=0.3))
    await asyncio.wait_for(cancelled.wait(), 5)
    rec, = await wait_for_records(tmp_path, 1)
    waited = time.monotonic() - sent
    assert (rec["outcome"], rec["reason"], rec["status"]) == ("client_abort", "client_abort", None)
    # recorded while the upstream was still in its 30 s prefill: the E2E ends where the client left
    assert rec["e2e_s"] is not None and 0 < rec["e2e_s"] <= waited
