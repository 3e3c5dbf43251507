"""PNG boards for reports, with matplotlib: the Grafana panel grid in a light layout.

Made to be read at a glance: engines in their fixed colours (several series of one engine, such
as its failure reasons, in shades of its colour) and everything else in colours that are
neither; legends beside the plot, never over the lines; a quantity of another scale (the
proxy's timing error) on an axis of its own, in the same unit as the other; flat series on an
axis that shows them as flat, and series of one sign on an axis that includes zero, so that
0.320-0.325 s is no cliff (:func:`flat_limits`); a series of one or two points drawn with
markers, so it shows; a ``histogram_quantile(1, ...)`` drawn as what it is, the bound of the
bucket that holds the max, never as a max, and never setting the axis; thresholds labelled in
the legend and never stretching the axis; a panel with many label combinations (failure
reasons) drawn as its top few and "other reasons"; a 1-minute rate over a shorter window marked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.dates import DateFormatter  # noqa: E402

from dashboards.boards import layout, row_positions  # noqa: E402
from dashboards.catalogue import ENGINE_COLORS, LINE_STYLES, Board, Panel  # noqa: E402

from .runs import Announcement  # noqa: E402
from .stacking import stacked  # noqa: E402
from .timeaxis import date_num as _num  # noqa: E402
from .timeaxis import draw_marks, time_ticks  # noqa: E402

__all__ = ["render_board", "panel_title", "png_size", "top_series", "flat_limits", "time_ticks", "PX_PER_ROW", "WIDTH_PX", "DPI", "TOP_SERIES",
           "OTHER_COLORS", "shade", "is_bucket_bound", "panel_units", "stat_lines"]

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
#: Shades of an engine's colour for its 2nd, 3rd, ... series (< 0 darker, > 0 lighter) and their
#: line styles: a second cue where shades are near.
_SHADES = (0.0, -0.45, 0.45, -0.7, 0.7)
_SHADE_STYLES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)))
_THRESHOLD_COLOR = "#d62728"


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


def _engine_color(name: str) -> str | None:
    return next((color for engine, color in ENGINE_COLORS.items() if name.startswith(engine)), None)


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
    """y limits that include zero for series of one sign (every amount the boards draw): a flat
    series (matplotlib would draw a flat 0 on -0.04..0.04) from 0 to a quarter above its value,
    and a moving one from 0 to a little above its top, so that one or two points of 0.320 and
    0.325 s are no cliff over the whole height (an auto-scaled axis stretches any difference to
    it); ``from_zero``: from 0 even where values are negative too.  None: matplotlib's own axis,
    for series that cross zero."""
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return None
    lo, hi = min(vals), max(vals)
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):
        if hi == 0:
            return (0.0, 1.0)
        return (0.0, hi * 1.25) if hi > 0 else (hi * 1.25, 0.0)
    if from_zero or lo >= 0:
        return (min(0.0, lo * 1.08), hi * 1.08 if hi > 0 else 1.0)
    if hi <= 0:
        return (lo * 1.08, 0.0)
    return None


def shade(color: str, amount: float) -> str:
    """``color`` mixed with black (``amount`` < 0) or white (> 0) by ``abs(amount)``."""
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    to = 0 if amount < 0 else 255
    mix = [round(c + (to - c) * abs(amount)) for c in (r, g, b)]
    return "#" + "".join(f"{c:02x}" for c in mix)


def is_bucket_bound(expr: str) -> bool:
    """``histogram_quantile(1, ...)``: not the max but the upper bound of the bucket that holds it
    (a max of 29 ms in a bucket up to 50 ms reads 50 ms)."""
    return expr.replace(" ", "").startswith(("histogram_quantile(1,", "histogram_quantile(1.0,"))


def _style(name: str) -> str:
    return next((_MPL_STYLE[v] for k, v in LINE_STYLES.items() if k in name), "-")


def _isolated(values: list[float]) -> list[bool]:
    """Points with no finite neighbour: a line through them draws nothing."""
    ok = [not math.isnan(v) for v in values]
    return [ok[i] and not (i > 0 and ok[i - 1]) and not (i + 1 < len(ok) and ok[i + 1]) for i in range(len(ok))]


def _plot(ax: Any, series: list[dict[str, Any]], scale: float, colors: dict[str, str],
          styles: dict[str, Any] | None = None, bounds: bool = False) -> None:
    """Each series as a line, with markers where it has three points or fewer (or a point alone):
    a line of one point draws nothing, and two points alone are no trend.  ``bounds``: bucket
    bounds, thin and dotted, labelled as the bound they are."""
    for s in series:
        color = _OTHER_REASONS if s.get("other") else colors.get(s["name"])
        xs, ys = [_num(t) for t in s["times"]], [v * scale for v in s["values"]]
        few = sum(1 for v in ys if not math.isnan(v)) <= 3
        style = ":" if bounds else (styles or {}).get(s["name"]) or _style(s["name"])
        (line,) = ax.plot(xs, ys, label=s.get("label", s["name"]), color=color, linewidth=1.0 if bounds else 1.6,
                          linestyle=style, marker="o" if few else None, markersize=4 if bounds else 5)
        if "below" in s:  # a stacked part: the band between the parts below it and its top
            ax.fill_between(xs, [v * scale for v in s["below"]], ys, color=line.get_color(), alpha=0.3, linewidth=0)
        alone = [i for i, lone in enumerate(_isolated(ys)) if lone]
        if alone and not few:
            ax.plot([xs[i] for i in alone], [ys[i] for i in alone], linestyle="none", marker="o", markersize=4,
                    color=line.get_color())


def _looks(panel: Panel, series: list[dict[str, Any]]) -> tuple[dict[str, str], dict[str, Any]]:
    """(colour, line style) per series name.  On per-engine panels each engine's series in its
    colour (the legend words give the styles); on the others (failure reasons, GPUs) an engine's
    first series in its colour, its next ones in shades of it with line styles of their own, and
    every series of no engine in a colour of its own that is no engine's."""
    colors: dict[str, str] = {}
    styles: dict[str, Any] = {}
    spare, seen = iter(OTHER_COLORS * 4), dict[str, int]()
    for s in series:
        engine = _engine_color(s["name"])
        if engine and panel.per_engine_colors:
            colors[s["name"]] = engine
        elif engine and not s.get("other"):
            i = seen[engine] = seen.get(engine, -1) + 1
            colors[s["name"]] = shade(engine, _SHADES[i % len(_SHADES)])
            styles[s["name"]] = _SHADE_STYLES[i % len(_SHADE_STYLES)]
        else:
            colors[s["name"]] = next(spare)
    return colors, styles


