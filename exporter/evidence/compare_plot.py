"""One PNG per metric for ``evidence compare``: A and B side by side per scenario, the bar at
the median of rounds, the whisker from the rounds' min to max.

Read as a user would: each scenario (cell) on an axis of its own from 0, so a 40 ms cell beside
an 11 s one shows as clearly as it (one linear axis for both made the small one vanish); the
figures in the units of ``compare.md`` (ms, %, tok/s), printed on the bars as the table prints
them; two runs in two colours even when both are one engine's.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from dashboards.catalogue import ENGINE_COLORS  # noqa: E402

from .noise import Metric, human, unit_of  # noqa: E402
from .render import shade  # noqa: E402

__all__ = ["plot_metric", "metric_figure", "run_color", "run_colors", "plot_scale", "CELLS_PER_ROW"]

#: Colours of runs that are not one known engine each.
_OTHER = ("#2ca02c", "#9467bd")
#: Cells side by side before the next row of them.
CELLS_PER_ROW = 4
#: How much darker B is than A where both runs are one engine's.
_SAME_ENGINE_SHADE = -0.5
_HATCH = "//"


def run_color(label: str, engines: Sequence[str], index: int) -> str:
    """SGLang blue and vLLM orange where a run is one of them; green (A) and purple (B) otherwise."""
    if len(engines) == 1 and engines[0] in ENGINE_COLORS:
        return ENGINE_COLORS[engines[0]]
    return ENGINE_COLORS.get(label.lower(), _OTHER[index])


def run_colors(a: tuple[str, Sequence[str]], b: tuple[str, Sequence[str]]) -> tuple[str, str, bool]:
    """(A's colour, B's colour, B hatched): each run's :func:`run_color`; where both come out the
    same (two runs of vLLM), A keeps the engine's colour and B takes a darker shade of it, hatched,
    so the two runs never share a colour."""
    ca, cb = run_color(*a, 0), run_color(*b, 1)
    if ca.lower() != cb.lower():
        return ca, cb, False
    return ca, shade(ca, _SAME_ENGINE_SHADE), True


def plot_scale(metric: Metric) -> tuple[float, str]:
    """(factor, unit) from the metric's base unit to the one ``compare.md`` prints it in
    (:func:`noise.unit_of`): seconds as ms, ratios as %."""
    unit = unit_of(metric.key)
    return (1000.0 if unit == "ms" else 100.0 if unit == "%" else 1.0), unit


def _side(row: dict[str, Any], side: str, scale: float) -> tuple[float | None, tuple[float, float] | None]:
    v = row[f"value_{side}"]
    spread = row[f"spread_{side}"]
    return (None if v is None else v * scale), (None if not spread else (spread[0] * scale, spread[1] * scale))


def _cell(ax: Any, row: dict[str, Any], metric: Metric, scale: float, unit: str, colors: tuple[str, str, bool]) -> None:
    """One scenario's two bars on its own axis from 0, each with its whisker and its figure."""
    top = 0.0
    for x, side, color in ((0, "a", colors[0]), (1, "b", colors[1])):
        v, spread = _side(row, side, scale)
        if v is None:
            ax.text(x, 0, "no value", ha="center", va="bottom", fontsize=8, color="#666666")
            continue
        ax.bar([x], [v], width=0.6, color=color, hatch=_HATCH if side == "b" and colors[2] else None,
               edgecolor="white" if side == "b" and colors[2] else color, linewidth=0)
        lo, hi = spread if spread else (v, v)
        if spread:
            ax.errorbar([x], [v], yerr=[[max(0.0, v - lo)], [max(0.0, hi - v)]], fmt="none", ecolor="#333333",
                        capsize=4, linewidth=1)
        top = max(top, v, hi)
        text = human(metric.key, row[f"value_{side}"]) + (f" {unit}" if unit and unit != "%" else unit)
        ax.annotate(text, (x, max(v, hi)), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom",
                    fontsize=8)
    ax.set_ylim(0.0, top * 1.2 if top > 0 and math.isfinite(top) else 1.0)
    ax.set_xlim(-0.6, 1.6)
    ax.set_xticks([0, 1])
    ax.set_xticklabels(["A", "B"], fontsize=8)
    ax.set_xlabel(textwrap.fill(row["verdict"] or "-", 24), fontsize=8)
    ax.set_title(textwrap.fill(str(row["scenario"]), 28), fontsize=9)
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(True, axis="y", color="#e5e5e5", linewidth=0.6)
    ax.set_axisbelow(True)


def metric_figure(rows: list[dict[str, Any]], metric: Metric, a: tuple[str, Sequence[str]],
                  b: tuple[str, Sequence[str]]) -> Any:
    """The figure of one metric: one axis per cell (``rows`` in order), in :func:`plot_scale`'s
    unit; ``a`` and ``b``: each run's (label, engines).  The caller closes it."""
    scale, unit = plot_scale(metric)
    colors = run_colors(a, b)
    n = max(1, len(rows))
    cols = min(n, CELLS_PER_ROW)
    lines = math.ceil(n / cols)
    fig, axes = plt.subplots(lines, cols, figsize=(max(7.0, 2.3 * cols + 2.6), 1.3 + 3.0 * lines), dpi=100,
                             facecolor="white", squeeze=False, layout="constrained")
    for i, ax in enumerate(axes.flat):
        if i >= len(rows):
            ax.set_visible(False)
            continue
        _cell(ax, rows[i], metric, scale, unit, colors)
        if i % cols == 0:
            ax.set_ylabel(unit or "ratio", fontsize=8)
    direction = "higher is better" if metric.higher_is_better else "lower is better"
    fig.suptitle(f"{metric.title} ({unit or 'ratio'}; {direction}): B = {b[0]} against A = {a[0]}\n"
                 "bars: median of rounds; whiskers: min–max over rounds\n"
                 "each scenario on its own axis from 0; below each: the verdict", fontsize=9, x=0.01, ha="left")
    handles = [Patch(facecolor=colors[0], label=f"A: {a[0]}"),
               Patch(facecolor=colors[1], hatch=_HATCH if colors[2] else None, edgecolor="white" if colors[2] else None,
                     label=f"B: {b[0]}")]
    fig.legend(handles=handles, fontsize=8, frameon=False, loc="outside lower center", ncols=2)
    return fig


def plot_metric(rows: list[dict[str, Any]], metric: Metric, a: tuple[str, Sequence[str]],
                b: tuple[str, Sequence[str]], path: Path) -> Path:
    """``a`` and ``b``: each run's (label, engines)."""
    fig = metric_figure(rows, metric, a, b)
    fig.savefig(path, facecolor="white")
    plt.close(fig)
    return path
