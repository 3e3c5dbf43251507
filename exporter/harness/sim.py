"""A simulated engine: vLLM's or SGLang's wire format and metrics, with a simple performance model.

Token counting is deterministic and needs no tokenizer: a prompt has one token per
whitespace-separated word (chat: words of all message contents); each output token is one
word such as ``" tok17"``.  The load driver builds prompts of exactly ``--input-tokens``
words, so the simulated usage matches the request.

Performance model (seconds, then divided by ``speed``):

* at most ``max_running`` requests decode at once; the rest wait in a queue;
* prefills run one at a time (a shared prefill lock), each ``prefill_base_s +
  prefill_per_token_s * prompt_tokens``, so long prompts at high concurrency wait a long
  time for the first token, as in the seed;
* each decode step takes ``decode_base_s + decode_per_running_s * running``.

Faults are drawn per request from a seeded RNG with the ``fault_*`` rates, or forced with
the request header ``X-Sim-Fault: NAME`` (used by tests).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["SimParams", "PROFILES", "FAULTS", "create_sim_app", "add_parser", "count_prompt_tokens"]

FAULTS = ("empty_text", "disconnect", "sse_error", "missing_usage", "missing_done",
          "http_500", "http_503", "slow_first_byte")


@dataclass(frozen=True)
class SimParams:
    profile: str = "vllm"
    model: str = "sim-model"
    max_running: int = 32
    prefill_base_s: float = 0.01
    prefill_per_token_s: float = 2.0e-5
    decode_base_s: float = 0.008
    decode_per_running_s: float = 0.00025
    kv_capacity_tokens: int = 400_000
    speed: float = 1.0
    slow_first_byte_s: float = 2.0
    seed: int = 0
    fault_empty_text: float = 0.0
    fault_disconnect: float = 0.0
    fault_sse_error: float = 0.0
    fault_missing_usage: float = 0.0
    fault_missing_done: float = 0.0
    fault_http_500: float = 0.0
    fault_http_503: float = 0.0
    fault_slow_first_byte: float = 0.0

    def rate(self, fault: str) -> float:
        return float(getattr(self, f"fault_{fault}"))


#: Profile defaults shaped like the seed: vLLM decodes faster than SGLang; both queue
#: long prefills.  Times are real seconds at speed 1.
PROFILES: dict[str, SimParams] = {
    "vllm": SimParams(profile="vllm", decode_base_s=0.008, decode_per_running_s=0.00025,
                      prefill_per_token_s=1.6e-5),
    "sglang": SimParams(profile="sglang", model="default", decode_base_s=0.010,
                        decode_per_running_s=0.0004, prefill_per_token_s=2.2e-5),
}


def count_prompt_tokens(body: dict[str, Any]) -> int:
    """The documented token count: whitespace-separated words of the prompt or messages."""
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = " ".join(p for p in prompt if isinstance(p, str))
    if isinstance(prompt, str):
        return len(prompt.split())
    n = 0
    for msg in body.get("messages") or []:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, str):
            n += len(content.split())
        elif isinstance(content, list):
            n += sum(len(p.get("text", "").split()) for p in content if isinstance(p, dict))
    return n


class _EngineMetrics:
    """The engine's own metric names (vLLM or SGLang), so the internals board works unchanged."""

    def __init__(self, profile: str, model: str, registry: CollectorRegistry) -> None:
        self.profile = profile
        self.queue_time: Histogram | None
        if profile == "vllm":
            labels: tuple[str, ...] = ("model_name", "engine")
            self._lv: tuple[str, ...] = (model, "0")
            p = "vllm:"
            self.running = Gauge(p + "num_requests_running", "Running requests.", labels, registry=registry)
            self.waiting = Gauge(p + "num_requests_waiting", "Waiting requests.", labels, registry=registry)
            self.kv = Gauge(p + "kv_cache_usage_perc", "KV-cache usage, 1 = 100 %.", labels, registry=registry)
            self.queue_time = Histogram(p + "request_queue_time_seconds", "Queue time.", labels,
                                        buckets=_LAT, registry=registry)
        else:
            labels = ("model_name",)
            self._lv = (model,)
            p = "sglang:"
            self.running = Gauge(p + "num_running_reqs", "Running requests.", labels, registry=registry)
            self.waiting = Gauge(p + "num_queue_reqs", "Queued requests.", labels, registry=registry)
            self.kv = Gauge(p + "token_usage", "KV token usage, 1 = 100 %.", labels, registry=registry)
            self.gen_throughput = Gauge(p + "gen_throughput", "Generation throughput (tok/s).", labels,
                                        registry=registry)
            self.queue_time = None
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Engine-side TTFT.", labels,
                              buckets=_LAT, registry=registry)
        self.e2e = Histogram(p + "e2e_request_latency_seconds", "Engine-side E2E latency.", labels,
                             buckets=_LAT, registry=registry)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prefilled tokens.", labels, registry=registry)
        self.gen_tokens = Counter(p + "generation_tokens", "Generated tokens.", labels, registry=registry)

    def lv(self, metric: Any) -> Any:
        return metric.labels(*self._lv)


