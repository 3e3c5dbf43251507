"""The simulated engines' other endpoints, in each engine's spelling: OpenAI Responses
(``/v1/responses``), Anthropic Messages (``/v1/messages``), embeddings and rerank.

Both engines stream Responses as ``event: TYPE`` / ``data: {"type": TYPE, ...}`` pairs ending with
``response.completed``; SGLang ends an answer capped by ``max_output_tokens`` with
``response.incomplete`` (reason ``max_output_tokens``), usage inside, as the simulator's answers
always are.  Messages: ``message_start`` (the input tokens: SGLang gives them only there),
``content_block_*``, ``message_delta`` with the output tokens, ``message_stop``; no ``[DONE]``
for either.  Rerank: vLLM answers ``{"results": [...]}`` with ``relevance_score``, SGLang a bare
list with ``score``.  Timing as the completions routes: a slot, the prefill, a decode step a token.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from .sim_engine import SimEngine

__all__ = ["add_endpoint_routes"]


def _words(value: Any) -> int:
    """Whitespace-separated words of a string, a list of strings, or message contents."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(_words(v.get("content") if isinstance(v, dict) else v) for v in value)
    return 0


def _sse(kind: str, doc: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **doc}, separators=(',', ':'))}\n\n".encode()


async def _tokens(sim: SimEngine, prompt: int, n: int) -> AsyncIterator[str]:
    """A slot, the prefill, then each token's text one decode step apart."""
    async with sim.slots:
        sim.running += 1
        try:
            await asyncio.sleep(sim.scaled(sim.p.prefill_base_s + sim.p.prefill_per_token_s * prompt))
            for i in range(n):
                if i:
                    await asyncio.sleep(sim.step_time())
                sim.note_tokens(1)
                yield f" tok{i}"
        finally:
            sim.running -= 1


def _bad(message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "BadRequestError", "code": 400}}, status=400)


async def _body(request: web.Request) -> dict[str, Any] | None:
    try:
        body = await request.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _response(sim: SimEngine, rid: str, model: str, status: str, text: str | None, prompt: int, n: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"id": rid, "object": "response", "created_at": int(time.time()), "model": model,
                           "status": status, "output": [], "usage": None}
    if text is not None:
        doc["output"] = [{"id": "msg_" + rid[5:], "type": "message", "role": "assistant", "status": "completed",
                          "content": [{"type": "output_text", "text": text, "annotations": []}]}]
        doc["usage"] = {"input_tokens": prompt, "output_tokens": n, "total_tokens": prompt + n}
    if status == "incomplete":
        doc["incomplete_details"] = {"reason": "max_output_tokens"}
    return doc


async def _responses(request: web.Request, sim: SimEngine) -> web.StreamResponse:
    body = await _body(request)
    n = body.get("max_output_tokens", 16) if body is not None else None
    if body is None or type(n) is not int or n < 1:
        return _bad("max_output_tokens must be a positive integer")
    prompt, model, rid = _words(body.get("input")), str(body.get("model") or sim.p.model), "resp_" + uuid.uuid4().hex
    end = "incomplete" if sim.p.profile == "sglang" else "completed"  # SGLang: capped by max_output_tokens
    if body.get("stream") is not True:
        text = "".join([t async for t in _tokens(sim, prompt, n)])
        return web.json_response(_response(sim, rid, model, end, text, prompt, n))
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await resp.prepare(request)
    await resp.write(_sse("response.created", {"sequence_number": 0, "response": _response(
        sim, rid, model, "in_progress", None, prompt, n)}))
    seq, parts = 1, []
    async for t in _tokens(sim, prompt, n):
        parts.append(t)
        await resp.write(_sse("response.output_text.delta", {"sequence_number": seq, "item_id": "msg_" + rid[5:],
                                                             "output_index": 0, "content_index": 0, "delta": t}))
        seq += 1
    await resp.write(_sse("response.output_text.done", {"sequence_number": seq, "item_id": "msg_" + rid[5:],
                                                        "output_index": 0, "content_index": 0, "text": "".join(parts)}))
    await resp.write(_sse(f"response.{end}", {"sequence_number": seq + 1, "response": _response(
        sim, rid, model, end, "".join(parts), prompt, n)}))
    await resp.write_eof()
    return resp


