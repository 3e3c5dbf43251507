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
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from prometheus_client import CollectorRegistry

from exporter.proxy.exposition import metrics_response

from .cliutil import HelpFormatter, UserError, bind_listen, fail, finite_float
from .sim_engine import FAULTS, PROFILES, SimEngine, SimParams
from .sim_identity import add_identity_routes
from .sim_wire import DONE, Wire

__all__ = ["SimParams", "PROFILES", "FAULTS", "create_sim_app", "add_parser", "count_prompt_tokens"]

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


SIM = web.AppKey("sim", SimEngine)


def _error(message: str, code: int, kind: str = "BadRequestError") -> web.Response:
    return web.json_response({"object": "error", "message": message, "type": kind, "param": None, "code": code},
                             status=code)


@dataclass
class _Job:
    """One request as the simulated scheduler sees it."""

    chat: bool
    stream: bool
    include_usage: bool
    max_tokens: int
    prompt_tokens: int
    fault: str | None
    wire: Wire
    arrival: float


async def _parse(request: web.Request, sim: SimEngine) -> _Job | web.Response:
    try:
        body = await request.json()
        if not isinstance(body, dict):
            raise ValueError
    except ValueError:
        return _error("invalid JSON body", 400)
    chat = request.path.endswith("/chat/completions")
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 16
    if not isinstance(max_tokens, int) or max_tokens < 1:
        return _error("max_tokens must be >= 1", 400)
    stream = body.get("stream") is True
    fault = sim.draw_fault(request.headers.get("X-Sim-Fault"))
    if fault in ("http_500", "http_503"):
        code = 500 if fault == "http_500" else 503
        return _error(f"simulated HTTP {code}", code, "ServerError")
    return _Job(chat=chat, stream=stream, max_tokens=max_tokens, prompt_tokens=count_prompt_tokens(body),
                include_usage=bool((body.get("stream_options") or {}).get("include_usage")) or not stream,
                fault=fault, wire=Wire(sim.p.profile, str(body.get("model") or sim.p.model), chat),
                arrival=time.monotonic())


async def _prefill(sim: SimEngine, job: _Job) -> None:
    """Prefills run one at a time (the shared lock), then the engine's TTFT is observed."""
    m, p = sim.metrics, sim.p
    async with sim.prefill_lock:
        await asyncio.sleep(sim.scaled(p.prefill_base_s + p.prefill_per_token_s * job.prompt_tokens))
    m.lv(m.prompt_tokens).inc(job.prompt_tokens)
    m.lv(m.ttft).observe(time.monotonic() - job.arrival)


async def _whole(sim: SimEngine, job: _Job) -> web.Response:
    """A non-streaming answer: every decode step, then one JSON document."""
    for _ in range(job.max_tokens):
        await asyncio.sleep(sim.step_time())
    sim.note_tokens(job.max_tokens)
    text = "" if job.fault == "empty_text" else "".join(f" tok{i}" for i in range(job.max_tokens))
    sim.metrics.lv(sim.metrics.e2e).observe(time.monotonic() - job.arrival)
    return web.json_response(job.wire.document(text, job.prompt_tokens, job.max_tokens))


async def _stream(request: web.Request, resp: web.StreamResponse, sim: SimEngine, job: _Job) -> None:
    """The token events, then finish/usage/[DONE] as the profile spells them, with the job's fault."""
    wire, n, fault, vllm = job.wire, job.max_tokens, job.fault, sim.p.profile == "vllm"
    if job.chat:
        await resp.write(wire.role())
    for i in range(n):
        if i:
            await asyncio.sleep(sim.step_time())
        if fault == "sse_error" and i == n // 2:
            await resp.write(wire.error())
            break
        if fault == "disconnect" and i == n // 2:
            if request.transport is not None:
                request.transport.abort()
            return
        finish = "length" if i == n - 1 and (vllm or not job.chat) else None
        await resp.write(wire.token("" if fault == "empty_text" else f" tok{i}", finish))
        sim.note_tokens(1)
    else:
        if job.chat and not vllm:
            await resp.write(wire.finish())
        if job.include_usage and fault != "missing_usage":
            await resp.write(wire.usage(job.prompt_tokens, n))
    if fault != "missing_done":
        await resp.write(DONE)
    sim.metrics.lv(sim.metrics.e2e).observe(time.monotonic() - job.arrival)
    await resp.write_eof()


async def _generate(request: web.Request) -> web.StreamResponse:
    sim = request.app[SIM]
    job = await _parse(request, sim)
    if isinstance(job, web.Response):
        return job
    sim.waiting += 1
    sim.update_gauges()
    try:
        await sim.slots.acquire()
    finally:
        sim.waiting -= 1
    sim.running += 1
    sim.kv_tokens += job.prompt_tokens + job.max_tokens
    sim.update_gauges()
    try:
        m = sim.metrics
        if m.queue_time is not None:
            m.lv(m.queue_time).observe(time.monotonic() - job.arrival)
        if job.fault == "slow_first_byte":
            await asyncio.sleep(sim.scaled(sim.p.slow_first_byte_s))
        if not job.stream:
            await _prefill(sim, job)
            return await _whole(sim, job)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        await _prefill(sim, job)
        try:
            await _stream(request, resp, sim, job)
        except ConnectionResetError:  # the client hung up: as an engine, stop generating, no traceback
            sim.hangups += 1
        return resp
    finally:
        sim.running -= 1
        sim.kv_tokens -= job.prompt_tokens + job.max_tokens
        sim.slots.release()
        sim.update_gauges()


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="")


