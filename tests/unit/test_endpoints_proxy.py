"""The proxy forwards and measures Responses, Messages, embeddings and rerank: the engine's bytes, one
record with its route and a strict verdict; pooling latency apart from the generation histograms."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.helpers import Upstream, metric_value, stream_events, wait_for_records
from tests.unit.test_endpoints_core import MESSAGES, RESPONSES, _vectors


def _labels(text: str, name: str, **labels: str) -> float:
    return metric_value(text, name, **labels)


async def _through(aiohttp_server: Any, proxy_factory: Any, answer: web.Response | list[bytes], path: str,
                   body: dict[str, Any]) -> tuple[Any, bytes, Upstream]:
    up = Upstream()

    async def handler(request: web.Request) -> web.StreamResponse:
        if isinstance(answer, list):
            return await stream_events(request, answer)
        return answer

    up.handler = handler
    server = await aiohttp_server(up.app())
    client = await proxy_factory(server.port)
    resp = await client.post(f"/vllm/{path}", json=body, headers={"X-Bench-Scenario": "short-c1"})
    return client, await resp.read(), up


@pytest.mark.parametrize(("path", "events", "body"), [
    ("v1/responses", RESPONSES, {"input": "hi", "stream": True, "ignore_eos": True, "max_output_tokens": 3}),
    ("v1/messages", MESSAGES, {"messages": [{"role": "user", "content": "hi"}], "stream": True,
                               "ignore_eos": True, "max_tokens": 4}),
])
async def test_generation_streams_are_measured_like_chat(aiohttp_server: Any, proxy_factory: Any, tmp_path: Path,
                                                         path: str, events: list[bytes], body: dict[str, Any]) -> None:
    client, got, up = await _through(aiohttp_server, proxy_factory, events, path, body)
    assert got == b"".join(events)  # the engine's bytes
    assert b"stream_options" not in up.seen[0]["body"]  # no usage injected into these
    (record,) = await wait_for_records(tmp_path, 1)
    assert record["route"] == "/" + path and record["outcome"] == "success", record["detail"]
    assert record["expected_tokens"] == record["completion_tokens"]
    assert record["ttfo_s"] >= record["ttft_s"] > 0
    assert record["slo_result"] in ("met", "missed")
    text = await (await client.get("/metrics")).text()
    for name in ("llmbench_time_to_first_token_seconds_count", "llmbench_e2e_request_latency_seconds_count",
                 "llmbench_time_to_first_output_token_seconds_count"):
        assert _labels(text, name, engine="vllm", scenario="short-c1") == 1, name
    assert _labels(text, "llmbench_pooling_request_seconds_count", engine="vllm") == 0


async def test_a_stream_without_its_end_event_is_missing_done(aiohttp_server: Any, proxy_factory: Any,
                                                              tmp_path: Path) -> None:
    await _through(aiohttp_server, proxy_factory, MESSAGES[:-1], "v1/messages", {"messages": [], "stream": True})
    (record,) = await wait_for_records(tmp_path, 1)
    assert (record["reason"], record["detail"]) == ("missing_done", "stream ended without message_stop")


@pytest.mark.parametrize(("path", "doc", "body", "reason"), [
    ("v1/embeddings", _vectors(2), {"input": ["a", "b"]}, None),
    ("v1/embeddings", _vectors(1), {"input": ["a", "b"]}, "length_mismatch"),
    ("v1/rerank", [{"index": 1, "score": 0.9}, {"index": 0, "score": 0.1}], {"query": "q", "documents": ["a", "b"]},
     None),
    ("v1/rerank", {"results": [{"index": 0, "relevance_score": 0.9}]}, {"query": "q", "documents": ["a", "b"],
                                                                         "top_n": 1}, None),
])
async def test_pooling_is_counted_and_timed_apart(aiohttp_server: Any, proxy_factory: Any, tmp_path: Path,
                                                  path: str, doc: Any, body: dict[str, Any],
                                                  reason: str | None) -> None:
    client, got, _ = await _through(aiohttp_server, proxy_factory, web.json_response(doc), path, body)
    assert json.loads(got) == doc
    (record,) = await wait_for_records(tmp_path, 1)
    assert record["route"] == "/" + path and record["reason"] == reason
    assert record["slo_result"] is None and record["ttft_s"] is None
    text = await (await client.get("/metrics")).text()
    outcome = "success" if reason is None else "failure"
    assert _labels(text, "llmbench_requests_total", engine="vllm", outcome=outcome, reason=reason or "none") == 1
    assert _labels(text, "llmbench_pooling_request_seconds_count", engine="vllm", scenario="short-c1",
                   route="/" + path) == (1 if reason is None else 0)
    for name in ("llmbench_e2e_request_latency_seconds_count", "llmbench_slo_requests_total",
                 "llmbench_empty_text_responses_total", "llmbench_prompt_tokens_total"):
        assert _labels(text, name, engine="vllm") == 0, name


async def test_other_paths_are_still_refused(aiohttp_server: Any, proxy_factory: Any) -> None:
    up = Upstream()
    server = await aiohttp_server(up.app())
    client = await proxy_factory(server.port)
    for method, path in [("POST", "/vllm/v1/score"), ("POST", "/vllm/v1/responses/abc/cancel"),
                         ("GET", "/vllm/v1/embeddings"), ("POST", "/vllm/v1/messages/count_tokens"),
                         ("POST", "/vllm/v2/rerank"), ("POST", "/vllm/rerank")]:
        resp = await client.request(method, path, json={})
        assert resp.status in (404, 405), (method, path)
    assert up.seen == []


async def test_token_ids_are_asked_of_completions_and_chat_only(aiohttp_server: Any, proxy_factory: Any) -> None:
    up = Upstream()

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(_vectors(1))

    up.handler = handler
    server = await aiohttp_server(up.app())
    client = await proxy_factory(server.port, engines=[{"name": "vllm", "upstream": f"http://127.0.0.1:{server.port}",
                                                        "token_ids": True}])
    await client.post("/vllm/v1/embeddings", json={"input": "a"})
    await client.post("/vllm/v1/completions", json={"prompt": "a"})
    asked = [b"return_token_ids" in seen["body"] for seen in up.seen]
    assert asked == [False, True]