def _colors(panel: Panel, series: list[dict[str, Any]]) -> dict[str, str]:
    return _looks(panel, series)[0]


def _limits(ax: Any, series: list[dict[str, Any]], scale: float, from_zero: bool) -> None:
    """Limits from the measured series alone, then held: thresholds and bucket bounds drawn
    afterwards never stretch the axis."""
    limits = flat_limits([v * scale for s in series for v in s["values"]], from_zero)
    ax.set_ylim(*(limits if limits is not None else ax.get_ylim()))


def _fmt(v: float, unit: str) -> str:
    return f"{v:.4g}{(' ' + unit) if unit else ''}"


def _bound_labels(bounds: list[dict[str, Any]], scale: float, unit: str, top: float) -> list[dict[str, Any]]:
    out = []
    for s in bounds:
        vals = [v * scale for v in s["values"] if not math.isnan(v)]
        most = max(vals, default=math.nan)
        note = ", above the axis" if vals and most > top else ""
        label = (f"{s['name']} ≤ {_fmt(most, unit)}:\n the bucket's bound, not a\n measured max{note}" if vals
                 else s["name"])
        out.append({**s, "label": label})
    return out


def _thresholds(ax: Any, thresholds: tuple[float, ...], scale: float, unit: str) -> None:
    low, top = ax.get_ylim()
    for threshold in thresholds:
        v = threshold * scale
        where = " (above the axis)" if v > top else " (below the axis)" if v < low else ""
        ax.axhline(v, color=_THRESHOLD_COLOR, linestyle="--", linewidth=0.9, label=f"threshold {_fmt(v, unit)}{where}")


