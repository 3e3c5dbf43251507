"""The simulators' speculative decoding, in each engine's spelling, read by the core: several tokens an
event, vLLM's ``metrics.speculative_decoding`` on the final usage chunk, SGLang's
``sglext.spec_tokens_details`` chunk when asked ``return_spec_tokens_details``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from exporter.core.analysis import RequestSpec, Result, StreamAnalyzer
from exporter.harness.sim import build_params, create_sim_app
from exporter.harness.sim_wire import SpecCounts, spec_steps


@pytest.mark.parametrize(("n", "k", "accept", "sizes", "counts"), [
    (10, 3, 0.67, [3, 3, 3, 1], SpecCounts(4, 12, 6, 3, (1, 0, 3, 0))),
    (4, 2, 1.0, [3, 1], SpecCounts(2, 4, 2, 2, (1, 0, 1))),
    (3, 4, 0.0, [1, 1, 1], SpecCounts(3, 12, 0, 4, (3, 0, 0, 0, 0))),
    (5, 0, 0.5, [1] * 5, None),
])
def test_spec_steps(n: int, k: int, accept: float, sizes: list[int], counts: SpecCounts | None) -> None:
    got, spec = spec_steps(n, k, accept)
    assert (got, spec) == (sizes, counts)
    assert sum(got) == n


def _events(body: bytes) -> list[bytes]:
    return [e + b"\n\n" for e in body.split(b"\n\n") if e]


def _judge(body: bytes, expected: int) -> Result:
    """Each event its own read, 10 ms apart."""
    an = StreamAnalyzer(0.0, 200, RequestSpec(expected_tokens=expected), streaming=True)
    for i, event in enumerate(_events(body)):
        an.feed(event, 0.01 * (i + 1))
    return an.finish(1.0)


def _body(extra: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "prompt": "p q", "max_tokens": 10, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, **extra}


@pytest.mark.parametrize("ids", [True, False])
async def test_simulated_vllm_reports_spec_decode_on_its_usage_chunk(aiohttp_client: Any, ids: bool) -> None:
    client = await aiohttp_client(create_sim_app(build_params("vllm", spec_tokens=3, spec_accept=0.67,
                                                              speed=50.0)))
    body = await (await client.post("/v1/completions", json=_body({"return_token_ids": ids}))).read()
    last = json.loads(_events(body)[-2][6:])
    spec = last["metrics"]["speculative_decoding"]
    assert (spec["num_draft_tokens"], spec["num_accepted_draft_tokens"], spec["num_spec_steps"]) == (12, 6, 4)
    assert spec["acceptance_histogram"] == [1, 0, 3, 0] and spec["draft_acceptance_rate"] == 0.5
    assert last["metrics"]["queue_time_ms"] is None  # per-request timing stays off unless asked, as in vLLM
    r = _judge(body, 10)
    assert r.ok and (r.spec_draft_tokens, r.spec_accepted_tokens) == (12, 6)
    assert r.text_events == 4
    assert r.itl_gaps is not None
    # ids: each arrival's own token count (3, 3, 1 after the first); else 10 tokens spread evenly over the
    # 4 events (2, 3, 2, 3)
    want = [0.01 / 3] * 6 + [0.01] if ids else [0.01 / 3] * 6 + [0.01 / 2] * 2
    assert [g for g, n in r.itl_gaps.pairs() for _ in range(n)] == pytest.approx(want)


@pytest.mark.parametrize("asked", [True, False])
async def test_simulated_sglang_sends_spec_details_when_asked(aiohttp_client: Any, asked: bool) -> None:
    client = await aiohttp_client(create_sim_app(build_params("sglang", spec_tokens=4, spec_accept=0.5,
                                                              speed=50.0)))
    body = await (await client.post("/v1/chat/completions", json=_body(
        {"messages": [{"role": "user", "content": "hi"}], "return_spec_tokens_details": asked}))).read()
    details = [json.loads(e[6:]) for e in _events(body) if b'"sglext"' in e]
    r = _judge(body, 10)
    assert r.ok and r.text_events == 4  # 3 tokens a step: 3, 3, 3, 1
    if not asked:
        assert details == [] and r.spec_draft_tokens is None
        return
    (doc,) = details
    assert doc["choices"] == [] and doc["usage"] is None
    assert doc["sglext"]["spec_tokens_details"] == {"spec_num_proposed_drafts": 16, "spec_num_correct_drafts": 6,
                                                     "spec_verify_ct": 4}
    assert (r.spec_draft_tokens, r.spec_accepted_tokens) == (16, 6)
