"""``EVIDENCE.md``: per panel the PromQL, the window, the step and the data-point checks,
under a header that names the backend, the window's source and how the step was chosen."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dashboards.catalogue import BOARDS, MIXIN, RATE_WINDOW, Panel
from exporter import __version__

from .counts import CountSpan
from .windows import Window, iso

__all__ = ["QueryEvidence", "evidence_markdown", "panel_kind", "below_first_bucket", "RATE_NOTE", "scenario_line"]

RATE_NOTE = ("Panels built on `rate()` (marked *rate*) are computed by the backend's own query engine: "
             "VictoriaMetrics' MetricsQL does not extrapolate `rate()`/`increase()` to the window's edges "
             "as Prometheus does, so these curves differ slightly between the two by design. Exact-count "
             "(restart-safe sums of differences between scrapes) and gauge panels are the same on both.")


@dataclass
class QueryEvidence:
    ref: str
    expr: str
    legend: str
    series: list[dict[str, Any]] = field(default_factory=list)  # {"name", "labels", "times", "values"}
    points: int = 0
    nan: int = 0
    empty_series: int = 0
    gaps: list[tuple[float, float]] = field(default_factory=list)
    first: float | None = None
    last: float | None = None
    span: CountSpan | None = None  # evaluated once, from the scrapes around a short window
    first_bucket: float | None = None  # a quantile query's lowest finite bucket bound
    in_first_bucket: int = 0  # its points at or below that bound: "below the first bucket bound"


def panel_kind(panel: Panel) -> str:
    """``exact-count`` (over the whole range: ``$__range``), ``rate`` (rate/increase over a
    sliding window) or ``gauge`` (instant values)."""
    exprs = " ".join(panel.exprs)
    if "$__range" in exprs:
        return "exact-count"
    if "rate(" in exprs or "increase(" in exprs:
        return "rate"
    return "gauge"


def _fmt_t(t: float | None) -> str:
    return "-" if t is None else f"{iso(t)} ({t:.0f})"


def _backend_line(backend: dict[str, Any]) -> str:
    version = backend.get("version")
    text = f"- Backend: {backend.get('name', '?')}"
    text += f" {version} (revision {backend.get('revision') or '?'})" if version else " (version not reported by the API)"
    return text + f"; llm-bench-exporter {__version__}"


def scenario_line(scenario: str | None) -> str:
    """The header's line on the boards' ``$scenario``: the scenario of a scenario window, else every one."""
    if scenario is None:
        return ("- Scenario filter: none: the boards' `$scenario` matches every scenario (`.*`); a "
                "`scenario:NAME` window filters by its scenario")
    return (f"- Scenario filter: `{scenario}`: the boards' `$scenario` matches this window's scenario only, as the "
            "board does with it selected, so other scenarios run in the same minutes (inside a 1-minute rate) are "
            "left out; the exact-count panels are not filtered (they count every request that ended in the "
            "window; the round's own counts are its round totals), and the gauge panels without `$scenario` "
            "(requests in flight, the engines' and GPUs' own series) show everything")


def _header(window: Window, step: float, step_note: str, rw: str, backend: dict[str, Any], url: str,
            counts_note: str, selector: str, scenario: str | None = None) -> list[str]:
    lines = [
        "# Monitoring evidence", "",
        f"- Window: {iso(window.start)} to {iso(window.end)} (unix {window.start:.3f} to {window.end:.3f}, "
        f"{window.seconds:.0f} s), from `{window.spec}`; window source: {window.source}",
        f"- Step: {step:g} s ({step_note}); the time grid ends on the window's end",
        f"- Exact counts: {counts_note}",
        f"- Rate window: {rw}" + ("" if rw == RATE_WINDOW else f" (widened from {RATE_WINDOW} for the scrape interval)"),
        _backend_line(backend),
        f"- Query API: {url}; the proxies' series selected by `{{{selector}}}` (`evidence export --job`)",
        scenario_line(scenario),
    ]
    if backend.get("name") != "Prometheus":
        lines.append(f"- Note: {RATE_NOTE}")
    return lines + [""]


def below_first_bucket(bound: float) -> str:
    return f"below the first bucket bound ({bound:g} s)"


def _value(ev: QueryEvidence, value: float) -> str:
    """A point as EVIDENCE.md shows it: a quantile inside a histogram's first bucket is no number."""
    if ev.first_bucket is not None and 0 < value <= ev.first_bucket:
        return below_first_bucket(ev.first_bucket)
    return f"{value:.6g}"