def _timeseries(ax: Any, panel: Panel, series: list[dict[str, Any]], scale: float, unit: str = "",
                right_scale: tuple[float, str] | None = None) -> Any:
    """Left-axis series, and those of queries marked ``right`` on a twin axis in its unit.  The
    series of ``histogram_quantile(1, ...)`` queries (:func:`is_bucket_bound`) are drawn as bounds,
    after the axis is set from the others."""
    right_refs = {q.ref for q in panel.queries if q.right}
    bound_refs = {q.ref for q in panel.queries if is_bucket_bound(q.expr)}
    left = [s for s in series if s.get("ref") not in right_refs]
    right = [s for s in series if s.get("ref") in right_refs]
    if panel.top:
        left = top_series(left, panel.top)
    if panel.stack:
        left = stacked(left)
    colors, styles = _looks(panel, left + right)
    axes = [ax]
    sides = [(ax, left, scale, unit, panel.from_zero)]
    if panel.right_unit is not None:
        twin = ax.twinx()
        r_scale, r_unit = right_scale or _UNIT_SCALE.get(panel.right_unit[0], (1.0, panel.right_unit[0]))
        twin.set_ylabel(f"{panel.right_unit[1]} ({r_unit})", fontsize=8)
        twin.tick_params(labelsize=8)
        axes.append(twin)
        sides.append((twin, right, r_scale, r_unit, True))
    for on, drawn, s_scale, s_unit, from_zero in sides:
        measured = [s for s in drawn if s.get("ref") not in bound_refs]
        _plot(on, measured, s_scale, colors, styles)
        _limits(on, measured, s_scale, from_zero)
        bounds = _bound_labels([s for s in drawn if s.get("ref") in bound_refs], s_scale, s_unit, on.get_ylim()[1])
        _plot(on, bounds, s_scale, colors, styles, bounds=True)
    on, _, s_scale, s_unit, _ = sides[-1]
    _thresholds(on, panel.thresholds, s_scale, s_unit)
    return axes


#: Lines a stat panel shows before "... and N more"; the font its values take by how many show.
STAT_LINES = 6
_STAT_FONT = {1: 20, 2: 17, 3: 14, 4: 12}


def stat_lines(series: list[dict[str, Any]], scale: float) -> list[tuple[str, float]]:
    """(name, last value) of each series with a value."""
    out = []
    for s in series:
        vals = [v for v in s["values"] if not math.isnan(v)]
        if vals:
            out.append((s["name"], vals[-1] * scale))
    return out


def _stat(ax: Any, series: list[dict[str, Any]], scale: float, unit: str) -> None:
    """The values spread over the panel's height, in a font as large as their number allows: the
    stat row is filled, not a few small lines over a blank band."""
    ax.axis("off")
    lines = stat_lines(series, scale)
    if not lines:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", color="#888888", fontsize=14)
        return
    shown = lines[:STAT_LINES]
    more = len(lines) - len(shown)
    n = len(shown) + (1 if more else 0)
    font = _STAT_FONT.get(n, 10)
    ys = [1 - (i + 0.5) / n for i in range(n)]
    for y, (name, v) in zip(ys, shown):
        ax.text(0.02, y, f"{name}: {v:,.4g}{(' ' + unit) if unit else ''}", fontsize=font,
                color=_engine_color(name) or "#333333", transform=ax.transAxes, va="center")
    if more:
        ax.text(0.02, ys[-1], f"… and {more} more", fontsize=min(font, 9), color="#666666",
                transform=ax.transAxes, va="center")


#: Units of time: a panel whose two axes are both in one of them draws both in the right one's.
_TIME_UNITS = ("s", "ms")


def panel_units(panel: Panel) -> tuple[tuple[float, str], tuple[float, str] | None, str]:
    """(left scale and unit, right scale and unit or None, the title's unit).  Two axes of time
    (the proxy's TTFT in s, its timing error in ms) are both drawn in the right one's unit: one
    unit on a panel, as the report's tables have."""
    left = _UNIT_SCALE.get(panel.unit, (1.0, panel.unit))
    if panel.right_unit is None:
        return left, None, left[1]
    right = _UNIT_SCALE.get(panel.right_unit[0], (1.0, panel.right_unit[0]))
    if panel.unit in _TIME_UNITS and panel.right_unit[0] in _TIME_UNITS:
        return right, right, f"{right[1]}, both axes"
    return left, right, ", ".join(f"{u} {side}" for u, side in ((left[1], "left"), (right[1], "right")) if u)


