"""The simulated engines answer Responses, Messages, embeddings and rerank in each engine's spelling,
and the proxy in front judges every answer a success with its route."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from exporter.harness.sim import build_params, create_sim_app

from tests.helpers import wait_for_records

FAST = {"speed": 50.0}
BODIES: dict[str, dict[str, Any]] = {
    "v1/responses": {"model": "m", "input": "say hi", "max_output_tokens": 5, "ignore_eos": True},
    "v1/messages": {"model": "m", "messages": [{"role": "user", "content": "say hi"}], "max_tokens": 5,
                    "ignore_eos": True},
    "v1/embeddings": {"model": "m", "input": ["one text", "another text", "third"]},
    "v1/rerank": {"model": "m", "query": "q", "documents": ["a", "b c", "d"], "top_n": 2},
}


@pytest.mark.parametrize("profile", ["vllm", "sglang"])
@pytest.mark.parametrize("stream", [True, False])
async def test_every_endpoint_through_the_proxy(aiohttp_server: Any, proxy_factory: Any, tmp_path: Path,
                                                profile: str, stream: bool) -> None:
    sim = await aiohttp_server(create_sim_app(build_params(profile, **FAST)))
    client = await proxy_factory(sim.port)
    answers: dict[str, bytes] = {}
    for path, body in BODIES.items():
        resp = await client.post(f"/{profile}/{path}", json={**body, "stream": stream})
        assert resp.status == 200, await resp.text()
        answers[path] = await resp.read()
    records = {r["route"]: r for r in await wait_for_records(tmp_path, len(BODIES))}
    for path in BODIES:
        r = records["/" + path]
        assert r["outcome"] == "success", (path, r["reason"], r["detail"])
        assert r["stream"] is (stream and path in ("v1/responses", "v1/messages"))
    for path in ("v1/responses", "v1/messages"):
        assert records["/" + path]["completion_tokens"] == 5 and records["/" + path]["visible_chars"] > 0
        assert (b"[DONE]" in answers[path]) is False
    if stream:
        end = b"response.incomplete" if profile == "sglang" else b"response.completed"
        assert end in answers["v1/responses"]
        assert records["/v1/responses"]["text_events"] == 5
    rerank = json.loads(answers["v1/rerank"])
    assert isinstance(rerank, list) is (profile == "sglang")
    assert len(rerank if isinstance(rerank, list) else rerank["results"]) == 2
    assert len(json.loads(answers["v1/embeddings"])["data"]) == 3


@pytest.mark.parametrize(("path", "body"), [
    ("v1/responses", {"input": "x", "max_output_tokens": 0}), ("v1/messages", {"messages": []}),
    ("v1/embeddings", {"input": []}), ("v1/rerank", {"query": "q", "documents": "no"}),
])
async def test_bad_requests_get_a_400(aiohttp_client: Any, path: str, body: dict[str, Any]) -> None:
    client = await aiohttp_client(create_sim_app(build_params("vllm", **FAST)))
    resp = await client.post("/" + path, json=body)
    assert resp.status == 400 and "error" in await resp.json()
