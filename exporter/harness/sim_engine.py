"""The simulated engine's scheduler state and its own metrics (vLLM's or SGLang's names)."""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .sim_cache import PrefixCache, tool_call_wanted

__all__ = ["SimEngine", "SimParams", "PROFILES", "ThroughputWindow", "FAULTS"]

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
    prefix_cache_block: int = 16  # tokens per prefix-cache block; 0: no cache, no cached_tokens in usage
    tool_call_rate: float = 0.0  # chance of a tool call on a later user turn offering tools (sim_cache)
    per_request_metrics: bool = False  # vLLM's --enable-per-request-metrics: a metrics object with the usage
    spec_tokens: int = 0  # speculative decoding: tokens drafted a step (0: off)
    spec_accept: float = 0.6  # share of a step's drafted tokens accepted

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


class ThroughputWindow:
    """Tokens per second over the last 1-5 s (SGLang's ``gen_throughput``), in one-second
    buckets: adding is O(1), reading sums at most six buckets."""

    def __init__(self, span_s: float = 5.0) -> None:
        self.span_s = span_s
        self._buckets: deque[list[int]] = deque()  # [whole second, tokens]
        self._total = 0

    def add(self, n: int, now: float) -> None:
        second = int(now)
        if self._buckets and self._buckets[-1][0] == second:
            self._buckets[-1][1] += n
        else:
            self._buckets.append([second, n])
            self._expire(now)
        self._total += n

    def _expire(self, now: float) -> None:
        while self._buckets and self._buckets[0][0] < now - self.span_s:
            self._total -= self._buckets.popleft()[1]

    def rate(self, now: float) -> float:
        self._expire(now)
        if not self._buckets:
            return 0.0
        return self._total / max(1.0, now - self._buckets[0][0])


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
        self.hangups = 0  # streams the client left before their end
        block = params.prefix_cache_block
        self.cache = PrefixCache(block, params.kv_capacity_tokens // block if block > 0 else 0)
        self.tool_rng = random.Random(f"tools-{params.seed}")  # apart from the fault draws
        self.metrics = _EngineMetrics(params.profile, params.model, registry)
        self.window = ThroughputWindow()
        if params.profile == "sglang":  # computed when /metrics is scraped, not per token
            self.metrics.lv(self.metrics.gen_throughput).set_function(lambda: self.window.rate(time.monotonic()))

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

    def tool_call(self, body: dict[str, Any], chat: bool) -> str | None:
        """The function a chat answer calls instead of text (None: text), see :mod:`.sim_cache`."""
        return tool_call_wanted(body, self.tool_rng, self.p.tool_call_rate) if chat else None

    def step_time(self) -> float:
        return self.scaled(self.p.decode_base_s + self.p.decode_per_running_s * self.running)

    def update_gauges(self) -> None:
        m = self.metrics
        m.lv(m.running).set(self.running)
        m.lv(m.waiting).set(self.waiting)
        m.lv(m.kv).set(min(1.0, self.kv_tokens / self.p.kv_capacity_tokens))

    def note_tokens(self, n: int) -> None:
        """Count generated tokens: O(1) per call for both profiles, so neither pays for the other's
        metrics (the SGLang profile's throughput gauge reads the window only when scraped)."""
        self.metrics.lv(self.metrics.gen_tokens).inc(n)
        self.window.add(n, time.monotonic())
