"""The engines' own time series over one round, for the llm-d report's ``observability.components``:
KV-cache usage, running and waiting requests (the engine's own ``/metrics``, as Prometheus scraped
it) and, where dcgm-exporter (or the proxy's GPU collector) is scraped, GPU utilisation, power and
memory.  Every query is the boards' own (``dashboards.catalogue``'s panels ``engine_kv_cache``,
``engine_running``, ``engine_waiting``, ``gpu_util``, ``gpu_power``, ``gpu_fb_used``), the
engine's query picked by its kind (vLLM or SGLang); nothing is queried a second way.

A quantity of several series (one per GPU) is given per instant as its ``mean``, ``min`` and
``max`` over them; one series as its ``value``.  The round's window runs from its first request's
arrival to its last one's end; the step is the scrape interval (shorter for a round shorter than
two of them, so that it has at least two points).  Fields with no series are left out and named
in ``missing``, with every query used, in the report's ``observability.engine_series``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dashboards.catalogue import PANELS
from dashboards.promql import expand
from exporter.core.timefmt import iso

from .llmd_models import (
    ComponentObservability,
    ResourceMetrics,
    TimeSeriesData,
    TimeSeriesPoint,
    TimeSeriesResourceMetrics,
    Units,
    statistics_of,
)
from .promapi import MAX_POINTS, Prometheus

__all__ = ["Field", "FIELDS", "engine_series", "query_of", "step_for", "DEFAULT_SCRAPE_S"]

#: the scrape interval assumed where the backend does not serve its configuration (as ``export`` does)
DEFAULT_SCRAPE_S = 15.0


@dataclass(frozen=True)
class Field:
    """A time series of the schema: its name, the aggregate's name, the catalogue's panel, the
    unit and the factor from the panel's unit to it; ``by_kind``: the panel has a query per
    engine kind (its legend starts with the kind), else one query (the GPUs)."""

    name: str
    aggregate: str
    panel: str
    units: Units
    scale: float = 1.0
    by_kind: bool = True


FIELDS = (Field("kv_cache_usage", "kv_cache_usage", "engine_kv_cache", "percent", 100.0),  # the panel's 0..1
          Field("num_requests_running", "running_requests", "engine_running", "count"),
          Field("num_requests_waiting", "waiting_requests", "engine_waiting", "count"),
          Field("gpu_utilization", "gpu_utilization", "gpu_util", "percent", by_kind=False),
          Field("power_consumption", "power_consumption", "gpu_power", "Watts", by_kind=False),
          Field("gpu_memory_usage", "gpu_memory_usage", "gpu_fb_used", "GiB", by_kind=False))  # MiB / 1024


def query_of(field: Field, kind: str) -> str | None:
    """The catalogue's query of ``field`` for an engine of ``kind`` (None: no query for that kind)."""
    queries = PANELS[field.panel].queries
    if not field.by_kind:
        return expand(queries[0].expr)
    mine = [q for q in queries if q.legend.split(" ", 1)[0] == kind]
    return expand(mine[0].expr) if mine else None


def step_for(start: float, end: float, scrape_s: float) -> float:
    """The scrape interval, shorter for a round shorter than two of them, never over Prometheus'
    point limit."""
    span = max(end - start, 1.0)
    return max(1.0, min(scrape_s, span / 2), math.ceil(span / (MAX_POINTS - 1)))


def _points(result: Sequence[Mapping[str, Any]], scale: float) -> list[TimeSeriesPoint]:
    at: dict[float, list[float]] = {}
    for series in result:
        for t, v in series.get("values") or []:
            x = float(v)
            if x == x and not math.isinf(x):  # NaN (0/0) and infinities are no value
                at.setdefault(float(t), []).append(x * scale)
    if len(result) == 1:
        return [TimeSeriesPoint(ts=iso(t, ms=True), value=xs[0]) for t, xs in sorted(at.items())]
    return [TimeSeriesPoint(ts=iso(t, ms=True), mean=sum(xs) / len(xs), min=min(xs), max=max(xs))
            for t, xs in sorted(at.items())]


def engine_series(prom: Prometheus, component: str, kind: str, start: float, end: float,
                  scrape_s: float) -> tuple[ComponentObservability | None, dict[str, Any]]:
    """The engine's (``component``, of ``kind``) time series over ``start``..``end`` (unix), and
    the notes: window, step, each query, and the fields with no series.  PromError propagates."""
    step = step_for(start, end, scrape_s)
    series: dict[str, TimeSeriesData] = {}
    stats: dict[str, Any] = {}
    queries: dict[str, str] = {}
    for field in FIELDS:
        expr = query_of(field, kind)
        if expr is None:
            continue
        queries[field.name] = expr
        points = _points(prom.query_range(expr, start, end, step), field.scale)
        if not points:
            continue
        series[field.name] = TimeSeriesData(units=field.units, series=points)
        values = [p.value if p.value is not None else p.mean for p in points]
        stats[field.aggregate] = statistics_of([v for v in values if v is not None], field.units)
    notes = {"source": "prometheus", "window": {"start": iso(start, ms=True), "end": iso(end, ms=True),
                                                "start_unix": start, "end_unix": end},
             "step_s": step, "queries": queries, "missing": [f for f in queries if f not in series],
             "several_series": "mean, min and max over the series (one per GPU) at each instant"}
    if not series:
        return None, notes
    return ComponentObservability(component_label=component, aggregate=ResourceMetrics(**stats),
                                  time_series=TimeSeriesResourceMetrics(**series)), notes