_LAT = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)


class SimEngine:
    """The scheduler state of one simulated engine."""

    def __init__(self, params: SimParams, registry: CollectorRegistry) -> None:
        self.p = params
        self.rng = random.Random(params.seed)
        self.slots = asyncio.Semaphore(params.max_running)
        self.prefill_lock = asyncio.Lock()
        self.running = 0
        self.waiting = 0
        self.kv_tokens = 0
        self.metrics = _EngineMetrics(params.profile, params.model, registry)
        self._window: list[tuple[float, int]] = []

    def scaled(self, seconds: float) -> float:
        return seconds / self.p.speed

    def draw_fault(self, forced: str | None) -> str | None:
        if forced in FAULTS:
            return forced
        roll = self.rng.random()
        acc = 0.0
        for f in FAULTS:
            acc += self.p.rate(f)
            if roll < acc:
                return f
        return None

    def step_time(self) -> float:
        return self.scaled(self.p.decode_base_s + self.p.decode_per_running_s * self.running)

    def update_gauges(self) -> None:
        m = self.metrics
        m.lv(m.running).set(self.running)
        m.lv(m.waiting).set(self.waiting)
        m.lv(m.kv).set(min(1.0, self.kv_tokens / self.p.kv_capacity_tokens))

    def note_tokens(self, n: int) -> None:
        m = self.metrics
        m.lv(m.gen_tokens).inc(n)
        if m.profile == "sglang":
            now = time.monotonic()
            self._window.append((now, n))
            while self._window and self._window[0][0] < now - 5:
                self._window.pop(0)
            span = max(1.0, now - self._window[0][0])  # tokens over the last 1-5 s
            m.lv(m.gen_throughput).set(sum(k for _, k in self._window) / span)


SIM = web.AppKey("sim", SimEngine)


def _now() -> int:
    return int(time.time())


class _Wire:
    """Chunks in one engine's spelling (SPEC section 8)."""

    def __init__(self, profile: str, model: str, chat: bool) -> None:
        self.vllm = profile == "vllm"
        self.model = model
        self.chat = chat
        prefix = ("chatcmpl-" if chat else "cmpl-") if self.vllm else ""
        self.id = prefix + uuid.uuid4().hex
        self.created = _now()
        self.object = "chat.completion.chunk" if chat else "text_completion"

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        doc: dict[str, Any] = {"id": self.id, "object": self.object, "created": self.created,
                               "model": self.model, "choices": choices}
        if not self.vllm and "usage" not in extra:
            doc["usage"] = None
        doc.update(extra)
        return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"

    def _choice(self, text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        stop_key = "stop_reason" if self.vllm else "matched_stop"
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish, stop_key: None}
        if self.vllm:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {"content": text}
            if not role and text is None:
                delta = {}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        delta = {"role": "assistant" if role else None, "content": "" if role else text,
                 "reasoning_content": None, "tool_calls": None}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "matched_stop": None}

    def role(self) -> bytes:
        return self._chunk([self._choice(None, None, role=True)])

    def token(self, text: str, finish: str | None = None) -> bytes:
        return self._chunk([self._choice(text, finish)])

    def finish(self) -> bytes:
        return self._chunk([self._choice(None, "length")])

    def usage(self, prompt: int, completion: int) -> bytes:
        return self._chunk([], usage={"prompt_tokens": prompt, "total_tokens": prompt + completion,
                                      "completion_tokens": completion})

    def error(self) -> bytes:
        if self.vllm:
            err: dict[str, Any] = {"message": "Internal server error", "type": "InternalServerError",
                                   "param": None, "code": 500}
        else:
            err = {"object": "error", "message": "simulated scheduler error", "type": "BadRequestError",
                   "param": None, "code": 400}
        return b"data: " + json.dumps({"error": err}).encode() + b"\n\n"

    def document(self, text: str, prompt: int, completion: int) -> dict[str, Any]:
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                      "logprobs": None, "finish_reason": "length"}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice],
                "usage": {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                          "completion_tokens": completion}}


