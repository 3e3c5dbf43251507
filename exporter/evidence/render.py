"""PNG boards for reports, with matplotlib: the Grafana panel grid in a light layout."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.dates import DateFormatter, date2num  # noqa: E402

from dashboards.boards import layout  # noqa: E402
from dashboards.catalogue import ENGINE_COLORS, LINE_STYLES, Board  # noqa: E402

__all__ = ["render_board", "png_size", "PX_PER_ROW", "WIDTH_PX", "DPI"]

DPI = 100
WIDTH_PX = 1600
PX_PER_ROW = 36  # one Grafana grid row (30 px there) plus room for titles
HEADER_PX = 90

_MPL_STYLE = {"dash": "--", "dot": ":"}
_UNIT_SCALE = {"percentunit": (100.0, "%"), "percent": (1.0, "%"), "s": (1.0, "s"), "gbytes": (1.0, "GiB"),
               "hertz": (1e-9, "GHz"), "watt": (1.0, "W"), "celsius": (1.0, "°C"), "short": (1.0, ""),
               "suffix: tok/s": (1.0, "tok/s")}


def png_size(board: Board) -> tuple[int, int]:
    rows = max(p.y + p.h for p in layout(board))
    return WIDTH_PX, HEADER_PX + rows * PX_PER_ROW


def _rect(pos: Any, w: int, h: int) -> tuple[float, float, float, float]:
    """Axes rectangle (figure fractions) inside a grid cell, leaving room for title and ticks."""
    left_px = 20 + pos.x / 24 * (w - 40) + 45
    width_px = pos.w / 24 * (w - 40) - 60
    top_px = HEADER_PX + pos.y * PX_PER_ROW + 24
    height_px = pos.h * PX_PER_ROW - 24 - 30
    return (left_px / w, 1 - (top_px + height_px) / h, width_px / w, height_px / h)


def _num(ts: float) -> float:
    import datetime as dt

    return float(date2num(dt.datetime.fromtimestamp(ts, dt.timezone.utc)))


def _color(name: str) -> str | None:
    for engine, color in ENGINE_COLORS.items():
        if name.startswith(engine):
            return color
    return None


def render_board(board: Board, data: dict[str, list[dict[str, Any]]], window: tuple[float, float],
                 out: Path, subtitle: str = "") -> Path:
    """``data``: panel key -> series ``[{"name", "times" (unix s), "values"}]``."""
    import datetime as dt

    w, h = png_size(board)
    fig = plt.figure(figsize=(w / DPI, h / DPI), dpi=DPI, facecolor="white")
    start, end = window
    fmt = "%Y-%m-%d %H:%M:%S UTC"
    span = (f"{dt.datetime.fromtimestamp(start, dt.timezone.utc):{fmt}} — "
            f"{dt.datetime.fromtimestamp(end, dt.timezone.utc):{fmt}}  (unix {start:.0f}–{end:.0f})")
    fig.suptitle(f"{board.title}\n{span}" + (f"\n{subtitle}" if subtitle else ""), fontsize=12,
                 y=1 - 8 / h, va="top")
    for panel, pos in zip(board.panels, layout(board)):
        ax = fig.add_axes(_rect(pos, w, h))
        scale, unit = _UNIT_SCALE.get(panel.unit, (1.0, panel.unit))
        ax.set_title(f"{panel.title}" + (f" ({unit})" if unit else ""), fontsize=10, loc="left")
        series = data.get(panel.key, [])
        if panel.kind == "stat":
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
                        color=_color(name) or "#333333", transform=ax.transAxes, va="center")
            continue
        ax.set_facecolor("white")
        ax.grid(True, color="#e5e5e5", linewidth=0.6)
        for s in series:
            times = [_num(t) for t in s["times"]]
            style = next((_MPL_STYLE[v] for k, v in LINE_STYLES.items() if k in s["name"]), "-")
            ax.plot(times, [v * scale for v in s["values"]], label=s["name"], color=_color(s["name"]),
                    linewidth=1.6, linestyle=style)
        for threshold in panel.thresholds:
            ax.axhline(threshold * scale, color="#d62728", linestyle="--", linewidth=0.9)
        ax.set_xlim(_num(start), _num(end))
        ax.xaxis.set_major_formatter(DateFormatter("%H:%M:%S", tz=dt.timezone.utc))
        ax.tick_params(labelsize=8)
        if series:
            ax.legend(fontsize=8, loc="upper left", frameon=False, ncol=2)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", color="#888888", transform=ax.transAxes)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI, facecolor="white")
    plt.close(fig)
    return out