async def _metrics(request: web.Request) -> web.Response:
    return await metrics_response(request, request.app[REGISTRY])  # text or OpenMetrics, gzip when asked


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
    add_identity_routes(app, params)  # /v1/models and the profile's own identity routes
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    return app


#: What each SimParams field means, with its unit (the --help text).
_HELP = {
    "model": "model name in answers and /v1/models",
    "max_running": "requests decoding at once; the rest queue",
    "prefill_base_s": "seconds of each prefill",
    "prefill_per_token_s": "seconds per prompt token of each prefill",
    "decode_base_s": "seconds of each decode step",
    "decode_per_running_s": "seconds added to each decode step per running request",
    "kv_capacity_tokens": "tokens of KV cache (the usage gauge's 100 %%)",
    "speed": "divides every time: 2 runs twice as fast",
    "slow_first_byte_s": "seconds of the slow_first_byte fault's delay",
    "seed": "seed of the fault draws",
}


def _check_types(data: dict[str, Any], source: str) -> None:
    """Each value has its field's type (a whole number for counts, a finite number for times)."""
    for f in fields(SimParams):
        if f.name not in data:
            continue
        v, kind = data[f.name], type(f.default)
        ok = isinstance(v, kind) and not isinstance(v, bool)
        if kind is float:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not ok:
            raise ValueError(f"{source}{f.name}: expected {'a finite number' if kind is float else kind.__name__}, "
                             f"got {v!r}")


def _read_config(config: str, names: set[str]) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(config).read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise ValueError(f"--config {config}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"--config {config}: not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{config}: expected a mapping")
    unknown = sorted(set(map(str, data)) - names)
    if unknown:
        raise ValueError(f"{config}: unknown keys {unknown}; known: {sorted(names)}")
    _check_types(data, f"{config}: ")
    return data


def build_params(profile: str, config: str | None = None, **overrides: Any) -> SimParams:
    """Profile defaults, then a YAML file's keys, then explicit flags."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose from {sorted(PROFILES)}")
    params = PROFILES[profile]
    names = {f.name for f in fields(SimParams)} - {"profile"}
    if config:
        params = replace(params, **_read_config(config, names))
    flags = {k: v for k, v in overrides.items() if v is not None and k in names}
    _check_types(flags, "--")
    params = replace(params, **flags)
    total = sum(params.rate(f) for f in FAULTS)
    if total > 1 or any(params.rate(f) < 0 for f in FAULTS):
        raise ValueError("fault rates must be >= 0 and add up to at most 1")
    if params.speed <= 0 or params.max_running < 1:
        raise ValueError("speed must be > 0 and max_running >= 1")
    return params


def cmd_sim(args: argparse.Namespace) -> int:
    from exporter.proxy.config import parse_listen

    overrides = {f.name: getattr(args, f.name, None) for f in fields(SimParams) if f.name != "profile"}
    try:
        params = build_params(args.profile, args.config, **overrides)
        host, port = parse_listen(args.listen)
        sock = bind_listen(host, port)
    except (ValueError, UserError) as exc:
        return fail("sim", exc)
    web.run_app(create_sim_app(params), sock=sock, access_log=None, print=None)
    return 0


def _field_help(name: str) -> str:
    if name.startswith("fault_"):
        what = f"probability that a request gets the {name[6:]} fault, 0..1"
    else:
        what = _HELP[name]
    values = {prof: getattr(params, name) for prof, params in sorted(PROFILES.items())}
    shown = ", ".join(f"{prof} {v}" for prof, v in values.items()) if len(set(values.values())) > 1 \
        else str(next(iter(values.values())))
    return f"{what} (default: {shown})"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("sim", help="run a simulated vLLM or SGLang engine", formatter_class=HelpFormatter,
                       usage="%(prog)s --profile {sglang,vllm} [--listen HOST:PORT] [--config FILE] [options]",
                       description="A simulated engine with the real engine's wire format and /metrics. Its "
                                   "performance model and faults are set by the options below, a --config "
                                   "file of the same keys, or the profile's defaults.")
    p.add_argument("--profile", choices=sorted(PROFILES), required=True, help="engine to simulate (required)")
    p.add_argument("--listen", default="127.0.0.1:30001", help="HOST:PORT to serve on")
    p.add_argument("--config", help="YAML file with SimParams keys (default: none)")
    for f in fields(SimParams):
        if f.name == "profile":
            continue
        kind = type(f.default)
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None, help=_field_help(f.name),
                       type=(finite_float if kind is float else kind))
    p.set_defaults(func=cmd_sim)