#: A panel title's font; one too long for its cell shrinks, then loses its mark's ": see ..." tail.
TITLE_FONT, TITLE_FONT_FIT, TITLE_FONT_MIN = 10.0, 8.5, 7.0


def panel_title(panel: Panel, mark: str | None = None) -> str:
    """The title as the PNG shows it: its unit, then ``mark`` (e.g. ``1m rate, window 56 s: see round totals``)."""
    unit = panel_units(panel)[2] if panel.kind != "stat" else _UNIT_SCALE.get(panel.unit, (1.0, panel.unit))[1]
    return panel.title + (f" ({unit})" if unit else "") + (f" — {mark}" if mark else "")


def _title(fig: Any, ax: Any, panel: Panel, mark: str | None, right_px: float) -> None:
    """The panel's title, ending left of ``right_px`` (where the next panel's starts): in a smaller font
    where it must, else without its mark's tail in a smaller one still (at least :data:`TITLE_FONT_MIN`)."""
    renderer, short = fig.canvas.get_renderer(), mark and (mark.rpartition(": ")[0] or mark)
    for text, size, smallest in ((mark, TITLE_FONT, TITLE_FONT_FIT), (short, TITLE_FONT_FIT, TITLE_FONT_MIN)):
        title = ax.set_title(panel_title(panel, text), fontsize=size, loc="left")
        while title.get_window_extent(renderer).x1 > right_px and size - 0.5 >= smallest:
            size -= 0.5
            title.set_fontsize(size)
        if title.get_window_extent(renderer).x1 <= right_px:
            return


def _panel(fig: Any, panel: Panel, pos: Any, w: int, h: int, series: list[dict[str, Any]], window: tuple[float, float],
           mark: str | None = None, rounds: tuple[Sequence[Announcement], bool] = ((), False)) -> None:
    """``rounds``: the rounds to mark on a time series, and whether to label them."""
    import datetime as dt

    timeseries = panel.kind != "stat"
    right_px = (LEGEND_PX if timeseries else 0) + (RIGHT_AXIS_PX if panel.right_unit and timeseries else 0)
    rect = _rect(pos, w, h, right_px)
    if not timeseries:  # no tick labels under a stat: its values take that room too
        rect = (rect[0], rect[1] - 24 / h, rect[2], rect[3] + 24 / h)
    ax = fig.add_axes(rect)
    (scale, unit), right, _ = panel_units(panel) if timeseries else (
        _UNIT_SCALE.get(panel.unit, (1.0, panel.unit)), None, "")
    _title(fig, ax, panel, mark, (20 + (pos.x + pos.w) / 24 * (w - 40) - 8) * fig.dpi / DPI)
    if not timeseries:
        _stat(ax, series, scale, unit)
        return
    ax.set_facecolor("white")
    ax.grid(True, color="#e5e5e5", linewidth=0.6)
    if right is not None and unit:
        ax.set_ylabel(unit, fontsize=8)
    axes = _timeseries(ax, panel, series, scale, unit, right)
    draw_marks(ax, *rounds)
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
                 out: Path, subtitle: str = "", marks: dict[str, str] | None = None,
                 rounds: Sequence[Announcement] = ()) -> Path:
    """``data``: panel key -> series ``[{"name", "times" (unix s), "values", "ref"}]`` (``ref``: the
    panel query's, which tells the axis); ``marks``: panel key -> what its title adds (:func:`panel_title`);
    ``rounds``: a dotted line on each time series where each began, labelled on the top row's."""
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
    top = min((pos.y for p, pos in zip(board.panels, layout(board)) if p.kind != "stat"), default=0)
    for panel, pos in zip(board.panels, layout(board)):
        _panel(fig, panel, pos, w, h, data.get(panel.key, []), window, (marks or {}).get(panel.key),
               (rounds, pos.y == top))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI, facecolor="white")
    plt.close(fig)
    return out
