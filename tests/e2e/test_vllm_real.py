"""A real vLLM (the CPU build, a tiny random-weight llama built here) behind the real proxy, with a
real Prometheus scraping both: verdicts on its streams, the engine-internals board on its
/metrics, vLLM's own benchmark client through the proxy, and a dead engine core.

One vLLM server for the whole module (it takes a minute or two to start); the last test kills
its engine core, so it stays last.  Needs ``.ci/install-vllm.sh`` (skipped without it, failed
without it when LLMBENCH_REQUIRE_VLLM=1).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from dashboards.catalogue import INTERNALS, expand
from exporter.evidence.promapi import Prometheus
from exporter.harness.stack import render_prometheus_config, wait_for_scrapes

from tests.helpers import (
    RealStack,
    has_data,
    read_records,
    require_prometheus,
    scrapes_since,
    start_prometheus_on_port_0,
)
from tests.vllm_engine import VllmServer, bench_serve, build_model, require_vllm, start_proxy

MAX_TOKENS = 12
SCRAPE_S = 2
BENCH_PROMPTS = 16
#: engine name -> usage setting; both are this one vLLM
ENGINES = {"vllm": "require", "vllm-inject": "inject"}
#: the internals board's queries that read this vLLM or the proxy (the rest read SGLang)
BOARD_QUERIES = [(p.key, q.ref) for p in INTERNALS.panels for q in p.queries if 'job="sglang"' not in q.expr]


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealStack[VllmServer]]:
    require_prometheus()
    require_vllm()
    out = tmp_path_factory.mktemp("vllm-real")
    with contextlib.ExitStack() as stack:
        t0 = time.monotonic()
        server = VllmServer(build_model(out / "model"), out / "logs", extra=["--enable-per-request-metrics"])
        stack.callback(server.stop)
        server.start()
        print(f"\nvLLM: model built and server ready in {time.monotonic() - t0:.0f} s")
        proxy, proxy_url = start_proxy(out, [{"name": n, "upstream": server.url, "usage": u}
                                             for n, u in ENGINES.items()]
                                       + [{"name": "vllm-ids", "upstream": server.url, "token_ids": True}])
        stack.callback(proxy.stop)
        config = render_prometheus_config({"llmbench-exporter": [proxy_url.removeprefix("http://")],
                                           "vllm": [server.url.removeprefix("http://")]},
                                          out / "prometheus", scrape_interval=f"{SCRAPE_S}s")
        prom, prom_url = start_prometheus_on_port_0(config, out / "prometheus" / "data", out / "logs")
        stack.callback(prom.stop)
        wait_for_scrapes(prom_url, 2)
        yield RealStack(server, proxy_url, prom_url, out, time.time())


def _body(route: str, engine: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "tiny", "stream": True, "ignore_eos": True, "max_tokens": MAX_TOKENS}
    if route == "completions":
        body["prompt"] = "def handle(request):\n    return"
    else:
        body["messages"] = [{"role": "user", "content": "Explain what this function returns."}]
    if ENGINES[engine] == "require":
        body["stream_options"] = {"include_usage": True}
    return body


def _stream(url: str, body: dict[str, Any], client_id: str) -> tuple[int, list[str]]:
    """POST a streamed request; the status and the data of each SSE event."""
    with requests.post(url, json=body, headers={"X-Request-Id": client_id}, stream=True, timeout=120) as r:
        events = [line[len(b"data: "):].decode() for line in r.iter_lines() if line.startswith(b"data: ")]
        return r.status_code, events


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("route", ["completions", "chat/completions"])
def test_real_streams_are_judged_success(real: RealStack, route: str, engine: str) -> None:
    client_id = f"verdict-{route.replace('/', '-')}-{engine}"
    status, events = _stream(f"{real.proxy}/{engine}/v1/{route}", _body(route, engine), client_id)
    assert status == 200 and events[-1] == "[DONE]", events[-3:]
    docs = [json.loads(e) for e in events[:-1]]
    usage_events = [d for d in docs if d.get("usage")]
    # the client asked for usage and got it; or it did not, and the injected usage stayed out of its stream
    assert len(usage_events) == (1 if ENGINES[engine] == "require" else 0), usage_events
    rec = real.record(client_id)
    assert (rec["outcome"], rec["reason"]) == ("success", None), rec
    assert rec["completion_tokens"] == rec["expected_tokens"] == MAX_TOKENS
    assert rec["usage_injected"] is (ENGINES[engine] == "inject")
    assert rec["done"] is True and rec["route"] == f"/v1/{route}" and rec["engine"] == engine
    assert 0 < rec["ttfe_s"] <= rec["ttft_s"] <= rec["e2e_s"]
    # the engine's own clock, from vLLM's metrics object on the usage chunk (also the injected one)
    assert rec["engine_timing"] == "stream", rec
    assert rec["engine_queue_s"] >= 0 and rec["engine_prefill_s"] > 0 and rec["engine_decode_s"] > 0
    assert rec["engine_queue_s"] + rec["engine_prefill_s"] <= rec["ttft_s"]
    assert rec["ttft_outside_engine_s"] == pytest.approx(rec["ttft_s"] - rec["engine_queue_s"] - rec["engine_prefill_s"])


@pytest.fixture(scope="module")
def bench_run(real: RealStack) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``vllm bench serve`` through the proxy; its result and the proxy's records of its requests."""
    result = bench_serve(f"{real.proxy}/vllm", real.server.model, real.out / "bench", input_len=64, output_len=16,
                         prompts=BENCH_PROMPTS, concurrency=4, request_id_prefix="bench-")
    deadline = time.monotonic() + 30
    while True:
        records = [r for r in real.records() if (r["client_request_id"] or "").startswith("bench-")]
        if len(records) >= result["completed"] or time.monotonic() > deadline:
            return result, records
        time.sleep(0.05)


