"""The proxy's Prometheus metrics, held in a registry of their own.

Bucket bounds (seconds) are explicit so that reports can quote them:

* TTFT: 1 ms .. 600 s, about 10-25 % apart, with 3 s (the TTFT SLO) as a bound and
  dense steps near the seed's figures (sub-second short prompts, 100-160 s for 24K C32).
  Linear interpolation inside a bucket then keeps a histogram P95 within a few per cent
  of the exact P95 in those ranges (``evidence summarize --prometheus`` reports the error).
* TPOT: 2.5 ms .. 2 s with 2.5 ms steps around the 50 ms SLO (a bound).
* E2E: the TTFT bounds, then on to 1 h.

Every series of a configured engine and scenario exists from start-up at zero
(:meth:`ProxyMetrics.initialise`), so windowed deltas also count a scenario's first requests;
``/metrics`` shows a scenario's series once it is used or announced (:mod:`exporter.proxy.shown`).
Histograms of what few engines give are the exception that keeps ``/metrics`` small: the engine's
own clock (queue, prefill, the rest of TTFT: vLLM with ``--enable-per-request-metrics``) and
speculative decoding's acceptance are made at zero for all of an engine's scenarios when that engine
first gives them (:meth:`ProxyMetrics.first_seen`).  The price: what the engine gives before the next
scrape after that first request is in the totals from then on, but not in a window's rates (a
Prometheus series counts from its first sample).

With ``serve --workers N`` the values live in prometheus_client's multiprocess files and the
supervisor renders them merged (:mod:`exporter.proxy.workers`): counters and histograms add
up, ``llmbench_requests_in_flight`` is the live workers' sum, the loop-lag histogram gets a
``worker`` label, and ``llmbench_scenario_info`` is rendered by the supervisor from the
shared scenario state (the workers' copy stays local, see :class:`LocalGauge`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from exporter.core.analysis import REASONS, Result
from exporter.core.slo import SLO_RESULTS

from .config import Config
from .decodemetrics import DecodeMetrics
from .looplag import LAG_BUCKETS

__all__ = ["TTFT_BUCKETS", "TPOT_BUCKETS", "E2E_BUCKETS", "BACKPRESSURE_BUCKETS", "PROXY_ADDED_BUCKETS",
           "ProxyMetrics", "LocalGauge", "EngineCollector", "ProxyInfoCollector"]

TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075,
    0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0,
    2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.5, 9.0, 10.0, 12.5, 15.0, 17.5, 20.0, 25.0, 30.0, 35.0,
    40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 110.0, 120.0, 135.0, 150.0, 165.0, 180.0,
    210.0, 240.0, 300.0, 360.0, 420.0, 480.0, 600.0,
)
TPOT_BUCKETS: tuple[float, ...] = (
    0.0025, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.0175, 0.02, 0.0225, 0.025, 0.0275,
    0.03, 0.0325, 0.035, 0.0375, 0.04, 0.0425, 0.045, 0.0475, 0.05, 0.055, 0.06, 0.065,
    0.07, 0.08, 0.09, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 2.0,
)
E2E_BUCKETS: tuple[float, ...] = TTFT_BUCKETS + (720.0, 900.0, 1200.0, 1800.0, 2400.0, 3600.0)
#: client back-pressure: 0 (the usual case) up to the longest E2E
BACKPRESSURE_BUCKETS: tuple[float, ...] = (0.0, 0.001, 0.01, 0.1, 1.0, 10.0, 60.0, 600.0)
#: what the proxy added to a client's TTFT: 50 us (a quiet loop) to 1 s (a loop that lagged)
PROXY_ADDED_BUCKETS: tuple[float, ...] = (
    0.00005, 0.0001, 0.00015, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005,
    0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0,
)

_LABELS = ("engine", "scenario")

# ``*_created`` series double the series count and no board or rule reads them.
disable_created_metrics()


class _LocalChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = float(value)

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount


class LocalGauge:
    """A labelled gauge kept in this process only (never in the multiprocess files): a
    worker's copy of state that the supervisor renders once for all workers."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.children: dict[tuple[str, ...], _LocalChild] = {}

    def labels(self, *values: Any) -> _LocalChild:
        key = tuple(str(v) for v in values)
        child = self.children.get(key)
        if child is None:
            child = self.children[key] = _LocalChild()
        return child

    def remove(self, *values: Any) -> None:
        self.children.pop(tuple(str(v) for v in values), None)

    def clear(self) -> None:
        self.children.clear()


