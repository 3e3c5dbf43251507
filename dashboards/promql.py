"""The catalogue's building blocks: panels, queries, boards, and the PromQL they are written with.

:func:`exact_count` is the restart-safe exact count every count panel and the evidence tool use;
:func:`expand` fills Grafana's variables for Prometheus itself; :func:`for_job` points a board's
proxy selectors at another Prometheus job.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from .mixin import CONFIG as MIXIN

__all__ = ["Query", "Panel", "Board", "Annotation", "Row", "expand", "exact_count", "job_selector", "retarget",
           "for_job", "check_job", "JobError", "COUNT_STEP"]

#: The subquery step of the restart-safe exact counts (:func:`exact_count`).
COUNT_STEP = MIXIN.count_step


def exact_count(selector: str, range_: str = "$__range") -> str:
    """Exact count of a counter's events in the time range ``(T - range, T]``, per series, right
    across restarts, without ``increase()``'s extrapolation to fractional requests.

    The counter's last sample at or before ``T`` minus its last one at or before ``T - range``,
    plus, for every restart inside the range, the value the counter had before it (found at the
    steps of ``COUNT_STEP``, at most the scrape interval: where a sample is below the one before
    it).  So for a window whose ends lie on scrapes the count is exactly the events between them,
    whatever the scrapes' phase against the step grid.  A series with no sample in the range before
    the window (first seen inside it: a proxy or a Prometheus that started inside the window)
    started at zero.  The previous samples are looked up with range selectors, so they are found
    across the stale gap a restart leaves.  Like ``increase()``, it cannot see a restart after
    which the counter is back at or above its last sample before the restart.  Aggregate the
    result (``sum by (engine)``), never the counter before it: each proxy instance restarts on its
    own.  Prometheus and VictoriaMetrics give the same numbers."""
    end = f"last_over_time({selector}[{range_}])"
    start = f"last_over_time({selector}[{range_}] offset {range_})"
    cur = f"last_over_time({selector}[{COUNT_STEP}])"
    prev = f"last_over_time({selector}[{range_}] offset {COUNT_STEP})"
    before_restarts = f"sum_over_time(({prev} * ({cur} < bool {prev}))[{range_}:{COUNT_STEP}])"
    # `* 0`: zero for every series seen at the end (and drops the name that last_over_time keeps)
    return f"({end} - ({start} or {end} * 0)) + ({before_restarts} or {end} * 0)"


@dataclass(frozen=True)
class Annotation:
    """A Grafana annotation query: each series' value is the unix time of an event (in ms); with
    ``value_is_time`` False, each sample is an event at its own time (consecutive ones a region)."""

    name: str
    expr: str
    title: str
    text: str
    color: str
    value_is_time: bool = True
    #: the labels Grafana turns into the annotation's tags (comma-separated; None: engine, scenario, round)
    tags: str | None = None


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str
    ref: str = "A"
    #: recording rule name, when this query is also recorded (the panel's ``rule`` is its first query's)
    rule: str | None = None
    #: drawn on the panel's second axis (``Panel.right_unit``): a quantity of another scale
    right: bool = False


@dataclass(frozen=True)
class Panel:
    key: str
    title: str
    unit: str
    queries: tuple[Query, ...]
    kind: str = "timeseries"  # or "stat"
    description: str = ""
    width: int = 12
    height: int = 8
    rule: str | None = None  # recording rule name, when the first query is also recorded
    per_engine_colors: bool = True
    thresholds: tuple[float, ...] = ()
    low_is_bad: bool = False  # thresholds mark the bottom (a ratio that must stay high)
    log_scale: bool = False
    #: the second axis of the queries marked ``right``: (unit, label); thresholds are drawn on it
    right_unit: tuple[str, str] | None = None
    #: the y axis starts at 0 (an amount whose noise a tight axis would exaggerate)
    from_zero: bool = False
    #: many label combinations (failure reasons): pictures draw the top ones and "other reasons"
    top: int = 0
    #: each engine's series stacked, in query order (parts that add up to a whole)
    stack: bool = False

    @property
    def exprs(self) -> list[str]:
        return [q.expr for q in self.queries]

    @property
    def rules(self) -> list[tuple[str, str]]:
        """(rule name, query expression) of every recorded query."""
        out = [(self.rule, self.queries[0].expr)] if self.rule else []
        return out + [(q.rule, q.expr) for q in self.queries[1:] if q.rule]


@dataclass(frozen=True)
class Row:
    """A collapsible heading above the panels from ``first`` on."""

    title: str
    first: str


@dataclass(frozen=True)
class Board:
    uid: str
    title: str
    panels: tuple[Panel, ...]
    variables: tuple[str, ...]
    tags: tuple[str, ...] = ("llm-bench",)
    annotations: tuple[Annotation, ...] = ()
    columns: int = 2
    extra: dict[str, str] = field(default_factory=dict)
    rows: tuple[Row, ...] = ()


_SELECTOR = re.compile(r"\{([^{}]*)\}")


def _drop_match_all(m: re.Match[str]) -> str:
    kept = [x.strip() for x in m.group(1).split(",") if x.strip() and not x.strip().endswith('=~".*"')]
    return "{" + ", ".join(kept) + "}" if kept else ""


def _duration(seconds: float) -> str:
    """Whole seconds as ``Ns``; anything finer to the millisecond (``61234ms``): a window's ends
    lie on scrapes to the millisecond."""
    ms = max(1000, int(round(seconds * 1000)))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def expand(expr: str, range_s: float | None = None, **values: str) -> str:
    """Fill Grafana variables: each ``$name`` by ``values[name]`` (default ``.*``) and
    ``$__range`` by ``range_s`` seconds (to the millisecond); ``label=~".*"`` matchers are dropped."""
    if "$__range" in expr:
        if range_s is None:
            raise ValueError("this query needs a range: pass range_s")
        expr = expr.replace("$__range", _duration(range_s))
    expr = re.sub(r"\$(\w+)", lambda m: values.get(m.group(1), ".*"), expr)
    return _SELECTOR.sub(_drop_match_all, expr)


class JobError(ValueError):
    """A job name no selector can hold."""


def check_job(job: str) -> str:
    if not job or any(c in job for c in '"\\\n{}'):
        raise JobError(f"--job {job!r}: a Prometheus job name without quotes, backslashes or braces")
    return job


def job_selector(job: str | None = None) -> str:
    return MIXIN.job_selector if job is None else f'job="{check_job(job)}"'


def retarget(obj: Any, job: str | None) -> Any:
    """``obj`` (a string, or dicts and lists of them) with every proxy selector on ``job``:
    the mixin's job matcher, with which every proxy selector starts, replaced."""
    if job is None or job == MIXIN.job:
        return obj
    new = job_selector(job)
    if isinstance(obj, str):
        return obj.replace(MIXIN.job_selector, new)
    if isinstance(obj, dict):
        return {k: retarget(v, job) for k, v in obj.items()}
    if isinstance(obj, list):
        return [retarget(v, job) for v in obj]
    return obj


def for_job(boards: dict[str, Board], job: str | None) -> dict[str, Board]:
    """The boards with their queries and annotations on the proxies of Prometheus job ``job``."""
    if job is None or job == MIXIN.job:
        return boards

    def panel(p: Panel) -> Panel:
        return dataclasses.replace(p, queries=tuple(dataclasses.replace(q, expr=retarget(q.expr, job))
                                                     for q in p.queries))
    return {name: dataclasses.replace(
        b, panels=tuple(panel(p) for p in b.panels),
        annotations=tuple(dataclasses.replace(a, expr=retarget(a.expr, job)) for a in b.annotations))
        for name, b in boards.items()}
