"""Sessions in the proxy: ``session_id`` and ``turn`` from the headers, ``cached_tokens`` from the
engine's usage, ``llmbench_prompt_tokens_cached_total``, and the bounded turn count."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from exporter.core.analysis import RequestSpec, StreamAnalyzer
from exporter.proxy.config import ConfigError, validate
from exporter.proxy.sessions import SessionTurns

from tests.helpers import OK_EVENTS, metric_value, read_records, stream_events, wait_for_records
from tests.transcripts import sse

REQ = {"prompt": "hello", "stream": True, "max_tokens": 2, "stream_options": {"include_usage": True}}


def _usage_event(prompt: int, cached: Any) -> str:
    details = "null" if cached is None else f'{{"cached_tokens":{json.dumps(cached)}}}'
    return ('{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],"usage":'
            f'{{"prompt_tokens":{prompt},"total_tokens":{prompt + 2},"completion_tokens":2,'
            f'"prompt_tokens_details":{details}}}}}')


def _body(prompt: int, cached: Any) -> bytes:
    return sse(OK_EVENTS[0], OK_EVENTS[1], _usage_event(prompt, cached), "[DONE]")


@pytest.mark.parametrize(("cached", "expected"), [(48, 48), (0, 0), (None, None), ("48", None), (-1, None),
                                                  (1.5, None), (True, None)])
def test_the_core_reads_cached_tokens_from_usage(cached: Any, expected: int | None) -> None:
    body = _body(64, cached)
    for split in (1, 9, len(body)):
        an = StreamAnalyzer(0.0, 200, RequestSpec(stream=True, expected_tokens=2), streaming=True)
        for i in range(0, len(body), split):
            an.feed(body[i:i + split], 0.1)
        result = an.finish(0.2)
        assert result.ok and result.prompt_tokens == 64
        assert result.cached_tokens == expected and result.as_dict()["cached_tokens"] == expected


def test_no_usage_no_cached_tokens() -> None:
    an = StreamAnalyzer(0.0, 200, RequestSpec(stream=True), streaming=True)
    an.feed(sse(OK_EVENTS[0], '{"choices":[],"prompt_tokens_details":{"cached_tokens":3}}', "[DONE]"), 0.1)
    assert an.finish(0.2).cached_tokens is None


def test_turns_count_per_session_and_forget_idle_ones() -> None:
    turns = SessionTurns(idle_s=10.0, max_sessions=1000)
    assert [turns.turn("a", 0.0), turns.turn("a", 1.0), turns.turn("b", 2.0), turns.turn("a", 3.0)] == [1, 2, 1, 3]
    assert turns.turn("b", 11.0) == 2  # idle 9 s: still known
    assert turns.turn("a", 13.5) == 1 and len(turns) == 2  # idle 10.5 s: forgotten, counts again
    assert turns.turn("c", 30.0) == 1 and len(turns) == 1  # every idle one dropped on the way


def test_turns_hold_at_most_max_sessions() -> None:
    turns = SessionTurns(idle_s=1e9, max_sessions=3)
    for i in range(10):
        assert turns.turn(f"s{i}", float(i)) == 1
    assert len(turns) == 3 and turns.forgotten == 7
    assert turns.turn("s9", 20.0) == 2 and turns.turn("s0", 21.0) == 1  # the oldest went first


def test_sessions_config(tmp_path: Path) -> None:
    base = {"engines": [{"name": "vllm", "upstream": "http://127.0.0.1:1"}]}
    assert validate(base).sessions.idle_s == 600 and validate(base).sessions.max == 100_000
    assert validate({**base, "sessions": {"idle_s": 5, "max": 10}}).sessions.max == 10
    for bad in ({"idle_s": 0}, {"max": 0}, {"ttl": 3}):
        with pytest.raises(ConfigError, match="sessions"):
            validate({**base, "sessions": bad})


async def test_records_carry_session_turn_and_cached_tokens(upstream: Any, proxy_factory: Any, tmp_path: Path) -> None:
    up, server = upstream
    client = await proxy_factory(server.port)
    sent = [({"X-Session-ID": "conv-1"}, 40, 0), ({"X-Session-ID": "conv-2"}, 40, 0),
            ({"X-Session-ID": "conv-1"}, 80, 32), ({"X-Correlation-ID": "conv-1"}, 120, 64),
            ({}, 10, None), ({"X-Session-ID": "bad id with spaces"}, 10, None),
            ({"X-Session-ID": "conv-1"}, 160, 112)]
    for i, (headers, prompt, cached) in enumerate(sent):
        body = _body(prompt, cached)
        up.handler = lambda r, b=body: stream_events(r, [b])
        resp = await client.post("/vllm/v1/completions", json=REQ,
                                 headers={**headers, "X-Request-Id": f"r{i}", "X-Bench-Scenario": "short-c1"})
        await resp.read()
    await wait_for_records(tmp_path, len(sent))
    recs = {r["client_request_id"]: r for r in read_records(tmp_path)}
    got = [(recs[f"r{i}"]["session_id"], recs[f"r{i}"]["turn"], recs[f"r{i}"]["cached_tokens"])
           for i in range(len(sent))]
    assert got == [("conv-1", 1, 0), ("conv-2", 1, 0), ("conv-1", 2, 32), ("conv-1", 3, 64),
                   (None, None, None), (None, None, None), ("conv-1", 4, 112)]
    assert all(r["outcome"] == "success" for r in recs.values())
    text = await (await client.get("/metrics")).text()
    assert metric_value(text, "llmbench_prompt_tokens_cached_total", engine="vllm", scenario="short-c1") == 208
    assert metric_value(text, "llmbench_prompt_tokens_total", engine="vllm", scenario="short-c1") == 460
    assert "llmbench_prompt_tokens_cached_total" in text and "conv-1" not in text  # no label carries a session


async def test_one_session_id_on_two_engines_is_two_sessions(upstream: Any, proxy_factory: Any,
                                                             tmp_path: Path) -> None:
    up, server = upstream
    client = await proxy_factory(server.port)
    for engine in ("vllm", "sglang", "vllm"):
        up.handler = lambda r: stream_events(r, [_body(8, None)])
        await (await client.post(f"/{engine}/v1/completions", json=REQ, headers={"X-Session-ID": "s"})).read()
    recs = await wait_for_records(tmp_path, 3)
    assert [(r["engine"], r["turn"]) for r in sorted(recs, key=lambda r: r["start_unix"])] == [
        ("vllm", 1), ("sglang", 1), ("vllm", 2)]
