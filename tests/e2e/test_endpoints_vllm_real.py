"""A real vLLM (the CPU build, the tiny random-weight llama) behind the real proxy, on the endpoints beside
completions and chat: Responses and Messages from a generating server, embeddings and rerank from one in
pooling mode (``--runner pooling --convert embed``).  Each request gets one record with its route and a
strict verdict, and the client gets the engine's bytes.  Needs ``.ci/install-vllm.sh``; each server takes
a minute or two to start on a small machine.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from exporter.core.analysis import RequestSpec, analyze_bytes
from exporter.core.decode import DECODE_FIELDS
from exporter.proxy.records import read_capture

from tests.helpers import metric_value, read_records
from tests.vllm_engine import VllmServer, build_model, require_vllm, start_proxy

pytestmark = pytest.mark.slow

MAX_TOKENS = 8


@contextlib.contextmanager
def _served(out: Path, extra: list[str]) -> Iterator[str]:
    require_vllm()
    with contextlib.ExitStack() as stack:
        server = VllmServer(build_model(out / "model"), out / "logs", extra=extra)
        stack.callback(server.stop)
        t0 = time.monotonic()
        server.start()
        print(f"\nvLLM {' '.join(extra) or '(generate)'}: ready in {time.monotonic() - t0:.0f} s")
        proxy, proxy_url = start_proxy(out, [{"name": "vllm", "upstream": server.url}], capture_raw_sse="all")
        stack.callback(proxy.stop)
        yield proxy_url


@pytest.fixture(scope="module")
def generating(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    out = tmp_path_factory.mktemp("vllm-gen")
    with _served(out, []) as url:
        yield url, out


@pytest.fixture(scope="module")
def pooling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    out = tmp_path_factory.mktemp("vllm-pool")
    with _served(out, ["--runner", "pooling", "--convert", "embed"]) as url:
        yield url, out


def _record(out: Path, client_id: str) -> dict[str, Any]:
    for _ in range(100):
        found = [r for r in read_records(out) if r["client_request_id"] == client_id]
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"no record of {client_id}")


def _post(url: str, path: str, body: dict[str, Any], rid: str) -> requests.Response:
    return requests.post(f"{url}/vllm/{path}", json=body, headers={"X-Request-Id": rid}, timeout=300)


@pytest.mark.parametrize("stream", [True, False])
def test_responses(generating: tuple[str, Path], stream: bool) -> None:
    url, out = generating
    rid = f"responses-{stream}"
    resp = _post(url, "v1/responses", {"model": "tiny", "input": "Say something.", "stream": stream,
                                       "max_output_tokens": MAX_TOKENS, "ignore_eos": True}, rid)
    assert resp.status_code == 200, resp.text
    record = _record(out, rid)
    assert record["route"] == "/v1/responses" and record["outcome"] == "success", (record["reason"],
                                                                                    record["detail"])
    assert record["completion_tokens"] == MAX_TOKENS and record["prompt_tokens"] > 0
    if stream:
        assert b"[DONE]" not in resp.content and b"event: response." in resp.content
        assert Path(record["capture"]).read_bytes() == resp.content  # the engine's bytes
        assert record["text_events"] >= 2 and record["itl_max_s"] is not None


def test_messages(generating: tuple[str, Path]) -> None:
    url, out = generating
    resp = _post(url, "v1/messages", {"model": "tiny", "max_tokens": MAX_TOKENS, "stream": True,
                                      "messages": [{"role": "user", "content": "Say something."}]}, "messages")
    assert resp.status_code == 200, resp.text
    record = _record(out, "messages")
    assert record["route"] == "/v1/messages", record
    # vLLM's Messages request takes no ignore_eos: a random model may stop early, which is then
    # a fair length, not one the client fixed
    assert record["outcome"] == "success", (record["reason"], record["detail"])
    assert b"event: message_stop" in resp.content and b"[DONE]" not in resp.content
    assert 0 < record["completion_tokens"] <= MAX_TOKENS and record["prompt_tokens"] > 0


def test_embeddings(pooling: tuple[str, Path]) -> None:
    url, out = pooling
    resp = _post(url, "v1/embeddings", {"model": "tiny", "input": ["one text", "another", "a third"]}, "embed")
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["data"]) == 3
    record = _record(out, "embed")
    assert (record["route"], record["outcome"], record["slo_result"]) == ("/v1/embeddings", "success", None)
    metrics = requests.get(f"{url}/metrics", timeout=10).text
    assert metric_value(metrics, "llmbench_pooling_request_seconds_count", engine="vllm",
                        route="/v1/embeddings") == 1


def test_rerank(pooling: tuple[str, Path]) -> None:
    url, out = pooling
    resp = _post(url, "v1/rerank", {"model": "tiny", "query": "what is it", "documents": ["a", "b c", "d e f"],
                                    "top_n": 2}, "rerank")
    assert resp.status_code == 200, resp.text
    assert len(json.loads(resp.content)["results"]) == 2
    record = _record(out, "rerank")
    assert (record["route"], record["outcome"]) == ("/v1/rerank", "success"), (record["reason"], record["detail"])


def test_decode_fields_agree_with_what_the_client_received(generating: tuple[str, Path]) -> None:
    """The record's decode fields are the core's verdict on the captured reads at their stamps, and agree
    with the stream the client got: one text event per content chunk, its tokens from its token ids.
    (A fast engine may hand several events to one read: with fewer than two such reads the gap fields
    are null, as they must be.)"""
    url, out = generating
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Count."}], "max_tokens": 48,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
    resp = _post(url, "v1/chat/completions", body, "decode")
    assert resp.status_code == 200, resp.text
    chunks = [json.loads(line[6:]) for line in resp.text.splitlines()
              if line.startswith("data: {") and '"choices":[{' in line.replace(" ", "")]
    text = [c for c in chunks if (c["choices"][0].get("delta") or {}).get("content")]
    record = _record(out, "decode")
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
        tokens = sum(len(c["choices"][0]["token_ids"]) for c in text)
        assert record["tokens_per_event"] == pytest.approx(tokens / len(text))
        assert 0 <= record["itl_p50_s"] <= record["itl_p95_s"] <= record["itl_p99_s"] <= record["itl_max_s"]
        assert record["merged_reads"] <= record["text_events"]
