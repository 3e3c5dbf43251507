"""The exact counts' step against the scrape interval.

The restart-safe count (``dashboards.promql.exact_count``) looks for a counter that went down between
samples ``count_step`` apart.  Where the store holds samples closer together than that, a restarted
proxy's counter can climb back above its last value within one step, and the restart, with the
counts before it, is lost (``16`` then ``0, 7, 13, 14, 17`` at 1 s scrapes and 5 s steps: 16 lost).
So the export asks the store for the job's scrape interval: Prometheus' running configuration
(``/api/v1/status/config``); a store that serves none (VictoriaMetrics, remote stores) by the spacing
of the job's ``up`` samples in the window.  A ``count_step`` longer than it is a warning naming both.
"""

from __future__ import annotations

from typing import Any

from dashboards.promql import COUNT_STEP

from .promapi import PromError, Prometheus, parse_duration
from .windows import Window

__all__ = ["UP_SPAN_S", "up_spacing", "check_count_step"]

#: the end of the window whose ``up`` samples tell the scrape interval (enough for dozens of scrapes)
UP_SPAN_S = 600


def up_spacing(prom: Prometheus, job: str, window: Window) -> float | None:
    """The smallest median spacing of the job's ``up`` samples, per target, in the last
    :data:`UP_SPAN_S` seconds of the window (None without two samples of one target)."""
    span = max(1, int(min(window.seconds, UP_SPAN_S)))
    try:
        series = prom.query(f'up{{job="{job}"}}[{span}s]', at=window.end)
    except PromError as exc:
        if "cannot reach" in str(exc) or "not authorised" in str(exc):
            raise
        return None
    spacings = []
    for s in series:
        stamps = sorted(float(t) for t, _ in s.get("values") or [])
        gaps = sorted(b - a for a, b in zip(stamps, stamps[1:]) if b > a)
        if gaps:
            spacings.append(gaps[len(gaps) // 2])
    return round(min(spacings), 3) if spacings else None


def check_count_step(prom: Prometheus, job: str, window: Window, intervals: dict[str, float]) -> dict[str, Any]:
    """``{"count_step", "count_step_s", "job", "scrape_interval_s", "source", "warning"}``: the job's scrape
    interval from ``intervals`` (:meth:`Prometheus.scrape_intervals`), else from its ``up`` samples; a warning
    (one line) when ``count_step`` is longer (none when neither tells the interval: no proxy was scraped)."""
    step_s = parse_duration(COUNT_STEP)
    slack = 1e-6  # a configured interval is exact; a measured one jitters by a few ms
    if job in intervals:
        scrape_s: float | None = intervals[job]
        source = "the store's configuration (/api/v1/status/config)"
    else:
        scrape_s = up_spacing(prom, job, window)
        source = f"the spacing of up{{job=\"{job}\"}} samples in the window"
        slack = 0.05 * (scrape_s or 0.0)
    warning = None
    if scrape_s is None:  # no proxy scraped in the window: nothing to count, nothing to warn of
        source = f"unknown: no configuration for job {job} and no up samples of it in the window"
    elif step_s > scrape_s + slack:
        warning = (f"count_step {COUNT_STEP} is longer than job {job}'s scrape interval {scrape_s:g}s (from {source}): "
                   "a counter that climbs back within one step hides a restart, and the counts before it; set "
                   f"count_step to {scrape_s:g}s in dashboards/mixin.py and regenerate (docs/scaling.md)")
    return {"count_step": COUNT_STEP, "count_step_s": step_s, "job": job, "scrape_interval_s": scrape_s,
            "source": source, "warning": warning}
