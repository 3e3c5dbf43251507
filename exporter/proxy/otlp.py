"""OTLP/HTTP export of the OpenTelemetry GenAI semantic-convention metrics.

Imported only when the config has ``otlp:`` (extra ``otel``: opentelemetry-sdk and
opentelemetry-exporter-otlp-proto-http).  Four histograms, recorded from each finished
request's record, the same verdicts as the Prometheus metrics:

========================================  ===========  ========================================
``gen_ai.server.time_to_first_token``      ``s``        successful requests only
``gen_ai.server.time_per_output_token``    ``s``        successful requests only
``gen_ai.server.request.duration``         ``s``        every request; ``error.type`` = our reason
                                                        for every outcome but success
``gen_ai.client.token.usage``              ``{token}``  every record with usage; ``gen_ai.token.type``
========================================  ===========  ========================================

Attributes: ``gen_ai.operation.name`` (``text_completion`` or ``chat``), ``gen_ai.provider.name``
(the engine name), ``gen_ai.request.model`` when the request named one.

Bucket boundaries are explicit and reach 600 s for TTFT (the convention's advice stops at 10 s;
the seed saw a TTFT P95 of 155 s): the proxy's Prometheus buckets, so both views agree.

The event loop must stay free, and the SDK's ``Histogram.record`` costs 15-20 µs of CPU a call
(attribute validation and hashing), some 80 µs a request.  So ``observe`` aggregates itself:
a bisect and a few additions per value under a lock, a few microseconds a request.  A thread
turns the cumulative state into the SDK's ``MetricsData`` every ``interval_s`` and hands it to
the SDK's OTLP/HTTP exporter (protobuf encoding, retries), off the loop.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from bisect import bisect_left
from typing import Any

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from exporter import __version__

from .config import Config
from .metrics import E2E_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS
from .state import Observer

__all__ = ["OtlpObserver", "INSTRUMENTS", "TOKEN_BUCKETS", "OPERATION", "MAX_MODELS", "MODEL_OTHER", "metrics_url"]

log = logging.getLogger("llmbench.otlp")

#: the convention's advice for gen_ai.client.token.usage
TOKEN_BUCKETS: tuple[float, ...] = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576,
                                    4194304, 16777216, 67108864)
TTFT, TPOT = "gen_ai.server.time_to_first_token", "gen_ai.server.time_per_output_token"
DURATION, TOKENS = "gen_ai.server.request.duration", "gen_ai.client.token.usage"
#: name -> (unit, description, bucket bounds)
INSTRUMENTS: dict[str, tuple[str, str, tuple[float, ...]]] = {
    TTFT: ("s", "Time to the first non-empty visible text, successful requests.", TTFT_BUCKETS),
    TPOT: ("s", "Per-request average time per output token, successful requests.", TPOT_BUCKETS),
    DURATION: ("s", "Request duration to the end of the stream; error.type on every outcome but success.",
               E2E_BUCKETS),
    TOKENS: ("{token}", "Tokens per request from the server's usage (input and output).", TOKEN_BUCKETS),
}
#: record route -> gen_ai.operation.name
OPERATION = {"/v1/completions": "text_completion", "/v1/chat/completions": "chat"}
#: distinct gen_ai.request.model values kept; later ones, and longer than 128 characters, become _OTHER
MAX_MODELS = 64
MODEL_OTHER = "_OTHER"
#: the final export at shutdown waits at most this long
CLOSE_TIMEOUT_S = 5.0

Attrs = tuple[tuple[str, str], ...]
_INPUT, _OUTPUT = (("gen_ai.token.type", "input"),), (("gen_ai.token.type", "output"),)


def metrics_url(endpoint: str) -> str:
    """``{endpoint}/v1/metrics`` (``endpoint`` is the OTLP/HTTP base URL)."""
    return endpoint.rstrip("/") + "/v1/metrics"


class _Stream:
    """One cumulative explicit-bucket histogram stream (bucket i holds bounds[i-1] < v <= bounds[i])."""

    __slots__ = ("counts", "total", "count", "low", "high")

    def __init__(self, nbounds: int) -> None:
        self.counts = [0] * (nbounds + 1)
        self.total = 0.0
        self.count = 0
        self.low = math.inf
        self.high = -math.inf


class OtlpObserver(Observer):
    """Aggregates each finished request into the GenAI histograms; a thread exports them."""

    def __init__(self, config: Config, exporter: MetricExporter | None = None) -> None:
        if config.otlp is None:
            raise ValueError("OtlpObserver needs the config's otlp section")
        self.exporter = exporter if exporter is not None else OTLPMetricExporter(
            endpoint=metrics_url(str(config.otlp.endpoint)))
        self.interval_s = config.otlp.interval_s
        # One resource per process: under ``serve --workers N`` each worker pushes its own
        # cumulative series, told apart by service.instance.id (host:pid), as the SDK expects.
        self.resource = Resource.create({"service.name": "llm-bench-exporter", "service.version": __version__,
                                         "service.instance.id": f"{socket.gethostname()}:{os.getpid()}"})
        self.scope = InstrumentationScope("llm-bench-exporter", __version__)
        self.start_ns = time.time_ns()
        self._lock = threading.Lock()
        self._streams: dict[tuple[str, Attrs], _Stream] = {}
        self._bases: dict[tuple[str, str, str | None], Attrs] = {}
        self._models: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llmbench-otlp", daemon=True)
        self._thread.start()

    # --- on the event loop -------------------------------------------------------------------

    def _base(self, record: dict[str, Any]) -> Attrs:
        """The shared attributes of a record, built once per (engine, route, model)."""
        model = record.get("model")
        if not isinstance(model, str) or not model:
            model = None
        elif model not in self._models:
            if len(self._models) >= MAX_MODELS or len(model) > 128:
                model = MODEL_OTHER
            else:
                self._models.add(model)
        key = (record["engine"], record["route"], model)
        attrs = self._bases.get(key)
        if attrs is None:
            attrs = (("gen_ai.operation.name", OPERATION.get(record["route"], "text_completion")),
                     ("gen_ai.provider.name", record["engine"]))
            if model is not None:
                attrs += (("gen_ai.request.model", model),)
            self._bases[key] = attrs
        return attrs

    def _add(self, name: str, attrs: Attrs, value: float | None) -> None:
        if value is None:
            return
        stream = self._streams.get((name, attrs))
        bounds = INSTRUMENTS[name][2]
        if stream is None:
            stream = self._streams[name, attrs] = _Stream(len(bounds))
        stream.counts[bisect_left(bounds, value)] += 1
        stream.total += value
        stream.count += 1
        if value < stream.low:
            stream.low = value
        if value > stream.high:
            stream.high = value

    def observe(self, record: dict[str, Any]) -> None:
        base = self._base(record)
        with self._lock:
            if record["outcome"] == "success":
                self._add(TTFT, base, record.get("ttft_s"))
                self._add(TPOT, base, record.get("tpot_s"))
                self._add(DURATION, base, record.get("e2e_s"))
            else:
                error = (("error.type", record.get("reason") or record["outcome"]),)
                self._add(DURATION, base + error, record.get("e2e_s"))
            self._add(TOKENS, base + _INPUT, record.get("prompt_tokens"))
            self._add(TOKENS, base + _OUTPUT, record.get("completion_tokens"))

    # --- on the export thread ----------------------------------------------------------------

    def snapshot(self) -> MetricsData | None:
        """The cumulative state as the SDK's data model (None before the first request)."""
        with self._lock:
            items = [(name, attrs, list(s.counts), s.total, s.count, s.low, s.high)
                     for (name, attrs), s in self._streams.items()]
        if not items:
            return None
        now = time.time_ns()
        points: dict[str, list[HistogramDataPoint]] = {}
        for name, attrs, counts, total, count, low, high in items:
            points.setdefault(name, []).append(HistogramDataPoint(
                attributes=dict(attrs), start_time_unix_nano=self.start_ns, time_unix_nano=now, count=count,
                sum=total, bucket_counts=counts, explicit_bounds=INSTRUMENTS[name][2], min=low, max=high))
        metrics = [Metric(name=name, unit=INSTRUMENTS[name][0], description=INSTRUMENTS[name][1],
                          data=Histogram(data_points=pts, aggregation_temporality=AggregationTemporality.CUMULATIVE))
                   for name, pts in points.items()]
        scope = ScopeMetrics(scope=self.scope, metrics=metrics, schema_url="")
        return MetricsData(resource_metrics=[ResourceMetrics(resource=self.resource, scope_metrics=[scope],
                                                             schema_url="")])

    def _export(self) -> None:
        data = self.snapshot()
        if data is None:
            return
        try:
            self.exporter.export(data)  # logs and retries by itself; a failure costs no request
        except Exception as exc:  # never let the thread die
            log.warning("OTLP export failed: %s", exc)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._export()
        self._export()  # the last one, at close

    def close(self) -> None:
        """Export what is left (waiting at most ``CLOSE_TIMEOUT_S``), then stop the exporter."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(CLOSE_TIMEOUT_S)
        self.exporter.shutdown()
