"""PNG boards for reports, with matplotlib: the Grafana panel grid in a light layout.

Made to be read at a glance: engines in their fixed colours and everything else in colours
that are neither; legends beside the plot, never over the lines; a quantity of another scale
(the proxy's timing error) on an axis of its own, in its unit; flat series on an axis that
shows them as flat, not as noise; amounts that must not be exaggerated from zero; a panel with
many label combinations (failure reasons) drawn as its top few and "other reasons".
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.dates import DateFormatter, date2num  # noqa: E402

from dashboards.boards import layout, row_positions  # noqa: E402
from dashboards.catalogue import ENGINE_COLORS, LINE_STYLES, Board, Panel  # noqa: E402

__all__ = ["render_board", "png_size", "top_series", "flat_limits", "time_ticks", "PX_PER_ROW", "WIDTH_PX", "DPI", "TOP_SERIES",
           "OTHER_COLORS"]

DPI = 100
WIDTH_PX = 1600
PX_PER_ROW = 36  # one Grafana grid row (30 px there) plus room for titles
HEADER_PX = 90
LEGEND_PX = 190  # beside each plot, right of its axes: the legend never covers a line
RIGHT_AXIS_PX = 55
#: A panel with more series than this draws its top ones by total and sums the rest.
TOP_SERIES = 5

_MPL_STYLE = {"dash": "--", "dot": ":", "dashdot": "-."}
_UNIT_SCALE = {"percentunit": (100.0, "%"), "percent": (1.0, "%"), "s": (1.0, "s"), "gbytes": (1.0, "GiB"),
               "hertz": (1e-9, "GHz"), "watt": (1.0, "W"), "celsius": (1.0, "°C"), "short": (1.0, ""),
               "suffix: tok/s": (1.0, "tok/s"), "reqps": (1.0, "req/s"), "ms": (1000.0, "ms")}
#: Colours of series that are no engine: distinct from the engines' and from each other.
OTHER_COLORS = ("#2ca02c", "#9467bd", "#d62728", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
_OTHER_REASONS = "#b0b0b0"


def png_size(board: Board) -> tuple[int, int]:
    rows = max(p.y + p.h for p in layout(board))
    return WIDTH_PX, HEADER_PX + rows * PX_PER_ROW


def _rect(pos: Any, w: int, h: int, right_px: int) -> tuple[float, float, float, float]:
    """Axes rectangle (figure fractions) inside a grid cell, leaving room for the title, the ticks
    and, on the right, ``right_px`` for a second axis and the legend."""
    left_px = 20 + pos.x / 24 * (w - 40) + 45
    width_px = pos.w / 24 * (w - 40) - 60 - right_px
    top_px = HEADER_PX + pos.y * PX_PER_ROW + 24
    height_px = pos.h * PX_PER_ROW - 24 - 30
    return (left_px / w, 1 - (top_px + height_px) / h, width_px / w, height_px / h)


def _num(ts: float) -> float:
    import datetime as dt

    return float(date2num(dt.datetime.fromtimestamp(ts, dt.timezone.utc)))


_TICK_STEPS_S = (1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def time_ticks(start: float, end: float, most: int) -> list[float]:
    """At most ``most`` round times (whole multiples of a step of 1 s .. 1 day) in ``[start, end]``:
    as many labels as the plot's width holds without overlap."""
    span = max(end - start, 1.0)
    step = next((s for s in _TICK_STEPS_S if span / s < most), _TICK_STEPS_S[-1])
    first = math.ceil(start / step) * step
    return [float(t) for t in range(int(first), int(end) + 1, step)]


def _engine_color(name: str) -> str | None:
    for engine, color in ENGINE_COLORS.items():
        if name.startswith(engine):
            return color
    return None


def _total(s: dict[str, Any]) -> float:
    return sum(v for v in s["values"] if not math.isnan(v))


