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
from typing import Any

from ..runs import Announcement, ScenarioLogError, read_announcements, scenario_log_path
from .doc import Figure
from .figures import png, pyplot

__all__ = ["engine_board", "round_marks", "PANELS"]

#: (panel file, title, scale, unit)
PANELS = (("ttft_p95", "TTFT P95", 1000.0, "ms"), ("tpot_p95", "TPOT P95", 1000.0, "ms"),
          ("throughput", "Successful output throughput", 1.0, "tok/s"), ("in_flight", "Requests in flight", 1.0, ""))


def round_marks(records_dir: Path | None, run: str, engine: str, start: float, end: float) -> list[Announcement]:
    """The engine's round announcements of ``run`` that began inside the window (warm-ups apart)."""
    if records_dir is None:
        return []
    path = scenario_log_path(records_dir)
    if not path.is_file():
        return []
    try:
        spans = read_announcements(path).spans
    except ScenarioLogError:
        return []
    return [a for a in spans if a.engine == engine and a.run == run and start <= a.start <= end
            and a.scenario != "warmup"]


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


def _marks(ax: Any, marks: Sequence[Announcement], label: bool) -> None:
    for a in marks:
        ax.axvline(datetime.fromtimestamp(a.start, timezone.utc), color="#666", linestyle=":", linewidth=0.8)
        if label:
            ax.annotate(f"{a.scenario}#{a.round}", (datetime.fromtimestamp(a.start, timezone.utc), 1.0),
                        xycoords=("data", "axes fraction"), rotation=90, fontsize=6, va="top", ha="right",
                        color="#444")


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
        _marks(ax, marks, label=i < 2)
        ax.set_title(f"{title} ({unit})" if unit else title, fontsize=9)
        ax.set_xlim(datetime.fromtimestamp(window[0], timezone.utc), datetime.fromtimestamp(window[1], timezone.utc))
        ax.set_ylim(bottom=0)
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