DONE = b"data: [DONE]\n\n"


async def _generate(request: web.Request) -> web.StreamResponse:
    sim = request.app[SIM]
    p = sim.p
    try:
        body = await request.json()
        if not isinstance(body, dict):
            raise ValueError
    except ValueError:
        return web.json_response({"object": "error", "message": "invalid JSON body", "type": "BadRequestError",
                                  "param": None, "code": 400}, status=400)
    chat = request.path.endswith("/chat/completions")
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 16
    if not isinstance(max_tokens, int) or max_tokens < 1:
        return web.json_response({"object": "error", "message": "max_tokens must be >= 1",
                                  "type": "BadRequestError", "param": None, "code": 400}, status=400)
    stream = body.get("stream") is True
    include_usage = bool((body.get("stream_options") or {}).get("include_usage")) or (not stream)
    prompt_tokens = count_prompt_tokens(body)
    fault = sim.draw_fault(request.headers.get("X-Sim-Fault"))
    if fault in ("http_500", "http_503"):
        code = 500 if fault == "http_500" else 503
        return web.json_response({"object": "error", "message": f"simulated HTTP {code}", "type": "ServerError",
                                  "param": None, "code": code}, status=code)
    wire = _Wire(p.profile, str(body.get("model") or p.model), chat)
    m = sim.metrics
    arrival = time.monotonic()
    sim.waiting += 1
    sim.update_gauges()
    try:
        await sim.slots.acquire()
    finally:
        sim.waiting -= 1
    sim.running += 1
    sim.kv_tokens += prompt_tokens + max_tokens
    sim.update_gauges()
    resp: web.StreamResponse | None = None
    try:
        queued = time.monotonic() - arrival
        if m.queue_time is not None:
            m.lv(m.queue_time).observe(queued)
        if fault == "slow_first_byte":
            await asyncio.sleep(sim.scaled(p.slow_first_byte_s))
        if stream:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                               "Cache-Control": "no-cache"})
            await resp.prepare(request)
        async with sim.prefill_lock:
            await asyncio.sleep(sim.scaled(p.prefill_base_s + p.prefill_per_token_s * prompt_tokens))
        m.lv(m.prompt_tokens).inc(prompt_tokens)
        m.lv(m.ttft).observe(time.monotonic() - arrival)
        if not stream:
            for _ in range(max_tokens):
                await asyncio.sleep(sim.step_time())
            sim.note_tokens(max_tokens)
            text = "" if fault == "empty_text" else "".join(f" tok{i}" for i in range(max_tokens))
            m.lv(m.e2e).observe(time.monotonic() - arrival)
            return web.json_response(wire.document(text, prompt_tokens, max_tokens))
        assert resp is not None
        if chat:
            await resp.write(wire.role())
        for i in range(max_tokens):
            if i:
                await asyncio.sleep(sim.step_time())
            if fault == "sse_error" and i == max_tokens // 2:
                await resp.write(wire.error())
                break
            if fault == "disconnect" and i == max_tokens // 2:
                if request.transport is not None:
                    request.transport.abort()
                return resp
            text = "" if fault == "empty_text" else f" tok{i}"
            last = i == max_tokens - 1
            finish = "length" if last and (p.profile == "vllm" or not chat) else None
            await resp.write(wire.token(text, finish))
            sim.note_tokens(1)
        else:
            if chat and p.profile == "sglang":
                await resp.write(wire.finish())
            if include_usage and fault != "missing_usage":
                await resp.write(wire.usage(prompt_tokens, max_tokens))
        if fault != "missing_done":
            await resp.write(DONE)
        m.lv(m.e2e).observe(time.monotonic() - arrival)
        await resp.write_eof()
        return resp
    finally:
        sim.running -= 1
        sim.kv_tokens -= prompt_tokens + max_tokens
        sim.slots.release()
        sim.update_gauges()


