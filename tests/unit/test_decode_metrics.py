"""SPEC 30's histograms: the per-token gaps added once per request, TTFO, spec-decode acceptance; and
the proxy's records of them equal a re-decoding of the bytes it captured."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from exporter.core.analysis import RequestSpec, Result, analyze_bytes
from exporter.core.decode import DECODE_FIELDS, Gaps
from exporter.proxy.config import ConfigError, validate
from exporter.proxy.decodemetrics import ITL_BUCKETS, observe_weighted
from exporter.proxy.metrics import ProxyMetrics
from exporter.proxy.records import read_capture

from tests.helpers import make_config, metric_value, stream_events, wait_for_records


def _histogram(registry: CollectorRegistry) -> Histogram:
    return Histogram("h_seconds", "h", ("engine",), buckets=ITL_BUCKETS, registry=registry)


@pytest.mark.parametrize("seed", range(10))
def test_weighted_observe_exposes_what_one_observe_per_token_would(seed: int) -> None:
    rng = random.Random(seed)
    tokens = [rng.choice([0, 1, 1, 2, 7]) if seed % 2 else 1 for _ in range(50)]
    raw = [n * rng.choice([*ITL_BUCKETS, rng.random() * 2, 100.0, 0.0]) for n in tokens]
    one, bulk = CollectorRegistry(), CollectorRegistry()
    h_one, h_bulk = _histogram(one), _histogram(bulk)
    for gap, n in zip(raw, tokens):
        for _ in range(n):
            h_one.labels("e").observe(gap / n)
    gaps = Gaps.of(raw, tokens)
    assert gaps is not None
    observe_weighted(h_bulk.labels("e"), ITL_BUCKETS, gaps)
    # the sums may differ in the last bits (one multiplication against n additions)
    def lines(reg: CollectorRegistry) -> list[str]:
        return [x for x in generate_latest(reg).decode().splitlines() if "_sum" not in x]
    assert lines(bulk) == lines(one)
    assert bulk.get_sample_value("h_seconds_sum", {"engine": "e"}) == pytest.approx(
        one.get_sample_value("h_seconds_sum", {"engine": "e"}))


def _result(**fields: Any) -> Result:
    base = analyze_bytes([(0.1, b'data: {"choices":[{"text":"a"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}'
                                b"\n\ndata: [DONE]\n\n")])
    return dataclasses.replace(base, **fields)


def test_observe_request_times_decode_of_successes_and_counts_every_stall(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    metrics = ProxyMetrics(registry, make_config(tmp_path, 1))
    good = _result(itl_gaps=Gaps.of([0.02, 0.02, 0.7], [1, 3, 1]), ttfo_s=0.3, spec_draft_tokens=10,
                   spec_accepted_tokens=4, decode_stalls=1)
    assert good.ok
    metrics.observe_request("vllm", "short-c1", good, None, 0.0, 0.0)
    failed = dataclasses.replace(good, outcome="failure", reason="missing_done", decode_stalls=2)
    metrics.observe_request("vllm", "short-c1", failed, None, 0.0, 0.0)
    labels = {"engine": "vllm", "scenario": "short-c1"}
    value = registry.get_sample_value
    assert value("llmbench_inter_token_latency_seconds_count", labels) == 5
    assert value("llmbench_inter_token_latency_seconds_sum", labels) == pytest.approx(0.74)
    assert value("llmbench_inter_token_latency_seconds_bucket", {**labels, "le": "0.0075"}) == 3
    assert value("llmbench_inter_token_latency_seconds_bucket", {**labels, "le": "0.02"}) == 4
    assert value("llmbench_inter_token_latency_seconds_bucket", {**labels, "le": "0.5"}) == 4
    assert value("llmbench_time_to_first_output_token_seconds_count", labels) == 1
    assert value("llmbench_spec_decode_acceptance_ratio_count", labels) == 1
    assert value("llmbench_spec_decode_acceptance_ratio_sum", labels) == pytest.approx(0.4)
    assert value("llmbench_decode_stalls_total", labels) == 3  # every finished request's stalls


def test_stall_s_is_a_positive_top_level_key(tmp_path: Path) -> None:
    assert make_config(tmp_path, 1).stall_s == 0.5
    assert make_config(tmp_path, 1, stall_s=0.2).stall_s == 0.2
    with pytest.raises(ConfigError, match="stall_s"):
        validate({"engines": [{"name": "a", "upstream": "http://127.0.0.1:1"}], "stall_s": 0})


def _chunk(delta: dict[str, Any], **extra: Any) -> bytes:
    doc = {"id": "chatcmpl-7", "object": "chat.completion.chunk", "model": "m",
           "choices": [{"index": 0, "delta": delta, "finish_reason": None}], **extra}
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


EVENTS = [
    _chunk({"role": "assistant", "content": ""}),
    _chunk({"reasoning": "Let me"}), _chunk({"reasoning": " think"}),
    _chunk({"content": "Hello"}), _chunk({"content": " world"}), _chunk({"content": "!"}),
    b'data: {"id":"chatcmpl-7","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":3,'
    b'"completion_tokens":10,"completion_tokens_details":{"reasoning_tokens":4}},"metrics":{"speculative_decoding":'
    b'{"num_spec_steps":3,"num_draft_tokens":9,"num_accepted_draft_tokens":6}}}\n\n',
    b"data: [DONE]\n\n",
]


async def test_the_record_equals_a_re_decoding_of_its_capture(aiohttp_server: Any, aiohttp_client: Any,
                                                               tmp_path: Path) -> None:
    """However the reads came (merged or not), the record's decode fields are the core's verdict on the
    captured reads at their stamps, and the histogram holds one observation per token of a gap."""
    async def handle(request: web.Request) -> web.StreamResponse:
        return await stream_events(request, EVENTS, delay=0.01)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    server = await aiohttp_server(app)
    from exporter.proxy.app import create_app
    config = make_config(tmp_path, server.port, capture_raw_sse="all", stall_s=0.001)
    client = await aiohttp_client(create_app(config))
    resp = await client.post("/vllm/v1/chat/completions", json={"messages": [], "stream": True,
                                                                "stream_options": {"include_usage": True}})
    assert b"".join(EVENTS) == await resp.read()
    (record,) = await wait_for_records(tmp_path, 1)
    assert record["outcome"] == "success"
    meta, body = read_capture(Path(record["capture"]))
    chunks = [(offset, body[pos:pos + size]) for pos, size, offset in meta["reads"]]
    again = analyze_bytes(chunks, spec=RequestSpec(stream=True), stall_s=0.001)
    for name in DECODE_FIELDS:
        want = getattr(again, name)
        assert record[name] == (pytest.approx(want, abs=2e-6) if isinstance(want, float) else want), name
    assert record["reasoning_tokens"] == 4 and record["text_events"] == 5
    assert (record["spec_draft_tokens"], record["spec_accepted_tokens"]) == (9, 6)
    assert record["ttfo_s"] >= record["ttft_s"]
    text = await (await client.get("/metrics")).text()
    assert metric_value(text, "llmbench_inter_token_latency_seconds_count", engine="vllm") == sum(
        n for _, n in again.itl_gaps.pairs())
    assert metric_value(text, "llmbench_time_to_first_output_token_seconds_count", engine="vllm") == 1
    assert metric_value(text, "llmbench_spec_decode_acceptance_ratio_sum", engine="vllm") == pytest.approx(6 / 9)
