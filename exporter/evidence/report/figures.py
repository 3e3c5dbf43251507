"""The report's figures (PNG bytes, matplotlib's Agg): each metric against concurrency per shape
with min–max whiskers over rounds, throughput against interactivity with each engine's frontier,
and the rate sweep's SLO attainment against rate.  Every point is a median of rounds that
``evidence summarize`` computed; the whiskers are its ``spread``."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from .doc import Figure
from .model import Report

__all__ = ["concurrency_figures", "frontier_figure", "sweep_figure", "pareto", "pyplot", "png", "FIGURE_METRICS"]

#: (summary key, title, scale, unit)
FIGURE_METRICS = (("ttft_p95_s", "TTFT P95", 1000.0, "ms"), ("tpot_p95_s", "TPOT P95", 1000.0, "ms"),
                  ("output_throughput_tok_s", "Output throughput", 1.0, "tok/s"),
                  ("success_ratio", "Success", 100.0, "%"))


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, facecolor="white", metadata={"Software": None})
    pyplot().close(fig)
    return buf.getvalue()


def _errs(value: float, spread: Sequence[float] | None, scale: float) -> tuple[float, float]:
    if not spread:
        return 0.0, 0.0
    return max(0.0, (value - spread[0]) * scale), max(0.0, (spread[1] - value) * scale)


def _series(report: Report, shape: str, engine: str, key: str, scale: float) -> tuple[list[int], list[float], list[tuple[float, float]]]:
    xs, ys, errs = [], [], []
    for c in report.concurrencies(shape):
        cell = report.matrix.get((shape, c), {}).get(engine)
        if cell is None:
            continue
        value, spread = cell.value(key)
        if value is None:
            continue
        xs.append(c)
        ys.append(value * scale)
        errs.append(_errs(value, spread, scale))
    return xs, ys, errs


def _metric_figure(report: Report, key: str, title: str, scale: float, unit: str) -> Figure:
    plt = pyplot()
    shapes = report.shapes
    fig, axes = plt.subplots(1, len(shapes), figsize=(3.6 * len(shapes) + 1.2, 3.3), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        for engine in report.engines:
            xs, ys, errs = _series(report, shape, engine, key, scale)
            if xs:
                ax.errorbar(xs, ys, yerr=[[e[0] for e in errs], [e[1] for e in errs]], marker="o", capsize=4,
                            color=report.color(engine), label=engine)
        ax.set_xscale("log", base=2)
        ticks = report.concurrencies(shape)
        ax.set_xticks(ticks, [f"C{c}" for c in ticks])
        ax.minorticks_off()
        ax.set_title(f"input/output {shape} tokens", fontsize=9)
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel(f"{title} ({unit})")
        ax.set_ylim(0, max(ax.get_ylim()[1] * 1.15, 1e-9))  # room above the points for the legend
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8, loc="upper left", ncols=2)
    fig.suptitle(f"{title} against concurrency: median of rounds, whiskers min–max over rounds", fontsize=10)
    fig.tight_layout()
    return Figure(f"fig-{key}.png", png(fig), f"{title} ({unit}) against concurrency per shape; each point the "
                  "median of rounds, its whiskers the rounds' min and max.", f"{title} against concurrency")


def concurrency_figures(report: Report) -> list[Figure]:
    if not report.matrix:
        return []
    return [_metric_figure(report, *m) for m in FIGURE_METRICS]


def pareto(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats in both coordinates (higher is better in both), by x."""
    front = [p for p in points if not any(q[0] >= p[0] and q[1] >= p[1] and q != p for q in points)]
    return sorted(set(front))


def _frontier_points(report: Report, engine: str, shape: str) -> list[tuple[float, float, str]]:
    out = []
    for c in report.concurrencies(shape):
        cell = report.matrix.get((shape, c), {}).get(engine)
        if cell is None:
            continue
        tpot, tput = cell.median.get("tpot_p50_s"), cell.median.get("output_throughput_tok_s")
        if tpot and tput:
            out.append((1.0 / tpot, float(tput), f"C{c}"))
    return out


def _frontier_axes(ax: Any, report: Report, shape: str) -> bool:
    drawn = False
    for engine in report.engines:
        pts = _frontier_points(report, engine, shape)
        if not pts:
            continue
        drawn = True
        color = report.color(engine)
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], color=color, label=f"{engine} cells", zorder=3)
        for x, y, name in pts:
            ax.annotate(name, (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points")
        front = pareto([(p[0], p[1]) for p in pts])
        ax.plot([p[0] for p in front], [p[1] for p in front], color=color, linestyle="--", label=f"{engine} frontier")
    ax.set_title(f"input/output {shape} tokens", fontsize=9)
    ax.set_xlabel("interactivity: tok/s per user (1 / TPOT P50)")
    ax.set_ylabel("output throughput (tok/s)")
    ax.margins(x=0.15)
    ax.set_ylim(0, max(ax.get_ylim()[1] * 1.2, 1e-9))  # room for the labels and the legend
    ax.grid(alpha=0.3)
    return drawn


def frontier_figure(report: Report) -> Figure | None:
    shapes = report.shapes
    if not shapes:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, len(shapes), figsize=(3.8 * len(shapes) + 1.2, 3.6), squeeze=False)
    drawn = [_frontier_axes(ax, report, shape) for ax, shape in zip(axes[0], shapes)]
    if not any(drawn):
        plt.close(fig)
        return None
    axes[0][drawn.index(True)].legend(fontsize=7)
    fig.suptitle("Throughput against interactivity per shape, across concurrencies (medians of rounds)", fontsize=10)
    fig.tight_layout()
    return Figure("fig-frontier.png", png(fig), "Per shape, each point a concurrency: output throughput against "
                  "1 / TPOT P50, each the median of rounds; the dashed line is each engine's frontier (the points "
                  "no other point of that engine beats in both).", "throughput against interactivity")


def sweep_figure(report: Report) -> Figure | None:
    if not report.sweep:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.0, 3.8))
    rates = sorted(report.sweep)
    for engine in report.engines:
        pts = [(r, report.sweep[r][engine]) for r in rates if engine in report.sweep[r]]
        pts = [(r, m) for r, m in pts if m.get("goodput_ratio") is not None]
        if not pts:
            continue
        ys = [m["goodput_ratio"] * 100 for _, m in pts]
        errs = [_errs(m["goodput_ratio"], (m.get("spread") or {}).get("goodput_ratio"), 100.0) for _, m in pts]
        ax.errorbar([r for r, _ in pts], ys, yerr=[[e[0] for e in errs], [e[1] for e in errs]], marker="o",
                    capsize=4, color=report.color(engine), label=engine)
    ax.set_xlabel("offered rate (requests/s, Poisson)")
    ax.set_ylabel("SLO attainment (%)")
    ax.set_ylim(-2, 102)
    ax.set_title("SLO attainment against rate: failures count as not met", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return Figure("fig-rate-sweep.png", png(fig), "SLO attainment (requests that met the SLO over judged "
                  "requests, failures counted as not met; median of rounds, whiskers min–max) against the "
                  "planned rate.", "SLO attainment against rate")

