"""One PNG per metric for ``evidence compare``: A and B side by side per scenario, the bar at
the median of rounds, the whisker from the rounds' min to max."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dashboards.catalogue import ENGINE_COLORS  # noqa: E402

from .noise import Metric  # noqa: E402

__all__ = ["plot_metric", "run_color"]

#: Colours of runs that are not one known engine each.
_OTHER = ("#2ca02c", "#9467bd")


def run_color(label: str, engines: Sequence[str], index: int) -> str:
    """SGLang blue and vLLM orange where a run is one of them; green (A) and purple (B) otherwise."""
    if len(engines) == 1 and engines[0] in ENGINE_COLORS:
        return ENGINE_COLORS[engines[0]]
    return ENGINE_COLORS.get(label.lower(), _OTHER[index])


def _bars(ax: Any, rows: list[dict[str, Any]], side: str, x: list[float], color: str, label: str) -> None:
    values = [r[f"value_{side}"] if r[f"value_{side}"] is not None else 0.0 for r in rows]
    lo = [max(0.0, v - (r[f"spread_{side}"] or [v, v])[0]) for v, r in zip(values, rows)]
    hi = [max(0.0, (r[f"spread_{side}"] or [v, v])[1] - v) for v, r in zip(values, rows)]
    ax.bar(x, values, width=0.38, color=color, label=label)
    ax.errorbar(x, values, yerr=[lo, hi], fmt="none", ecolor="#333333", capsize=4, linewidth=1)


def _y_from_zero(ax: Any, rows: list[dict[str, Any]]) -> None:
    """Bars from 0; where every value and whisker is 0 (no failures), 0 at the bottom of a unit axis,
    not in the middle of matplotlib's -0.05..0.05."""
    top = max([0.0] + [v for r in rows for side in "ab" for v in
                        [r[f"value_{side}"] or 0.0, *(r[f"spread_{side}"] or [])] if v is not None])
    ax.set_ylim(0.0, top * 1.12 if top > 0 else 1.0)


def plot_metric(rows: list[dict[str, Any]], metric: Metric, a: tuple[str, Sequence[str]],
                b: tuple[str, Sequence[str]], path: Path) -> Path:
    """``a`` and ``b``: each run's (label, engines)."""
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(rows) + 2), 4.5), dpi=100, facecolor="white")
    xs = list(range(len(rows)))
    _bars(ax, rows, "a", [x - 0.2 for x in xs], run_color(*a, 0), f"A: {a[0]}")
    _bars(ax, rows, "b", [x + 0.2 for x in xs], run_color(*b, 1), f"B: {b[0]}")
    ax.set_xticks(xs)
    # a long verdict ("one round: no noise estimate") wrapped under its own bars, not into the next
    ax.set_xticklabels([f"{r['scenario']}\n{textwrap.fill(r['verdict'] or '-', 16)}" for r in rows], fontsize=8)
    direction = "higher is better" if metric.higher_is_better else "lower is better"
    ax.set_title(f"{metric.title} ({metric.unit or 'ratio'}; {direction}): B = {b[0]} against A = {a[0]}\n"
                 "bars: median of rounds; whiskers: min–max over rounds; below: the verdict", fontsize=9, loc="left")
    ax.grid(True, axis="y", color="#e5e5e5", linewidth=0.6)
    _y_from_zero(ax, rows)
    # beside the bars, never over them
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    width = fig.get_size_inches()[0]
    fig.subplots_adjust(left=0.1, right=1 - 1.5 / width, top=0.88, bottom=0.17)
    fig.savefig(path, facecolor="white")
    plt.close(fig)
    return path