class EngineCollector(Collector):
    """``llmbench_engine_up`` (1 while the engine answers the proxy's health probe, else 0) and
    ``llmbench_engine_info`` (1; labels engine, kind, version, model: what it said it is), read
    from the engine watch (:mod:`exporter.proxy.engines`) at each scrape.  The watch runs once per
    proxy (in ``serve``'s supervisor, whatever ``--workers``), so these two live in the registry
    that process renders, never in the workers' multiprocess files: a worker's copy would be
    merged per process, and a label set that changed (a new version) would linger."""

    def __init__(self, views: Callable[[], Iterable[Mapping[str, Any]]]) -> None:
        self.views = views

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily("llmbench_engine_up", "1 while the engine answers the proxy's health probe, else 0.",
                               labels=["engine"])
        info = GaugeMetricFamily("llmbench_engine_info", "The engine's identity as it reports it (always 1).",
                                 labels=["engine", "kind", "version", "model"])
        for v in self.views():
            up.add_metric([str(v["name"])], 1.0 if v["up"] else 0.0)
            if v.get("identified_at") is not None:
                info.add_metric([str(v["name"]), str(v["kind"]), str(v.get("version") or ""),
                                 str(v.get("model") or "")], 1.0)
        yield up
        yield info


class ProxyInfoCollector(Collector):
    """``llmbench_proxy_info`` (1; labels version, config_sha256, run_id): what this proxy is, so that an
    export from Prometheus alone names the proxy's version, its config file's SHA-256 and its runs.  Made
    in the process that renders /metrics (the supervisor under ``serve``), from ``proxy()``:
    ``{"version", "config_sha256", "run_id"}`` (:meth:`exporter.proxy.engines.EngineWatch.proxy`)."""

    def __init__(self, proxy: Callable[[], Mapping[str, Any]]) -> None:
        self.proxy = proxy

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        me = self.proxy()
        info = GaugeMetricFamily("llmbench_proxy_info", "The proxy's version, config file SHA-256 and run (always 1).",
                                 labels=["version", "config_sha256", "run_id"])
        info.add_metric([str(me.get(k) or "") for k in ("version", "config_sha256", "run_id")], 1.0)
        yield info


