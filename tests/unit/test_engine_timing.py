"""The engine's own clock joined per request (exporter/core/enginetime.py): vLLM's per-request
``metrics`` object on its usage chunk, read live by the core, into records and histograms; and
SGLang's per-request lines, read for their timing only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from exporter.core.analysis import RequestSpec, StreamAnalyzer
from exporter.core.enginetime import EngineTiming, from_sglang_line, from_vllm_metrics, missing_parts, outside_engine

from tests.helpers import metric_value, stream_events, wait_for_records
from tests.transcripts import sse

METRICS = {"time_to_first_token_ms": 40.0, "generation_time_ms": 120.0, "queue_time_ms": 10.0,
           "mean_itl_ms": 120.0, "tokens_per_second": 12.5}
EVENTS = [
    '{"id":"cmpl-9","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"Hi","finish_reason":null}]}',
    '{"id":"cmpl-9","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"!","finish_reason":"length"}]}',
    '{"id":"cmpl-9","object":"text_completion","created":1,"model":"m","choices":[],'
    '"usage":{"prompt_tokens":4,"total_tokens":6,"completion_tokens":2},"metrics":' + json.dumps(METRICS) + "}",
    "[DONE]",
]


def test_vllm_metrics_object_in_seconds() -> None:
    timing = from_vllm_metrics(METRICS)
    assert timing == EngineTiming(0.010, 0.040, 0.120, "stream")
    assert outside_engine(0.2, timing) == pytest.approx(0.15)
    assert from_vllm_metrics({"mean_itl_ms": 3}) is None and from_vllm_metrics("x") is None
    assert from_vllm_metrics({"queue_time_ms": -1, "time_to_first_token_ms": True}) is None


def test_sglang_line_gives_timing_and_says_what_is_missing() -> None:
    line = {"request_parameters": json.dumps({"text": "a secret prompt"}), "queue_time": 0.02,
            "forward_entry_time": 100.0, "prefill_finished_time": 100.5, "request_finished_ts": 101.5,
            "e2e_latency": 1.6, "id": "abc"}
    timing = from_sglang_line(line)
    assert timing == EngineTiming(0.02, 0.5, 1.0, "engine-log")
    assert "secret" not in repr(timing) and missing_parts(timing) == []
    only_e2e = from_sglang_line({"e2e_latency": 1.6, "id": "abc"})
    assert only_e2e is None and missing_parts(only_e2e) == ["queue_s", "prefill_s", "decode_s"]
    partial = from_sglang_line({"queue_time": 0.1, "forward_entry_time": 100.0})
    assert partial is not None and missing_parts(partial) == ["prefill_s", "decode_s"]


@pytest.mark.parametrize("split", [1, 7, 64, 10_000])
def test_the_core_reads_the_metrics_object_from_the_usage_chunk_however_split(split: int) -> None:
    body = sse(*EVENTS)
    analyzer = StreamAnalyzer(0.0, 200, RequestSpec(stream=True, expected_tokens=2), streaming=True)
    for i in range(0, len(body), split):
        analyzer.feed(body[i:i + split], 0.3 if i else 0.2)
    result = analyzer.finish(0.5)
    assert result.ok and result.engine_timing == "stream"
    assert (result.engine_queue_s, result.engine_prefill_s, result.engine_decode_s) == (0.010, 0.040, 0.120)
    assert result.ttft_outside_engine_s == pytest.approx(result.ttft_s - 0.050)


@pytest.mark.parametrize("usage", ["require", "inject"])
async def test_records_and_histograms_carry_the_engine_clock(aiohttp_server: Any, proxy_factory: Any,
                                                              tmp_path: Path, usage: str) -> None:
    """With ``usage: inject`` the usage chunk, metrics and all, stays out of the client's stream,
    and the record still has the engine's timing."""
    async def handle(request: web.Request) -> web.StreamResponse:
        return await stream_events(request, [sse(e) for e in EVENTS])

    app = web.Application()
    app.router.add_post("/v1/completions", handle)
    server = await aiohttp_server(app)
    client = await proxy_factory(server.port, engines=[{"name": "vllm", "upstream": f"http://127.0.0.1:{server.port}",
                                                        "usage": usage}])
    body: dict[str, Any] = {"prompt": "p", "stream": True, "max_tokens": 2}
    if usage == "require":
        body["stream_options"] = {"include_usage": True}
    resp = await client.post("/vllm/v1/completions", json=body)
    got = await resp.read()
    assert (b'"metrics"' in got) is (usage == "require")
    (record,) = await wait_for_records(tmp_path, 1)
    assert record["outcome"] == "success" and record["engine_timing"] == "stream"
    assert (record["engine_queue_s"], record["engine_prefill_s"], record["engine_decode_s"]) == (0.01, 0.04, 0.12)
    assert record["ttft_outside_engine_s"] == pytest.approx(record["ttft_s"] - 0.05)
    text = await (await client.get("/metrics")).text()
    for name in ("llmbench_engine_queue_seconds_count", "llmbench_engine_prefill_seconds_count",
                 "llmbench_ttft_outside_engine_seconds_count"):
        assert metric_value(text, name, engine="vllm") == 1, name
        # told once, the clock's series exist at zero for every other scenario of the engine too,
        # so that a later round shorter than a scrape interval is counted whole
        for scenario in ("short-c1", "short-c32"):
            assert f'{name}{{engine="vllm",scenario="{scenario}"}} 0.0' in text, (name, scenario)
