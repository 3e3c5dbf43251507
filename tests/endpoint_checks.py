"""The checks that a real engine's endpoints beside completions and chat pass through the real proxy
(tests/e2e/test_endpoints_vllm_real.py and test_endpoints_sglang_real.py): each request gets one record
with its route and a strict verdict, and the client gets the engine's bytes.  What differs between the
engines is passed in: the engine's name on the proxy, and how its rerank answer holds its results."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from exporter.core.analysis import RequestSpec, analyze_bytes
from exporter.core.decode import DECODE_FIELDS
from exporter.proxy.records import read_capture

from tests.helpers import metric_value, read_records

MAX_TOKENS = 8


def record_of(out: Path, client_id: str) -> dict[str, Any]:
    """The proxy's record of the request the client sent with ``X-Request-Id: client_id``."""
    for _ in range(100):
        found = [r for r in read_records(out) if r["client_request_id"] == client_id]
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"no record of {client_id}")


def post(url: str, engine: str, path: str, body: dict[str, Any], rid: str) -> requests.Response:
    return requests.post(f"{url}/{engine}/{path}", json=body, headers={"X-Request-Id": rid}, timeout=300)


def responses(url: str, out: Path, engine: str, stream: bool, body: dict[str, Any]) -> tuple[requests.Response,
                                                                                           dict[str, Any]]:
    """One Responses request (``body`` adds the engine's own options): its answer and record, checked."""
    rid = f"responses-{stream}"
    resp = post(url, engine, "v1/responses", {"model": "tiny", "input": "Say something.", "stream": stream,
                                              "max_output_tokens": MAX_TOKENS, **body}, rid)
    assert resp.status_code == 200, resp.text
    record = record_of(out, rid)
    assert record["route"] == "/v1/responses" and record["outcome"] == "success", (record["reason"],
                                                                                    record["detail"])
    assert 0 < record["completion_tokens"] <= MAX_TOKENS and record["prompt_tokens"] > 0
    if stream:
        assert b"[DONE]" not in resp.content and b"event: response." in resp.content
        assert Path(record["capture"]).read_bytes() == resp.content  # the engine's bytes
        assert record["text_events"] >= 2 and record["itl_max_s"] is not None
    return resp, record


def messages(url: str, out: Path, engine: str) -> None:
    """A streamed Messages request; neither engine takes ``ignore_eos`` there, so a random model may
    stop early, which is then a fair length, not one the client fixed."""
    resp = post(url, engine, "v1/messages", {"model": "tiny", "max_tokens": MAX_TOKENS, "stream": True,
                                             "messages": [{"role": "user", "content": "Say something."}]}, "messages")
    assert resp.status_code == 200, resp.text
    record = record_of(out, "messages")
    assert record["route"] == "/v1/messages", record
    assert record["outcome"] == "success", (record["reason"], record["detail"])
    assert b"event: message_stop" in resp.content and b"[DONE]" not in resp.content
    assert 0 < record["completion_tokens"] <= MAX_TOKENS and record["prompt_tokens"] > 0


def embeddings(url: str, out: Path, engine: str) -> None:
    resp = post(url, engine, "v1/embeddings", {"model": "tiny", "input": ["one text", "another", "a third"]}, "embed")
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["data"]) == 3
    record = record_of(out, "embed")
    assert (record["route"], record["outcome"], record["slo_result"]) == ("/v1/embeddings", "success", None)
    metrics = requests.get(f"{url}/metrics", timeout=10).text
    assert metric_value(metrics, "llmbench_pooling_request_seconds_count", engine=engine,
                        route="/v1/embeddings") == 1


def rerank(url: str, out: Path, engine: str, results_of: Callable[[Any], list[Any]], sizes: tuple[int, ...]) -> None:
    """A rerank of three documents, ``top_n`` 2: ``results_of`` finds the results in the engine's answer,
    whose count is one of ``sizes``."""
    resp = post(url, engine, "v1/rerank", {"model": "tiny", "query": "what is it", "documents": ["a", "b c", "d e f"],
                                           "top_n": 2}, "rerank")
    assert resp.status_code == 200, resp.text
    assert len(results_of(json.loads(resp.content))) in sizes
    record = record_of(out, "rerank")
    assert (record["route"], record["outcome"]) == ("/v1/rerank", "success"), (record["reason"], record["detail"])


def decode_fields(url: str, out: Path, engine: str, token_ids: bool) -> dict[str, Any]:
    """A streamed chat request whose record's decode fields are the core's verdict on the captured reads
    at their stamps and agree with the stream the client got (one text event per content chunk). (A fast
    engine may hand several events to one read: with fewer than two such reads the gap fields are null,
    as they must be.)  The record, and the client's text chunks under ``"text"``."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Count."}], "max_tokens": 48,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    if token_ids:
        body["return_token_ids"] = True
    resp = post(url, engine, "v1/chat/completions", body, "decode")
    assert resp.status_code == 200, resp.text
    chunks = [json.loads(line[6:]) for line in resp.text.splitlines()
              if line.startswith("data: {") and '"choices":[{' in line.replace(" ", "")]
    text = [c for c in chunks if (c["choices"][0].get("delta") or {}).get("content")]
    record = record_of(out, "decode")
    assert record["outcome"] == "success", (record["reason"], record["detail"])
    meta, captured = read_capture(Path(record["capture"]))
    again = analyze_bytes([(offset, captured[pos:pos + size]) for pos, size, offset in meta["reads"]],
                          spec=RequestSpec(stream=True, expected_tokens=48, endpoint="chat"))
    for name in DECODE_FIELDS:
        want = getattr(again, name)
        assert record[name] == (pytest.approx(want, abs=2e-6) if isinstance(want, float) else want), name
    print("decode fields:", {name: record[name] for name in DECODE_FIELDS}, "client text events:", len(text))
    assert record["ttst_s"] >= record["ttft_s"] and record["ttfo_s"] == record["ttft_s"]
    if record["text_events"] is not None:  # two or more reads carried text
        assert record["text_events"] == len(text)
        assert 0 <= record["itl_p50_s"] <= record["itl_p95_s"] <= record["itl_p99_s"] <= record["itl_max_s"]
        assert record["merged_reads"] <= record["text_events"]
    return {**record, "text": text}