def _last_values(ev: QueryEvidence) -> list[str]:
    last = []
    for s in ev.series:
        points = [v for v in s["values"] if not math.isnan(v)]
        if points:
            last.append(f"{s['name']} {_value(ev, points[-1])}")
    lines = [f"Last value: {'; '.join(last)}", ""] if last else []
    if ev.in_first_bucket:
        lines += [f"{ev.in_first_bucket} of {ev.points - ev.nan} points are {below_first_bucket(ev.first_bucket or 0)}: "
                  "the histogram cannot place them, and the interpolated value the CSV holds there is no measurement; "
                  "read the exact mean (rate of _sum / rate of _count) beside it.", ""]
    return lines


def _query_lines(ev: QueryEvidence) -> list[str]:
    gaps = ", ".join(f"{iso(a)}–{iso(b)}" for a, b in ev.gaps[:10]) or "none"
    if len(ev.gaps) > 10:
        gaps += f" (+{len(ev.gaps) - 10} more)"
    lines = [
        "```promql", ev.expr, "```", "",
        *([f"Widened: {ev.span.describe()}.", ""] if ev.span else []),
        "| series | points | NaN | empty series | gaps > 2 steps | first sample | last sample |",
        "|---|---|---|---|---|---|---|",
        f"| {len(ev.series)} | {ev.points} | {ev.nan} | {ev.empty_series} | {len(ev.gaps)} | "
        f"{_fmt_t(ev.first)} | {_fmt_t(ev.last)} |", "",
    ]
    lines += _last_values(ev)
    if ev.gaps:
        lines += [f"Gaps: {gaps}", ""]
    if not ev.series:
        lines += ["**No series in this window.**", ""]
    return lines


def evidence_markdown(window: Window, step: float, step_note: str, rw: str, backend: dict[str, Any], url: str,
                      results: dict[str, dict[str, list[QueryEvidence]]], counts_note: str,
                      selector: str = MIXIN.job_selector, *, no_series: str | None = None,
                      totals: list[str] | None = None, rate_note: str | None = None,
                      scenario_filter: str | None = None, pngs: bool = True) -> str:
    """``no_series``: why every panel of the proxies' boards is empty; ``totals``: the round totals
    section; ``rate_note``: what each rate panel says when the window is shorter than its rate window;
    ``scenario_filter``: the scenario the boards' ``$scenario`` matched (None: every one); ``pngs``:
    each board's PNG was drawn (linked under its heading)."""
    lines = _header(window, step, step_note, rw, backend, url, counts_note, selector, scenario_filter)
    if no_series:
        lines += [f"**No series: {no_series}**", ""]
    if rate_note:
        lines += [f"- Rate panels: {rate_note}", ""]
    lines += totals or []
    for board_key, panels in results.items():
        board = BOARDS[board_key]
        lines += [f"## {board.title}", "", *([f"![{board.title}]({board_key}.png)", ""] if pngs else [])]
        for panel in board.panels:
            lines += [f"### {panel.title}", "", f"Kind: *{panel_kind(panel)}*", ""]
            lines += [panel.description, ""] if panel.description else []  # what it shows (the board's own words)
            if rate_note and panel_kind(panel) == "rate":
                lines += [f"Note: {rate_note}", ""]
            for ev in panels[panel.key]:
                lines += _query_lines(ev)
            lines += [f"Data: `data/{board_key}/{panel.key}.csv`, `data/{board_key}/{panel.key}.json`", ""]
    return "\n".join(lines)
