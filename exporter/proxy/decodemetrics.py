"""Decode truth's metrics: histograms of every per-token gap, the first answer token and speculative
decoding's acceptance, each observed at a successful request's end; and the decode stalls of every
finished request.

A request's per-token gaps go into ``llmbench_inter_token_latency_seconds`` in one call
(:func:`observe_weighted`): the gaps come sorted with their running token counts, so each bucket's
count is one bisection, and each touched bucket and the sum are added to once: a 4,000-token
answer costs a few dozen bisections and additions on the loop, not 4,000 ``observe`` calls.  The result is the exposition that one
``observe`` per token would give.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from exporter.core.analysis import Result
from exporter.core.decode import Gaps

__all__ = ["ITL_BUCKETS", "RATIO_BUCKETS", "DecodeMetrics", "observe_weighted"]

#: per-token gaps: 0.5 ms .. 60 s, 2.5 ms steps around the 50 ms TPOT SLO, the 0.5 s stall as a bound
ITL_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.0175, 0.02, 0.0225, 0.025, 0.0275,
    0.03, 0.0325, 0.035, 0.0375, 0.04, 0.0425, 0.045, 0.0475, 0.05, 0.055, 0.06, 0.065,
    0.07, 0.08, 0.09, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
)
#: accepted / drafted tokens of one request, 0 .. 1 in steps of 0.05
RATIO_BUCKETS: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(21))

_LABELS = ("engine", "scenario")


def observe_weighted(child: Any, bounds: tuple[float, ...], gaps: Gaps) -> None:
    """Observe every token's gap in one histogram child (``bounds``: its buckets without +Inf), as
    one ``observe`` per token would: a bisection per bound, an addition per touched bucket."""
    buckets = child._buckets  # prometheus_client keeps one value per bucket (non-cumulative) and a sum
    below = 0
    for i, bound in enumerate(bounds):
        upto = gaps.count_le(bound)  # le is inclusive: a gap on a bound is in its bucket
        if upto > below:
            buckets[i].inc(upto - below)
            below = upto
    if gaps.count > below:
        buckets[len(bounds)].inc(gaps.count - below)
    child._sum.inc(gaps.total)


class DecodeMetrics:
    """The three histograms, registered in the proxy's registry."""

    def __init__(self, registry: CollectorRegistry, ttfo_buckets: tuple[float, ...]) -> None:
        self.itl = Histogram(
            "llmbench_inter_token_latency_seconds",
            "Every per-token gap of successful streams: the gap between two visible-text arrivals shared by "
            "the later one's tokens.", _LABELS, buckets=ITL_BUCKETS, registry=registry)
        self.ttfo = Histogram(
            "llmbench_time_to_first_output_token_seconds",
            "Time to the first answer text (after any reasoning), successful chat-like streams.",
            _LABELS, buckets=ttfo_buckets, registry=registry)
        self.spec_ratio = Histogram(
            "llmbench_spec_decode_acceptance_ratio",
            "Accepted over drafted tokens of each successful request, where the engine reports them.",
            _LABELS, buckets=RATIO_BUCKETS, registry=registry)
        self.stalls = Counter(
            "llmbench_decode_stalls",
            "Gaps between two visible-text arrivals longer than the config's stall_s, every finished request.",
            _LABELS, registry=registry)

    def initialise(self, engine: str, scenario: str) -> None:
        """The counter's series at zero (the histograms are created where the scenario is timed)."""
        self.stalls.labels(engine, scenario)

    def histograms(self) -> tuple[Histogram, ...]:
        """The histograms made at start-up for every timed scenario: every stream has gaps, and every
        chat-like one a first answer token.  Speculative decoding (few engines) is made per engine when
        it first gives it (:meth:`exporter.proxy.metrics.ProxyMetrics.first_seen`)."""
        return self.itl, self.ttfo

    def count(self, engine: str, scenario: str, result: Result) -> None:
        """Any finished request's decode stalls."""
        if result.decode_stalls:
            self.stalls.labels(engine, scenario).inc(result.decode_stalls)

    def observe(self, engine: str, scenario: str, result: Result) -> None:
        """A successful request's decode figures, once, at its end."""
        if result.itl_gaps is not None:
            observe_weighted(self.itl.labels(engine, scenario), ITL_BUCKETS, result.itl_gaps)
        if result.ttfo_s is not None:
            self.ttfo.labels(engine, scenario).observe(result.ttfo_s)
        drafts, accepted = result.spec_draft_tokens, result.spec_accepted_tokens
        if drafts and accepted is not None:
            self.spec_ratio.labels(engine, scenario).observe(accepted / drafts)
