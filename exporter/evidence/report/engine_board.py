"""One engine's four-panel board over its own window, with round markers: TTFT P95, TPOT P95,
output throughput and requests in flight, drawn from the panel data that ``evidence export`` wrote
(``data/comparison/PANEL.json``: the same queries, windows and points as its EVIDENCE.md), only
that engine's series; a dotted line where each of its rounds was announced, labelled with its
scenario and round (the phase), from ``scenarios.jsonl``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from ..runs import Announcement
from ..timeaxis import date_num, draw_marks, round_marks, time_ticks
from .doc import Figure
from .figures import png, pyplot

__all__ = ["engine_board", "round_marks", "PANELS"]

#: (panel file, title, scale, unit)
PANELS = (("ttft_p95", "TTFT P95", 1000.0, "ms"), ("tpot_p95", "TPOT P95", 1000.0, "ms"),
          ("throughput", "Successful output throughput", 1.0, "tok/s"), ("in_flight", "Requests in flight", 1.0, ""))


def _series(data_dir: Path, panel: str, engine: str) -> list[tuple[list[float], list[float]]]:
    path = data_dir / f"{panel}.json"
    if not path.is_file():
        return []
    doc = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for query in doc.get("queries") or []:
        for s in query.get("series") or []:
            if (s.get("labels") or {}).get("engine") == engine:
                pts = [(float(t), float(v)) for t, v in s.get("values") or [] if v is not None and v == v]
                out.append(([t for t, _ in pts], [v for _, v in pts]))
    return out


def engine_board(data_dir: Path, engine: str, color: str, window: tuple[float, float],
                 marks: Sequence[Announcement]) -> Figure | None:
    """The board's PNG, or None where the export holds no series of the engine."""
    import matplotlib.dates as mdates

    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(12, 6.4), squeeze=False)
    drawn = False
    for i, (ax, (panel, title, scale, unit)) in enumerate(zip(axes.flat, PANELS)):
        for ts, vs in _series(data_dir, panel, engine):
            drawn = True
            ax.plot([datetime.fromtimestamp(t, timezone.utc) for t in ts], [v * scale for v in vs], color=color)
        draw_marks(ax, marks, label=i < 2)
        ax.set_title(f"{title} ({unit})" if unit else title, fontsize=9)
        ax.set_xlim(datetime.fromtimestamp(window[0], timezone.utc), datetime.fromtimestamp(window[1], timezone.utc))
        ax.set_ylim(bottom=0)
        ax.set_xticks([date_num(t) for t in time_ticks(*window, 6)])  # as many as fit, whole times
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=timezone.utc))
        ax.set_xlabel("time (UTC)", fontsize=8)
        ax.grid(alpha=0.3)
    if not drawn:
        plt.close(fig)
        return None
    fig.suptitle(f"{engine}: its own window, dotted lines where each of its rounds began (scenario#round)",
                 fontsize=10)
    fig.tight_layout()
    return Figure(f"boards/{engine}/board-{engine}.png", png(fig), f"{engine} alone over its own window: "
                  "the comparison board's TTFT P95, TPOT P95, output throughput and requests in flight (its queries "
                  f"and checks in boards/{engine}/EVIDENCE.md), with round markers.", f"{engine} four-panel board")
