"""Real bench clients' habits through the proxy (issue 12 items 1 and 2, SPEC sections 2, 4, 13).

* GuideLLM closes its connection as soon as it reads ``data: [DONE]``, and checks
  ``GET <base>/health`` first.
* SGLang's ``bench_serving`` asks for no usage and crashes on a usage-only chunk; vLLM's
  bench client asks for usage (``stream_options.include_usage``).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.helpers import metric_value, read_records, wait_for_records
from tests.transcripts import sse

TEXT = '{"id":"c","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"%s","logprobs":null,"finish_reason":null}]}'
CHAT = '{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":null}]}'
USAGE = '{"id":"c","object":"%s","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":7,"total_tokens":10,"completion_tokens":3}}'


def _engine_body(chat: bool, with_usage: bool, words: tuple[str, ...] = ("a", "b", "c")) -> tuple[bytes, bytes]:
    """(the engine's stream, the same without its usage-only event)."""
    events = [(CHAT if chat else TEXT) % w for w in words]
    usage = [USAGE % ("chat.completion.chunk" if chat else "text_completion")] if with_usage else []
    return sse(*events, *usage, "[DONE]"), sse(*events, "[DONE]")


class Engine:
    """An engine that sends usage only when the request asks for it, as vLLM and SGLang do."""

    def __init__(self, linger_s: float = 0.0, words: tuple[str, ...] = ("a", "b", "c"),
                 hold: asyncio.Event | None = None) -> None:
        self.linger_s = linger_s  # the stream stays open this long after [DONE]
        self.words = words
        self.hold = hold  # set: the rest of the stream follows the first event only once it is set
        self.sent: list[bytes] = []
        self.requests: list[dict[str, Any]] = []

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/health":
            return web.Response(text="")
        doc = await request.json()
        self.requests.append(doc)
        asked = (doc.get("stream_options") or {}).get("include_usage") is True
        body, _ = _engine_body(request.path.endswith("chat/completions"), asked, self.words)
        self.sent.append(body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, event in enumerate(body.split(b"\n\n")[:-1]):
            if i == 1 and self.hold is not None:
                await self.hold.wait()
                return resp  # the proxy has gone: nothing more to send
            await resp.write(event + b"\n\n")
            await asyncio.sleep(0.002)
        await asyncio.sleep(self.linger_s)
        await resp.write_eof()
        return resp


async def _read_until_done_then_hang_up(client: Any, path: str, req: dict[str, Any],
                                        request_id: str = "r") -> tuple[bytes, float]:
    """The bytes read, and the wall-clock time when the read that completed [DONE] returned."""
    resp = await client.post(path, json=req, headers={"X-Request-Id": request_id})
    got, done_read_at = b"", float("nan")
    while b"data: [DONE]\n\n" not in got:
        chunk = await resp.content.readany()
        done_read_at = time.time()
        if not chunk:
            break
        got += chunk
    resp.close()  # as GuideLLM: gone as soon as [DONE] was read
    return got, done_read_at


@pytest.mark.parametrize("words,reason", [(("a", "b", "c"), None), (("", "", ""), "empty_text")])
async def test_hang_up_after_done_is_judged_on_the_stream(upstream, proxy_factory, tmp_path: Path,
                                                          words: tuple[str, ...], reason: str | None) -> None:
    up, server = upstream
    up.handler = Engine(linger_s=2.0, words=words)  # the upstream's stream stays open after [DONE]
    client = await proxy_factory(server.port)
    req = {"prompt": "x", "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    reps = 40

    async def one(i: int) -> tuple[bytes, float]:
        await asyncio.sleep(0.003 * (i % 10))  # vary where the hang-up falls
        return await _read_until_done_then_hang_up(client, "/vllm/v1/completions", req, f"r{i}")

    got = await asyncio.gather(*(one(i) for i in range(reps)))
    assert all(g.endswith(b"data: [DONE]\n\n") for g, _ in got)
    records = await wait_for_records(tmp_path, reps)
    assert len(records) == reps
    assert {(r["outcome"], r["reason"]) for r in records} == {("success" if reason is None else "failure", reason)}
    assert all(r["done"] and r["usage"] for r in records)
    # E2E ends at the proxy's read of [DONE]: before the client read it (and hung up), long before
    # the upstream's EOF; the record's times are wall-clock to the microsecond
    done_read_at = {f"r{i}": at for i, (_, at) in enumerate(got)}
    ends = {r["client_request_id"]: r["start_unix"] + r["e2e_s"] for r in records}
    assert set(ends) == set(done_read_at)
    assert all(ends[i] < done_read_at[i] + 2e-6 for i in ends), [(ends[i], done_read_at[i]) for i in ends]
    text = await (await client.get("/metrics")).text()
    assert metric_value(text, "llmbench_requests_total", outcome="client_abort") == 0
    assert metric_value(text, "llmbench_empty_text_responses_total") == (reps if reason else 0)


async def test_hang_up_before_done_is_still_a_client_abort(upstream, proxy_factory, tmp_path: Path) -> None:
    up, server = upstream
    hung_up = asyncio.Event()
    up.handler = Engine(words=tuple("abcdefghij"), hold=hung_up)  # [DONE] would come after the hang-up
    client = await proxy_factory(server.port)
    resp = await client.post("/vllm/v1/completions", json={"prompt": "x", "stream": True})
    await resp.content.readany()
    resp.close()
    rec, = await wait_for_records(tmp_path, 1)
    hung_up.set()
    assert (rec["outcome"], rec["reason"], rec["done"]) == ("client_abort", "client_abort", False)


async def test_health_reaches_the_engine_unmeasured(upstream, proxy_factory, tmp_path: Path) -> None:
    up, server = upstream
    up.handler = Engine()
    client = await proxy_factory(server.port)
    for engine in ("vllm", "sglang"):
        resp = await client.get(f"/{engine}/health")
        assert resp.status == 200
    assert [s["path"] for s in up.seen] == ["/health", "/health"]
    assert read_records(tmp_path) == []
    text = await (await client.get("/metrics")).text()
    assert metric_value(text, "llmbench_requests_total") == 0
    assert (await client.get("/nope/health")).status == 404


async def test_a_model_list_passes_through_and_a_dead_engine_is_a_502(upstream, proxy_factory) -> None:
    up, server = upstream

    async def models(request: web.Request) -> web.StreamResponse:
        return web.json_response({"object": "list", "data": [{"id": "m"}]})

    up.handler = models
    client = await proxy_factory(server.port)
    resp = await client.get("/vllm/v1/models", headers={"Authorization": "Bearer t", "Accept-Encoding": "gzip"})
    assert resp.status == 200 and resp.content_type == "application/json"
    assert await resp.json() == {"object": "list", "data": [{"id": "m"}]}
    seen = up.seen[-1]
    assert seen["path"] == "/v1/models" and seen["headers"]["Authorization"] == "Bearer t"
    assert seen["headers"]["Accept-Encoding"] == "identity"
    await server.close()  # the engine is gone
    resp = await client.get("/vllm/v1/models")
    assert resp.status == 502 and (await resp.json())["error"]["type"] == "bad_gateway"


def _events(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(e[6:]) for e in body.split(b"\n\n")[:-1] if e != b"data: [DONE]"]


CLIENTS = {  # what each bench client sends
    "sglang_bench_serving": {"stream": True, "ignore_eos": True, "max_tokens": 3},
    "vllm_bench": {"stream": True, "ignore_eos": True, "max_tokens": 3, "stream_options": {"include_usage": True}},
}


@pytest.mark.parametrize("route", ["v1/completions", "v1/chat/completions"])
@pytest.mark.parametrize("client_kind", list(CLIENTS))
async def test_usage_inject(upstream, proxy_factory, tmp_path: Path, client_kind: str, route: str) -> None:
    up, server = upstream
    engine = Engine()
    up.handler = engine
    engines = [{"name": "sglang", "upstream": f"http://127.0.0.1:{server.port}", "usage": "inject"}]
    client = await proxy_factory(server.port, engines=engines, capture_raw_sse="all")
    chat = route.endswith("chat/completions")
    req = {"model": "m", **CLIENTS[client_kind], **({"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"})}
    resp = await client.post(f"/sglang/{route}", json=req)
    got = await resp.read()
    asked = client_kind == "vllm_bench"
    upstream_body, without_usage = _engine_body(chat, with_usage=True)
    # the engine was asked for usage either way, and sent it
    assert engine.requests[0]["stream_options"]["include_usage"] is True
    assert engine.sent == [upstream_body]
    # 1. the client gets the upstream's bytes minus the usage-only event it did not ask for
    assert got == (upstream_body if asked else without_usage)
    if not asked:
        assert all(ev["choices"] for ev in _events(got))  # nothing that crashes bench_serving
    rec, = read_records(tmp_path)
    # 2. the verdict and TPOT use the server's count
    assert (rec["outcome"], rec["completion_tokens"], rec["prompt_tokens"]) == ("success", 3, 7)
    assert rec["tpot_s"] is not None and rec["tpot_s"] > 0
    # 3. the capture keeps the upstream's bytes
    assert Path(rec["capture"]).read_bytes() == upstream_body
    # 4. the record says so
    assert rec["usage_injected"] is (not asked)


async def test_usage_require_is_unchanged(upstream, proxy_factory, tmp_path: Path) -> None:
    up, server = upstream
    engine = Engine()
    up.handler = engine
    client = await proxy_factory(server.port)  # usage: require (the default)
    got = await (await client.post("/vllm/v1/completions", json=CLIENTS["sglang_bench_serving"] | {"prompt": "x"})).read()
    assert "stream_options" not in engine.requests[0]
    assert got == _engine_body(False, with_usage=False)[0]
    rec, = read_records(tmp_path)
    assert (rec["reason"], rec["usage_injected"]) == ("missing_usage", False)
