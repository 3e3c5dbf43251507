"""A simulated engine: vLLM's or SGLang's wire format and metrics, with a simple performance model.

Token counting is deterministic and needs no tokenizer: a prompt has one token per
whitespace-separated word (chat: words of all message contents); each output token is one
word such as ``" tok17"``.  The load driver builds prompts of exactly ``--input-tokens``
words, so the simulated usage matches the request.  With ``--tokenizer PATH`` the prompt tokens are
the model's own count instead (its chat template applied to chat requests, as the engine would), so
that a replayed trace keeps its lengths.

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
from exporter.proxy.prompttokens import PromptTokenizer, TokenizerError

from .cliutil import HelpFormatter, UserError, bind_listen, fail, finite_float
from .sim_cache import prompt_words
from .sim_endpoints import add_endpoint_routes
from .sim_engine import FAULTS, PROFILES, SimEngine, SimParams
from .sim_identity import add_identity_routes
from .sim_vocab import EOS_ID, token_id
from .sim_wire import DONE, TIMING_KEYS, SpecCounts, Wire, request_metrics, spec_steps

__all__ = ["SimParams", "PROFILES", "FAULTS", "create_sim_app", "add_parser", "count_prompt_tokens"]

def count_prompt_tokens(body: dict[str, Any]) -> int:
    """The documented token count: whitespace-separated words of the prompt or messages."""
    return len(prompt_words(body))


SIM = web.AppKey("sim", SimEngine)
TOKENIZER = web.AppKey("tokenizer", PromptTokenizer)


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
    words: list[str]  # the prompt's tokens, for the prefix cache
    tool: str | None = None  # answer with a call of this function, not text (sim_cache)
    cached: int | None = None  # prompt tokens found in the prefix cache (None: no cache)
    queue_s: float = 0.0  # waiting for a slot and for the prefill, by the engine's clock
    prefill_s: float = 0.0  # scheduled to the first token
    first_token: float = 0.0  # monotonic time of the first token
    token_ids: bool = False  # the client asked for the output token ids (return_token_ids)
    spec_details: bool = False  # SGLang: the client asked return_spec_tokens_details


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
    words = prompt_words(body)
    return _Job(chat=chat, stream=stream, max_tokens=max_tokens,
                prompt_tokens=await _prompt_tokens(request.app.get(TOKENIZER), body, chat, len(words)),
                include_usage=bool((body.get("stream_options") or {}).get("include_usage")) or not stream,
                fault=fault, wire=Wire(sim.p.profile, str(body.get("model") or sim.p.model), chat),
                arrival=time.monotonic(), words=words, tool=sim.tool_call(body, chat),
                token_ids=body.get("return_token_ids") is True,
                spec_details=body.get("return_spec_tokens_details") is True)


async def _prefill(sim: SimEngine, job: _Job) -> None:
    """Prefills run one at a time (the shared lock), then the engine's TTFT is observed."""
    m, p = sim.metrics, sim.p
    waiting = time.monotonic()
    async with sim.prefill_lock:
        scheduled = time.monotonic()
        job.queue_s += scheduled - waiting  # waiting for the prefill is queueing, as the engine sees it
        if p.prefix_cache_block > 0:  # what the cache holds is not prefilled again; the answer gets cached too
            job.cached = sim.cache.serve(job.words)
            if job.tool is None:
                sim.cache.serve(job.words + [f"tok{i}" for i in range(job.max_tokens)])
        todo = job.prompt_tokens - (job.cached or 0)
        await asyncio.sleep(sim.scaled(p.prefill_base_s + p.prefill_per_token_s * todo))
    job.first_token = time.monotonic()
    job.prefill_s = job.first_token - scheduled
    if m.queue_time is not None:
        m.lv(m.queue_time).observe(job.queue_s)
    m.lv(m.prompt_tokens).inc(job.prompt_tokens)
    m.lv(m.ttft).observe(job.first_token - job.arrival)


def _request_metrics(sim: SimEngine, job: _Job, tokens: int, spec: SpecCounts | None = None) -> dict[str, Any] | None:
    """vLLM's per-request metrics object, when the simulated vLLM is started with it or decodes
    speculatively (then with ``speculative_decoding``)."""
    if sim.p.profile != "vllm" or not (sim.p.per_request_metrics or spec):
        return None
    got = request_metrics(job.queue_s, job.prefill_s, time.monotonic() - job.first_token, tokens) \
        if sim.p.per_request_metrics else dict.fromkeys(TIMING_KEYS)  # vLLM: null without per-request metrics
    return {**got, "speculative_decoding": spec.vllm()} if spec else got


async def _whole(sim: SimEngine, job: _Job) -> web.Response:
    """A non-streaming answer: every decode step, then one JSON document."""
    for _ in range(job.max_tokens):
        await asyncio.sleep(sim.step_time())
    sim.note_tokens(job.max_tokens)
    text = "" if job.fault == "empty_text" else "".join(f" tok{i}" for i in range(job.max_tokens))
    sim.metrics.lv(sim.metrics.e2e).observe(time.monotonic() - job.arrival)
    doc = job.wire.document(text, job.prompt_tokens, job.max_tokens, job.cached, job.tool)
    if job.token_ids and job.tool is None:
        ids = [EOS_ID if job.fault == "empty_text" else token_id(i) for i in range(job.max_tokens)]
        doc["choices"][0]["token_ids"] = ids
    metrics = _request_metrics(sim, job, job.max_tokens, spec_steps(job.max_tokens, sim.p.spec_tokens if job.tool is None
                                                                     else 0, sim.p.spec_accept)[1])
    return web.json_response({**doc, "metrics": metrics} if metrics else doc)


