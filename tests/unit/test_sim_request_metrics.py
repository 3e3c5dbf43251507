"""The simulated vLLM's per-request ``metrics`` object (``sim --per-request-metrics``, as vLLM's
``--enable-per-request-metrics``): from its own simulated clock, queue time growing with the
requests ahead of it and prefill with the prompt's length, read by the proxy into the records."""

from __future__ import annotations

import asyncio
import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from exporter.cli import build_parser
from exporter.core.enginetime import from_vllm_metrics
from exporter.harness.sim import build_params, create_sim_app
from exporter.harness.sim_engine import SimParams

from tests.helpers import wait_for_records

KEYS = {"queue_time_ms", "time_to_first_token_ms", "generation_time_ms", "mean_itl_ms", "tokens_per_second"}


async def _last_usage_event(resp: Any) -> dict[str, Any]:
    events = [json.loads(line[6:]) for line in (await resp.text()).splitlines()
              if line.startswith("data: {")]
    return next(e for e in reversed(events) if e.get("usage"))


def _body(words: int, tag: str, tokens: int = 4) -> dict[str, Any]:
    return {"model": "m", "prompt": " ".join(f"{tag}{i}" for i in range(words)), "max_tokens": tokens,
            "stream": True, "stream_options": {"include_usage": True}}


async def test_queue_grows_with_the_requests_ahead_and_prefill_with_the_prompt(aiohttp_client: Any) -> None:
    params = build_params("vllm", per_request_metrics=True, max_running=1, prefill_base_s=0.0,
                          prefill_per_token_s=0.0004, decode_base_s=0.004, decode_per_running_s=0.0)
    client = await aiohttp_client(create_sim_app(params))

    async def one(words: int, tag: str) -> dict[str, Any]:
        event = await _last_usage_event(await client.post("/v1/completions", json=_body(words, tag)))
        assert set(event["metrics"]) == KEYS and event["usage"]["completion_tokens"] == 4
        return dict(event["metrics"])

    crowd = await asyncio.gather(*(one(20, f"c{i}-") for i in range(4)))  # one slot: each waits for those ahead
    queues = sorted(m["queue_time_ms"] for m in crowd)
    served_ms = min(m["time_to_first_token_ms"] + m["generation_time_ms"] for m in crowd)
    assert queues[0] < queues[-1] and queues[-1] >= 2 * served_ms
    short, long = await one(10, "s-"), await one(1000, "l-")
    assert long["time_to_first_token_ms"] > 10 * short["time_to_first_token_ms"]  # 1000 words: ~400 ms
    assert long["time_to_first_token_ms"] >= 300
    timing = from_vllm_metrics(long)
    assert timing is not None and timing.queue_s is not None and timing.queue_s < 0.2
    assert long["mean_itl_ms"] == pytest.approx(long["generation_time_ms"] / 3)


@pytest.mark.parametrize(("profile", "switch"), [("vllm", False), ("sglang", True)])
async def test_no_metrics_object_unless_a_vllm_started_with_it(aiohttp_client: Any, profile: str,
                                                                switch: bool) -> None:
    client = await aiohttp_client(create_sim_app(build_params(profile, per_request_metrics=switch, speed=50.0)))
    event = await _last_usage_event(await client.post("/v1/completions", json=_body(3, "w")))
    assert "metrics" not in event


async def test_the_proxy_records_where_the_sims_ttft_went(aiohttp_server: Any, proxy_factory: Any,
                                                          tmp_path: Path) -> None:
    """The client asks for no usage: the proxy injects it, and the metrics object comes with it."""
    sim = await aiohttp_server(create_sim_app(build_params("vllm", per_request_metrics=True, speed=5.0)))
    client = await proxy_factory(sim.port, engines=[{"name": "vllm", "upstream": f"http://127.0.0.1:{sim.port}",
                                                     "usage": "inject"}])
    body = {"model": "m", "prompt": "a b c", "max_tokens": 3, "stream": True}
    got = await (await client.post("/vllm/v1/completions", json=body)).read()
    assert b'"metrics"' not in got
    (record,) = await wait_for_records(tmp_path, 1)
    assert record["outcome"] == "success" and record["engine_timing"] == "stream"
    assert record["engine_queue_s"] >= 0 and record["engine_prefill_s"] > 0 and record["engine_decode_s"] > 0
    assert record["engine_queue_s"] + record["engine_prefill_s"] <= record["ttft_s"]
    assert record["ttft_outside_engine_s"] == pytest.approx(
        record["ttft_s"] - record["engine_queue_s"] - record["engine_prefill_s"], abs=1e-6)


def test_the_switch_on_the_command_line() -> None:
    kinds = {f.name: type(f.default) for f in fields(SimParams)}
    assert kinds["per_request_metrics"] is bool
    on = build_parser(["sim"]).parse_args(["sim", "--profile", "vllm", "--per-request-metrics"])
    off = build_parser(["sim"]).parse_args(["sim", "--profile", "vllm"])
    assert on.per_request_metrics is True and off.per_request_metrics is None
    assert build_params("vllm", per_request_metrics=on.per_request_metrics).per_request_metrics
    assert not build_params("vllm", per_request_metrics=off.per_request_metrics).per_request_metrics
    with pytest.raises(ValueError, match="per_request_metrics"):
        build_params("vllm", per_request_metrics=1)