def top_series(series: list[dict[str, Any]], top: int = TOP_SERIES, other: str = "other reasons"
               ) -> list[dict[str, Any]]:
    """Series that are zero throughout left out; past ``top`` of them, the ``top`` largest by total
    and one ``other`` series: the sum of the rest at each time."""
    shown = sorted((s for s in series if _total(s) > 0), key=_total, reverse=True)
    if len(shown) <= top + 1:
        return shown
    rest = shown[top:]
    times = sorted({t for s in rest for t in s["times"]})
    at = [dict(zip(s["times"], s["values"])) for s in rest]
    values = [sum(v for p in at if not math.isnan(v := p.get(t, math.nan))) for t in times]
    return shown[:top] + [{"name": f"{other} ({len(rest)})", "times": times, "values": values, "other": True}]


def flat_limits(values: list[float], from_zero: bool) -> tuple[float, float] | None:
    """y limits for series that would otherwise get a misleading axis: a flat series (matplotlib
    would draw a flat 0 on -0.04..0.04) from 0, or around its value; ``from_zero``: from 0."""
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return None
    lo, hi = min(vals), max(vals)
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):
        if hi == 0:
            return (0.0, 1.0)
        return (0.0, hi * 1.25) if hi > 0 else (hi * 1.25, 0.0)
    if from_zero:
        return (min(0.0, lo), hi * 1.08 if hi > 0 else 1.0)
    return None


def _style(name: str) -> str:
    return next((_MPL_STYLE[v] for k, v in LINE_STYLES.items() if k in name), "-")


def _plot(ax: Any, series: list[dict[str, Any]], scale: float, colors: dict[str, str]) -> None:
    for s in series:
        color = _OTHER_REASONS if s.get("other") else colors.get(s["name"])
        ax.plot([_num(t) for t in s["times"]], [v * scale for v in s["values"]], label=s["name"], color=color,
                linewidth=1.6, linestyle=_style(s["name"]))


def _colors(panel: Panel, series: list[dict[str, Any]]) -> dict[str, str]:
    """Engines' series in the engine's colour (on per-engine panels); every other one its own."""
    out, spare = {}, iter(OTHER_COLORS * 4)
    for s in series:
        engine = _engine_color(s["name"]) if panel.per_engine_colors else None
        out[s["name"]] = engine or next(spare)
    return out


def _limits(ax: Any, series: list[dict[str, Any]], scale: float, from_zero: bool) -> None:
    limits = flat_limits([v * scale for s in series for v in s["values"]], from_zero)
    if limits is not None:
        ax.set_ylim(*limits)


def _timeseries(ax: Any, panel: Panel, series: list[dict[str, Any]], scale: float) -> Any:
    """Left-axis series, and those of queries marked ``right`` on a twin axis in its unit."""
    right_refs = {q.ref for q in panel.queries if q.right}
    left = [s for s in series if s.get("ref") not in right_refs]
    right = [s for s in series if s.get("ref") in right_refs]
    if panel.top:
        left = top_series(left, panel.top)
    colors = _colors(panel, left + right)
    _plot(ax, left, scale, colors)
    _limits(ax, left, scale, panel.from_zero)
    axes = [ax]
    thresholds_on = ax
    if panel.right_unit is not None:
        twin = ax.twinx()
        r_scale, r_unit = _UNIT_SCALE.get(panel.right_unit[0], (1.0, panel.right_unit[0]))
        _plot(twin, right, r_scale, colors)
        _limits(twin, right, r_scale, True)
        twin.set_ylabel(f"{panel.right_unit[1]} ({r_unit})", fontsize=8)
        twin.tick_params(labelsize=8)
        axes.append(twin)
        thresholds_on, scale = twin, r_scale
    for threshold in panel.thresholds:
        thresholds_on.axhline(threshold * scale, color="#d62728", linestyle="--", linewidth=0.9)
    return axes