class ProxyMetrics:
    """Histograms, counters and gauges of the proxy, one instance per registry.

    ``worker``: this process's worker label when several share the port (None: one);
    ``multiprocess``: values go to prometheus_client's multiprocess files."""

    def __init__(self, registry: CollectorRegistry, config: Config, *,
                 worker: str | None = None, multiprocess: bool = False) -> None:
        self.registry = registry
        self.config = config
        self.worker = worker
        self._timed: dict[str, tuple[str, ...]] = {}  # per engine, the scenarios its histograms cover
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}  # (metric, labels) -> its child
        self._seen: set[tuple[str, str]] = set()  # (engine, family) of the histograms made on first sight
        self.ttft = Histogram(
            "llmbench_time_to_first_token_seconds",
            "Time to the first non-empty visible text, successful requests.",
            _LABELS, buckets=TTFT_BUCKETS, registry=registry,
        )
        self.tpot = Histogram(
            "llmbench_time_per_output_token_seconds",
            "Per-request average time per output token (first to last visible text).",
            _LABELS, buckets=TPOT_BUCKETS, registry=registry,
        )
        self.e2e = Histogram(
            "llmbench_e2e_request_latency_seconds",
            "Full-stream end-to-end latency of successful requests.",
            _LABELS, buckets=E2E_BUCKETS, registry=registry,
        )
        counter = functools.partial(Counter, registry=registry)
        self.requests = counter("llmbench_requests", "Finished requests by outcome and failure reason.",
                                (*_LABELS, "outcome", "reason"))
        self.empty_text = counter("llmbench_empty_text_responses",
                                  "HTTP 200 responses that ended with no visible text.", _LABELS)
        self.output_tokens = counter("llmbench_output_tokens",
                                     "Completion tokens from the server's usage, by outcome.", (*_LABELS, "outcome"))
        self.prompt_tokens = counter("llmbench_prompt_tokens", "Prompt tokens from the server's usage.", _LABELS)
        self.prompt_tokens_cached = counter(
            "llmbench_prompt_tokens_cached",
            "Prompt tokens the engine took from its prefix cache (usage.prompt_tokens_details.cached_tokens), "
            "where it reports them.", _LABELS)
        self.in_flight = Gauge(
            "llmbench_requests_in_flight", "Requests being proxied now.",
            ("engine",), registry=registry, multiprocess_mode="livesum",
        )
        self.scenario_info: Gauge | LocalGauge
        if multiprocess:
            self.scenario_info = LocalGauge("llmbench_scenario_info")
        else:
            self.scenario_info = Gauge(
                "llmbench_scenario_info", "1 while a scenario round is active.",
                ("engine", "scenario", "round"), registry=registry,
            )
        self._second_wave(registry, worker)

    def _second_wave(self, registry: CollectorRegistry, worker: str | None) -> None:
        """SLO counters and the loop-lag histogram."""
        counter = functools.partial(Counter, registry=registry)
        self.slo = counter("llmbench_slo_requests", "Successful requests judged against the SLO.",
                           (*_LABELS, "result"))
        self.goodput_tokens = counter("llmbench_goodput_tokens",
                                      "Completion tokens of successful requests that met the SLO.", _LABELS)
        lag = Histogram(
            "llmbench_proxy_event_loop_lag_seconds",
            "How late the proxy's event loop ran a ready socket callback.",
            ("worker",) if worker is not None else (), buckets=LAG_BUCKETS, registry=registry,
        )
        self.loop_lag = lag.labels(worker) if worker is not None else lag
        self._third_wave(registry)

    def _third_wave(self, registry: CollectorRegistry) -> None:
        """The proxy's error as the requests felt it; arrivals and client back-pressure."""
        self.request_uncertainty = Histogram(
            "llmbench_request_timing_uncertainty_seconds",
            "Each finished request's timing_uncertainty_s: the largest loop lag while it was in flight.",
            ("engine",), buckets=LAG_BUCKETS, registry=registry,
        )
        self.backpressure = Histogram(
            "llmbench_client_backpressure_seconds",
            "Time each request's upstream bytes waited for the client to take them (client's socket full).",
            _LABELS, buckets=BACKPRESSURE_BUCKETS, registry=registry,
        )
        self.arrivals = Counter("llmbench_arrivals", "Requests as they arrive at a measured route.", _LABELS,
                                registry=registry)
        self.proxy_added = Histogram(
            "llmbench_proxy_added_seconds",
            "What the proxy added to each request's TTFT as its client saw it: the request's hold from its "
            "arrival to t0, plus the first visible text's from its arrival to its write to the client.",
            _LABELS, buckets=PROXY_ADDED_BUCKETS, registry=registry,
        )
        self.refused = Counter("llmbench_requests_refused", "Engine requests refused unsent (503), by reason: "
                               "draining, after SIGTERM.", ("engine", "reason"), registry=registry)
        self._engine_clock(registry)

    def _engine_clock(self, registry: CollectorRegistry) -> None:
        """Where a successful request's TTFT went, by the engine's own clock (where it tells it)."""
        def histogram(name: str, what: str) -> Histogram:
            return Histogram(name, what, _LABELS, buckets=TTFT_BUCKETS, registry=registry)
        self.engine_queue = histogram("llmbench_engine_queue_seconds",
                                      "Time the engine kept each successful request queued, by its own clock.")
        self.engine_prefill = histogram("llmbench_engine_prefill_seconds",
                                        "Time from the engine scheduling each successful request to its first "
                                        "output token, by its own clock.")
        self.ttft_outside = histogram("llmbench_ttft_outside_engine_seconds",
                                      "The proxy's TTFT minus the engine's queue and prefill: HTTP, tokenizing, "
                                      "hand-offs, detokenizing, the network.")
        self.decode = DecodeMetrics(registry, TTFT_BUCKETS)  # every gap, every channel
        self.pooling = Histogram(
            "llmbench_pooling_request_seconds",
            "Embeddings and rerank requests, request sent to answer complete, successful requests (never in "
            "the generation histograms, goodput or the SLO).", (*_LABELS, "route"), buckets=TTFT_BUCKETS,
            registry=registry)

    def initialise(self, engine: str, scenarios: list[str], timed: frozenset[str] = frozenset()) -> None:
        """Create every counter and histogram series an engine can have at zero, so that
        increase(), rate() and windowed deltas also count the first event of a series (a
        lazily created series starts at its first value and loses it)."""
        self.in_flight.labels(engine).set(0)
        self.request_uncertainty.labels(engine)
        self.refused.labels(engine, "draining")
        for scenario in scenarios:
            self.requests.labels(engine, scenario, "success", "none")
            self.requests.labels(engine, scenario, "client_abort", "client_abort")
            for reason in REASONS[1:]:
                self.requests.labels(engine, scenario, "failure", reason)
            for outcome in ("success", "failure", "client_abort"):
                self.output_tokens.labels(engine, scenario, outcome)
            self.prompt_tokens.labels(engine, scenario)
            self.prompt_tokens_cached.labels(engine, scenario)
            self.empty_text.labels(engine, scenario)
            for result in SLO_RESULTS:
                self.slo.labels(engine, scenario, result)
            self.goodput_tokens.labels(engine, scenario)
            self.arrivals.labels(engine, scenario)
            self.backpressure.labels(engine, scenario)
            self.proxy_added.labels(engine, scenario)
            self.decode.initialise(engine, scenario)
            if scenario in timed:  # histograms are ~180 series each: only where asked
                for histogram in (self.ttft, self.tpot, self.e2e, *self.decode.histograms()):
                    histogram.labels(engine, scenario)
        self._timed[engine] = tuple(s for s in scenarios if s in timed)

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, looked up once: prometheus_client checks and converts the
        labels and takes a lock on every call (about 1.6 µs), a dozen times per finished request."""
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def first_seen(self, engine: str, family: str, histograms: tuple[Histogram, ...]) -> None:
        """``engine`` gives ``family``'s figures (its own clock, an answer after reasoning,
        speculative decoding) for the first time: their series at zero for every scenario it is
        timed in, so that a later round shorter than a scrape interval is counted whole."""
        if (engine, family) in self._seen:
            return
        self._seen.add((engine, family))
        for scenario in self._timed.get(engine, ()):
            for histogram in histograms:
                histogram.labels(engine, scenario)

    def observe_request(self, engine: str, scenario: str, result: Result, slo_verdict: str | None,
                        uncertainty_s: float, backpressure_s: float, route: str = "") -> None:
        """Count one finished request; time it only when it succeeded; ``slo_verdict`` is its
        SLO result (None unless it succeeded).  An embeddings or rerank request is counted and its
        latency goes to the pooling histogram (label ``route``), nothing else."""
        self.child(self.requests, engine, scenario, result.outcome, result.reason or "none").inc()
        if result.pooling:
            self.child(self.request_uncertainty, engine).observe(uncertainty_s)
            if result.ok and result.e2e_s is not None:
                self.child(self.pooling, engine, scenario, route).observe(result.e2e_s)
            return
        if result.completion_tokens is not None:
            self.child(self.output_tokens, engine, scenario, result.outcome).inc(result.completion_tokens)
        if result.prompt_tokens is not None:
            self.child(self.prompt_tokens, engine, scenario).inc(result.prompt_tokens)
        if result.cached_tokens:
            self.child(self.prompt_tokens_cached, engine, scenario).inc(result.cached_tokens)
        if result.empty_text_200:
            self.child(self.empty_text, engine, scenario).inc()
        self.child(self.request_uncertainty, engine).observe(uncertainty_s)
        self.child(self.backpressure, engine, scenario).observe(backpressure_s)
        self.decode.count(engine, scenario, result)
        if not result.ok:
            return
        if result.ttft_s is not None:
            self.child(self.ttft, engine, scenario).observe(result.ttft_s)
        if result.tpot_s is not None:
            self.child(self.tpot, engine, scenario).observe(result.tpot_s)
        if result.e2e_s is not None:
            self.child(self.e2e, engine, scenario).observe(result.e2e_s)
        if result.engine_timing is not None:
            self._observe_engine_clock(engine, scenario, result)
        if result.spec_draft_tokens:
            self.first_seen(engine, "spec", (self.decode.spec_ratio,))
        self.decode.observe(engine, scenario, result)
        if slo_verdict is not None:
            self.child(self.slo, engine, scenario, slo_verdict).inc()
            if slo_verdict == "met" and result.completion_tokens:
                self.child(self.goodput_tokens, engine, scenario).inc(result.completion_tokens)

    def _observe_engine_clock(self, engine: str, scenario: str, result: Result) -> None:
        self.first_seen(engine, "clock", (self.engine_queue, self.engine_prefill, self.ttft_outside))
        for histogram, value in ((self.engine_queue, result.engine_queue_s),
                                 (self.engine_prefill, result.engine_prefill_s),
                                 (self.ttft_outside, result.ttft_outside_engine_s)):
            if value is not None:
                self.child(histogram, engine, scenario).observe(max(0.0, value))