async def _models(request: web.Request) -> web.Response:
    p = request.app[SIM].p
    return web.json_response({"object": "list", "data": [
        {"id": p.model, "object": "model", "created": _now(), "owned_by": p.profile, "max_model_len": 32768}]})


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="")


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(request.app[REGISTRY]), headers={"Content-Type": CONTENT_TYPE_LATEST})


REGISTRY = web.AppKey("registry", CollectorRegistry)


def create_sim_app(params: SimParams) -> web.Application:
    app = web.Application(client_max_size=64 << 20)
    registry = CollectorRegistry()
    app[REGISTRY] = registry

    async def engine_ctx(app: web.Application) -> AsyncIterator[None]:
        app[SIM] = SimEngine(params, registry)
        app[SIM].update_gauges()
        yield

    app.cleanup_ctx.append(engine_ctx)
    app.router.add_post("/v1/completions", _generate)
    app.router.add_post("/v1/chat/completions", _generate)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    return app


def build_params(profile: str, config: str | None = None, **overrides: Any) -> SimParams:
    """Profile defaults, then a YAML file's keys, then explicit flags."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose from {sorted(PROFILES)}")
    params = PROFILES[profile]
    names = {f.name for f in fields(SimParams)} - {"profile"}
    if config:
        data = yaml.safe_load(Path(config).read_text(encoding="utf-8")) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{config}: expected a mapping")
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"{config}: unknown keys {unknown}; known: {sorted(names)}")
        params = replace(params, **data)
    params = replace(params, **{k: v for k, v in overrides.items() if v is not None and k in names})
    total = sum(params.rate(f) for f in FAULTS)
    if total > 1 or any(params.rate(f) < 0 for f in FAULTS):
        raise ValueError("fault rates must be >= 0 and add up to at most 1")
    if params.speed <= 0 or params.max_running < 1:
        raise ValueError("speed must be > 0 and max_running >= 1")
    return params


def cmd_sim(args: argparse.Namespace) -> int:
    import sys

    from exporter.proxy.config import parse_listen

    overrides = {f.name: getattr(args, f.name, None) for f in fields(SimParams) if f.name != "profile"}
    try:
        params = build_params(args.profile, args.config, **overrides)
        host, port = parse_listen(args.listen)
    except (ValueError, OSError, yaml.YAMLError) as exc:
        print(f"llm-bench-exporter sim: {exc}", file=sys.stderr)
        return 2
    web.run_app(create_sim_app(params), host=host, port=port, access_log=None, print=None)
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("sim", help="run a simulated vLLM or SGLang engine")
    p.add_argument("--profile", choices=sorted(PROFILES), required=True)
    p.add_argument("--listen", default="127.0.0.1:30001", help="HOST:PORT")
    p.add_argument("--config", help="YAML file with SimParams keys")
    for f in fields(SimParams):
        if f.name == "profile":
            continue
        flag = "--" + f.name.replace("_", "-")
        kind = type(f.default)
        p.add_argument(flag, dest=f.name, type=kind if kind in (int, float) else str, default=None,
                       help=f"default: profile's ({f.default})")
    p.set_defaults(func=cmd_sim)