def _stat(ax: Any, series: list[dict[str, Any]], scale: float, unit: str) -> None:
    ax.axis("off")
    lines = []
    for s in series:
        vals = [v for v in s["values"] if not math.isnan(v)]
        if vals:
            lines.append((s["name"], vals[-1] * scale))
    if not lines:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", color="#888888", fontsize=14)
    for i, (name, v) in enumerate(lines[:6]):
        ax.text(0.02, 0.8 - i * 0.17, f"{name}: {v:,.4g}{(' ' + unit) if unit else ''}", fontsize=11,
                color=_engine_color(name) or "#333333", transform=ax.transAxes, va="center")
    if len(lines) > 6:
        ax.text(0.02, 0.8 - 6 * 0.17, f"… and {len(lines) - 6} more", fontsize=9, color="#666666",
                transform=ax.transAxes, va="center")


def _panel(fig: Any, panel: Panel, pos: Any, w: int, h: int, series: list[dict[str, Any]], window: tuple[float, float]
           ) -> None:
    import datetime as dt

    timeseries = panel.kind != "stat"
    right_px = (LEGEND_PX if timeseries else 0) + (RIGHT_AXIS_PX if panel.right_unit and timeseries else 0)
    ax = fig.add_axes(_rect(pos, w, h, right_px))
    scale, unit = _UNIT_SCALE.get(panel.unit, (1.0, panel.unit))
    if panel.right_unit and timeseries:
        unit = f"{unit} left, {_UNIT_SCALE.get(panel.right_unit[0], (1.0, panel.right_unit[0]))[1]} right"
    ax.set_title(f"{panel.title}" + (f" ({unit})" if unit else ""), fontsize=10, loc="left")
    if not timeseries:
        _stat(ax, series, scale, unit)
        return
    ax.set_facecolor("white")
    ax.grid(True, color="#e5e5e5", linewidth=0.6)
    axes = _timeseries(ax, panel, series, scale)
    ax.set_xlim(_num(window[0]), _num(window[1]))
    ax.set_xticks([_num(t) for t in time_ticks(*window, max(2, int(ax.get_position().width * w / 85)))])
    ax.xaxis.set_major_formatter(DateFormatter("%H:%M:%S", tz=dt.timezone.utc))
    ax.tick_params(labelsize=8)
    handles = [hl for a in axes for hl in zip(*a.get_legend_handles_labels())]
    if handles:
        offset = 1.0 + (RIGHT_AXIS_PX / max(1.0, ax.get_position().width * w) if len(axes) > 1 else 0.02)
        ax.legend([hd for hd, _ in handles], [lb for _, lb in handles], fontsize=7, loc="upper left",
                  bbox_to_anchor=(offset, 1.0), frameon=False, borderaxespad=0.0)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", color="#888888", transform=ax.transAxes)


def render_board(board: Board, data: dict[str, list[dict[str, Any]]], window: tuple[float, float],
                 out: Path, subtitle: str = "") -> Path:
    """``data``: panel key -> series ``[{"name", "times" (unix s), "values", "ref"}]`` (``ref``: the
    panel query's, which tells the axis)."""
    import datetime as dt

    w, h = png_size(board)
    fig = plt.figure(figsize=(w / DPI, h / DPI), dpi=DPI, facecolor="white")
    start, end = window
    fmt = "%Y-%m-%d %H:%M:%S UTC"
    span = (f"{dt.datetime.fromtimestamp(start, dt.timezone.utc):{fmt}} — "
            f"{dt.datetime.fromtimestamp(end, dt.timezone.utc):{fmt}}  (unix {start:.0f}–{end:.0f})")
    fig.suptitle(f"{board.title}\n{span}" + (f"\n{subtitle}" if subtitle else ""), fontsize=12,
                 y=1 - 8 / h, va="top")
    for title, y in row_positions(board):
        fig.text(20 / w, 1 - (HEADER_PX + y * PX_PER_ROW + 22) / h, title, fontsize=12, fontweight="bold")
    for panel, pos in zip(board.panels, layout(board)):
        _panel(fig, panel, pos, w, h, data.get(panel.key, []), window)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI, facecolor="white")
    plt.close(fig)
    return out