async def _messages(request: web.Request, sim: SimEngine) -> web.StreamResponse:
    body = await _body(request)
    n = body.get("max_tokens") if body is not None else None
    if body is None or type(n) is not int or n < 1:
        return _bad("max_tokens must be a positive integer")
    prompt, model, mid = _words(body.get("messages")), str(body.get("model") or sim.p.model), "msg_" + uuid.uuid4().hex
    vllm = sim.p.profile == "vllm"
    out_usage: dict[str, Any] = {"input_tokens": prompt, "output_tokens": n} if vllm else {"output_tokens": n}
    if body.get("stream") is not True:
        text = "".join([t async for t in _tokens(sim, prompt, n)])
        return web.json_response({"id": mid, "type": "message", "role": "assistant", "model": model,
                                  "content": [{"type": "text", "text": text}], "stop_reason": "max_tokens",
                                  "stop_sequence": None, "usage": {"input_tokens": prompt, "output_tokens": n}})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await resp.prepare(request)
    await resp.write(_sse("message_start", {"message": {
        "id": mid, "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": None,
        "stop_sequence": None, "usage": {"input_tokens": prompt, "output_tokens": 0}}}))
    await resp.write(_sse("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}))
    async for t in _tokens(sim, prompt, n):
        await resp.write(_sse("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": t}}))
    await resp.write(_sse("content_block_stop", {"index": 0}))
    await resp.write(_sse("message_delta", {"delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                                            "usage": out_usage}))
    await resp.write(_sse("message_stop", {}))
    await resp.write_eof()
    return resp


def _vector(i: int) -> list[float]:
    return [round(((i * 7 + k) % 11) / 11 - 0.5, 4) for k in range(8)]


async def _embeddings(request: web.Request, sim: SimEngine) -> web.Response:
    body = await _body(request)
    raw = body.get("input") if body is not None else None
    inputs = [raw] if isinstance(raw, str) or (isinstance(raw, list) and raw and all(
        type(v) is int for v in raw)) else raw
    if not isinstance(inputs, list) or not inputs:
        return _bad("input must be a string, a list of strings or token ids")
    tokens = sum(len(v) if isinstance(v, list) else _words(v) for v in inputs)
    await asyncio.sleep(sim.scaled(sim.p.prefill_base_s + sim.p.prefill_per_token_s * tokens))
    model = str(body.get("model") or sim.p.model) if body is not None else sim.p.model
    return web.json_response({"id": "embd-" + uuid.uuid4().hex, "object": "list", "created": int(time.time()),
                              "model": model,
                              "data": [{"index": i, "object": "embedding", "embedding": _vector(i)}
                                       for i in range(len(inputs))],
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}})


async def _rerank(request: web.Request, sim: SimEngine) -> web.Response:
    body = await _body(request)
    docs = body.get("documents") if body is not None else None
    if body is None or not isinstance(body.get("query"), str) or not isinstance(docs, list) or not docs:
        return _bad("query must be a string and documents a non-empty list")
    top_n = body.get("top_n")
    tokens = _words(body["query"]) * len(docs) + _words(docs)
    await asyncio.sleep(sim.scaled(sim.p.prefill_base_s + sim.p.prefill_per_token_s * tokens))
    scores = sorted(((round(1 / (2 + i), 4), i) for i in range(len(docs))), reverse=True)
    if type(top_n) is int and top_n > 0:
        scores = scores[:top_n]
    if sim.p.profile == "sglang":
        return web.json_response([{"score": s, "document": docs[i], "index": i, "meta_info": {"id": uuid.uuid4().hex}}
                                  for s, i in scores])
    return web.json_response({"id": "rerank-" + uuid.uuid4().hex, "model": str(body.get("model") or sim.p.model),
                              "usage": {"total_tokens": tokens},
                              "results": [{"index": i, "document": {"text": docs[i]}, "relevance_score": s}
                                          for s, i in scores]})


def add_endpoint_routes(app: web.Application, key: web.AppKey[SimEngine]) -> None:
    """The four routes, each finding the app's engine under ``key``."""
    for path, handler in (("/v1/responses", _responses), ("/v1/messages", _messages),
                          ("/v1/embeddings", _embeddings), ("/v1/rerank", _rerank)):
        async def route(request: web.Request, handler: Any = handler) -> web.StreamResponse:
            return await handler(request, request.app[key])
        app.router.add_post(path, route)