def test_vllm_bench_serve_counts_match_records(bench_run: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    result, records = bench_run
    assert result["completed"] == BENCH_PROMPTS and result["failed"] == 0
    assert sorted(r["client_request_id"] for r in records) == sorted(f"bench-{i}" for i in range(BENCH_PROMPTS))
    assert sum(r["outcome"] == "success" for r in records) == result["completed"]
    assert all(r["completion_tokens"] == 16 for r in records)
    assert sum(r["completion_tokens"] for r in records) == result["total_output_tokens"]


def test_vllm_bench_serve_ttft_agrees_with_records(bench_run: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    """Per request, the proxy's first event comes between the client's send and its first token
    (one machine, one monotonic clock: records round to the microsecond); and the medians agree."""
    result, records = bench_run
    by_id = {r["client_request_id"]: r for r in records}
    pairs = [(by_id[f"bench-{i}"]["ttfe_s"], ttft) for i, ttft in enumerate(result["ttfts"])]
    assert len(pairs) == BENCH_PROMPTS
    late = [(i, p, c) for i, (p, c) in enumerate(pairs) if p > c + 1e-6]
    assert not late, f"proxy's ttfe_s after the client's TTFT: {late}"
    proxy_median = statistics.median(p for p, _ in pairs)
    client_median = statistics.median(c for _, c in pairs)
    # generous: the client's TTFT adds the way through the proxy, slow on a busy 2-core machine;
    # a proxy that stamped its first event too early (say at the request) would read far lower
    assert client_median / proxy_median <= 10, (client_median, proxy_median, pairs)


@pytest.fixture(scope="module")
def scraped(real: RealStack, bench_run: tuple[dict[str, Any], list[dict[str, Any]]]) -> Prometheus:
    """Prometheus, once its latest scrapes of vLLM and the proxy include the benchmark's requests."""
    prom = Prometheus(real.prom)
    result, records = bench_run
    checks = {'sum(vllm:request_success_total{job="vllm"})': result["completed"],
              'sum(llmbench_requests_total{job="llmbench-exporter", engine="vllm"})': len(records)}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        values = {q: prom.query(q) for q in checks}
        if all(v and float(v[0]["value"][1]) >= n for (q, n), v in zip(checks.items(), values.values())):
            seen = time.time()  # one scrape more of each: rate() needs the sample after the increase too
            for url in (real.server.url, real.proxy):
                scrapes_since(real.prom, url.removeprefix("http://"), seen)
            return prom
        time.sleep(0.5)
    raise AssertionError(f"Prometheus did not see the benchmark within 60 s: {values}")


@pytest.mark.parametrize("panel,ref", BOARD_QUERIES)
def test_internals_board_reads_real_vllm(real: RealStack, scraped: Prometheus, panel: str, ref: str) -> None:
    (query,) = [q for p in INTERNALS.panels if p.key == panel for q in p.queries if q.ref == ref]
    expr = expand(query.expr)
    series = scraped.query_range(expr, real.start - 5, time.time(), 1.0)
    assert has_data(series), f"{panel}/{ref}: no data from the real vLLM for {expr}"


def test_the_seeds_empty_200_says_what_the_engine_generated(real: RealStack,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The seed's 13 requests, on a real engine: pushed towards ``</s>`` (id 2) under
    ``ignore_eos``, vLLM answers HTTP 200, [DONE], usage with 16 completion tokens, and no text.
    The proxy judges it ``empty_text``; asked for the token ids (engine option ``token_ids``),
    the capture shows why: sixteen ``</s>``, a special token that detokenizing skips."""
    from exporter.evidence.cli import main as evidence_main

    body = {"model": "tiny", "prompt": "def handle(request):", "stream": True, "ignore_eos": True,
            "max_tokens": 16, "logit_bias": {"2": 100}, "stream_options": {"include_usage": True}}
    status, events = _stream(f"{real.proxy}/vllm-ids/v1/completions", body, "empty-200")
    assert status == 200 and events[-1] == "[DONE]", events[-3:]
    rec = real.record("empty-200")
    assert (rec["outcome"], rec["reason"]) == ("failure", "empty_text"), rec
    assert rec["completion_tokens"] == 16 and rec["visible_chars"] == 0 and rec["done"] is True
    assert rec["capture"], rec  # failures are captured by default
    capture = real.out / "run" / rec["capture"]
    assert evidence_main(["decode", str(capture), "--tokenizer", str(real.server.model), "--json"]) == 0
    (decoded,) = json.loads(capsys.readouterr().out)
    assert [(t["id"], t["token"], t["special"]) for t in decoded["tokens"]] == [(2, "</s>", True)] * 16


def _replay(url: str, trace: Path, out: Path, model: Path, scenario: str, chat: bool) -> list[dict[str, Any]]:
    """``load --trace TRACE --tokenizer MODEL --block-size 16``, in process; the driver's records."""
    import asyncio

    from exporter.harness.load import Driver
    from exporter.harness.plan import Plan, Stage, cell_from_options
    from exporter.proxy.prompttokens import PromptTokenizer

    cell = cell_from_options(scenario=scenario, input_tokens=None, output_tokens=None, requests=None,
                             trace=str(trace), block_size=TRACE_BLOCK, chat=chat)

    async def drive() -> None:
        async with Driver(f"{url}/vllm", out, seed=2, tokenizer=PromptTokenizer(model)) as driver:
            await driver.run_plan(Plan([Stage("s", [cell])]))

    asyncio.run(drive())
    return [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]


def _traced(out: Path, scenario: str, n: int, write: Path | None = None) -> list[dict[str, Any]]:
    """``evidence trace --scenario SCENARIO`` of the proxy's records under ``out`` (to ``write``)."""
    from exporter.evidence.mooncake import mooncake_lines, write_trace

    deadline = time.monotonic() + 30
    while len([r for r in read_records(out) if r["scenario"] == scenario]) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    lines, facts = mooncake_lines(read_records(out), scenario=scenario)
    assert len(lines) == n and facts["unhashed_blocks"] == 0, facts
    if write is not None:
        write_trace(write, lines, facts, str(out))
    return lines


TRACE_BLOCK = 16


def test_a_replay_on_the_real_vllm_is_the_trace_it_replayed(real: RealStack) -> None:
    """Fidelity against the real engine: traffic through a proxy with ``trace:`` (the model's own tokenizer and
    chat template), exported, replayed with ``--tokenizer`` (as completions, then as chat) and captured again
    gives the same lengths, as vLLM counts them, the same hash ids and arrivals within the schedule lag."""
    out = real.out / "trace"
    model = real.server.model
    proxy, url = start_proxy(out, [{"name": "vllm", "upstream": real.server.url}], scenarios=["live", "replay", "replay-chat"],
                             trace={"tokenizer": str(model), "block_size": TRACE_BLOCK})
    try:
        system = "import json\n\ndef handle(request):\n    body = json.loads(request.body)\n    return body\n" * 3
        asks = ["What does it return?", "Explain the loop.", "Rewrite it without json, keeping its behaviour."]
        live = [{"prompt": system + asks[0]}, {"prompt": system + asks[1]},
                {"messages": [{"role": "system", "content": system}, {"role": "user", "content": asks[2]}]},
                {"prompt": system + asks[0]}, {"prompt": "def f(x):\n    return x * 2\n" * 4}]
        for i, body in enumerate(live):
            route = "chat/completions" if "messages" in body else "completions"
            r = requests.post(f"{url}/vllm/v1/{route}", headers={"X-Bench-Scenario": "live"}, timeout=120, json={
                **body, "model": "tiny", "stream": True, "ignore_eos": True, "max_tokens": 3 + i,
                "stream_options": {"include_usage": True}})
            assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text[-300:]
            time.sleep(0.1)
        trace = out / "live.jsonl"
        first = _traced(out, "live", len(live), trace)
        ids = [x["hash_ids"] for x in first]
        assert ids[3] == ids[0] and ids[1][:2] == ids[0][:2] and ids[1] != ids[0]  # a shape worth keeping
        for scenario, chat in (("replay", False), ("replay-chat", True)):
            sent = _replay(url, trace, out / scenario, model, scenario, chat)
            assert all(r["outcome"] == "success" for r in sent), sent
            again = _traced(out, scenario, len(live))
            assert [(x["input_length"], x["output_length"]) for x in again] == \
                [(x["input_length"], x["output_length"]) for x in first], (scenario, again, first)
            assert [x["hash_ids"] for x in again] == ids, scenario
            lag = max(r["schedule_lag_s"] for r in sent) * 1000
            assert all(abs(a["timestamp"] - b["timestamp"]) <= 2 * lag + 50 for a, b in zip(first, again)), (lag, again)
    finally:
        proxy.stop()


def test_dead_engine_core_is_judged_sse_error(real: RealStack) -> None:
    """Last: it kills the engine.  vLLM 0.32 then ends the open stream with HTTP 200, a
    ``data: {"error": ...}`` event and ``[DONE]``; the proxy must judge it ``sse_error``."""
    body = {**_body("completions", "vllm"), "max_tokens": 1900}
    core = real.server.engine_core_pid()
    with requests.post(f"{real.proxy}/vllm/v1/completions", json=body, headers={"X-Request-Id": "dead-core"},
                       stream=True, timeout=120) as r:
        events: list[str] = []
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                events.append(line[len(b"data: "):].decode())
            if len(events) == 3:  # mid-stream: the engine is generating
                os.kill(core, signal.SIGKILL)
        status = r.status_code
    assert status == 200 and events[-1] == "[DONE]", events[-3:]
    errors = [json.loads(e)["error"] for e in events[:-1] if "error" in json.loads(e)]
    assert len(errors) == 1 and len(events) - 2 < 1900, events[-3:]
    rec = real.record("dead-core")
    assert (rec["outcome"], rec["reason"], rec["status"]) == ("failure", "sse_error", 200), rec
    assert rec["detail"] == errors[0]["message"]