async def _stream(request: web.Request, resp: web.StreamResponse, sim: SimEngine, job: _Job) -> None:
    """The token events, then finish/usage/[DONE] as the profile spells them, with the job's fault."""
    wire, n, fault, vllm = job.wire, job.max_tokens, job.fault, sim.p.profile == "vllm"
    end = "tool_calls" if job.tool else "length"
    sizes, spec = spec_steps(n, 0 if job.tool else sim.p.spec_tokens, sim.p.spec_accept)  # tokens an event
    if job.chat:
        await resp.write(wire.role())
    first = 0  # the event's first token
    for i, size in enumerate(sizes):
        if i:
            await asyncio.sleep(sim.step_time())
        if fault in ("sse_error", "disconnect") and i == len(sizes) // 2:
            if fault == "sse_error":
                await resp.write(wire.error())
                break
            if request.transport is not None:
                request.transport.abort()
            return
        finish = end if i == len(sizes) - 1 and (vllm or not job.chat) else None
        text = "" if fault == "empty_text" else "".join(f" tok{t}" for t in range(first, first + size))
        ids = ([EOS_ID] * size if fault == "empty_text" else [token_id(t) for t in range(first, first + size)]
               ) if job.token_ids else None
        await resp.write(wire.tool(i, n, job.tool, finish) if job.tool else wire.token(text, finish, ids))
        sim.note_tokens(size)
        first += size
    else:
        if job.chat and not vllm:
            await resp.write(wire.finish(end))
        if spec is not None and not vllm and job.spec_details:
            await resp.write(wire.spec_details(spec))
        if job.include_usage and fault != "missing_usage":
            await resp.write(wire.usage(job.prompt_tokens, n, job.cached, _request_metrics(sim, job, n, spec)))
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
        job.queue_s = time.monotonic() - job.arrival  # waiting for a slot; the prefill's wait follows
        if job.fault == "slow_first_byte":  # outside the engine's clock
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


async def _prompt_tokens(tok: PromptTokenizer | None, body: dict[str, Any], chat: bool, words: int) -> int:
    """The prompt's tokens: its words, or (``--tokenizer``) the model's own count, tokenized in a thread
    (the chat template applied); words still where the tokenizer cannot tell (no chat template)."""
    if tok is None:
        return words
    ids = await asyncio.to_thread(tok.prompt_ids, body, chat)
    return words if ids is None else len(ids)


def create_sim_app(params: SimParams, tokenizer: PromptTokenizer | None = None) -> web.Application:
    app = web.Application(client_max_size=64 << 20)
    registry = CollectorRegistry()
    app[REGISTRY] = registry
    if tokenizer is not None:  # prompt tokens counted by the model's tokenizer, not as words
        app[TOKENIZER] = tokenizer

    async def engine_ctx(app: web.Application) -> AsyncIterator[None]:
        app[SIM] = SimEngine(params, registry)
        app[SIM].update_gauges()
        yield

    app.cleanup_ctx.append(engine_ctx)
    app.router.add_post("/v1/completions", _generate)
    app.router.add_post("/v1/chat/completions", _generate)
    add_endpoint_routes(app, SIM)  # Responses, Messages, embeddings, rerank (sim_endpoints)
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
    "prefix_cache_block": "tokens per prefix-cache block (0: no prefix cache, no cached_tokens in usage)",
    "tool_call_rate": "chance that a later user turn offering tools gets a tool call (the first always does)",
    "per_request_metrics": "vLLM profile: a metrics object with each usage (queue_time_ms, time_to_first_token_ms, "
                           "generation_time_ms, mean_itl_ms, tokens_per_second), as vLLM's "
                           "--enable-per-request-metrics",
    "spec_tokens": "speculative decoding: tokens drafted each step, so an event carries several tokens (0: off); "
                   "vLLM reports the counts in its metrics object, SGLang when asked return_spec_tokens_details",
    "spec_accept": "speculative decoding: share of each step's drafted tokens accepted",
}


def _check_types(data: dict[str, Any], source: str) -> None:
    """Each value has its field's type (a whole number for counts, a finite number for times)."""
    for f in fields(SimParams):
        if f.name not in data:
            continue
        v, kind = data[f.name], type(f.default)
        ok = isinstance(v, kind) and (kind is bool or not isinstance(v, bool))
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
        tokenizer = PromptTokenizer(Path(args.tokenizer)) if args.tokenizer else None
        sock = bind_listen(host, port)
    except (ValueError, UserError, TokenizerError) as exc:
        return fail("sim", exc)
    web.run_app(create_sim_app(params, tokenizer), sock=sock, access_log=None, print=None)
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
    p.add_argument("--tokenizer", metavar="PATH",
                   help="count prompt tokens with this model's tokenizer (its directory or tokenizer.json; the "
                        "chat template applied to chat requests; needs the trace extra), so that a replayed "
                        "trace keeps its lengths (default: none, one token per whitespace-separated word)")
    for f in fields(SimParams):
        if f.name == "profile":
            continue
        kind = type(f.default)
        if kind is bool:  # a switch, off by default
            p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None, action="store_true",
                           help=_field_help(f.name))
            continue
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None, help=_field_help(f.name),
                       type=(finite_float if kind is float else kind))
    p.set_defaults(func=cmd_sim)
