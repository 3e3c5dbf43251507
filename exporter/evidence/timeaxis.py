"""The time axis of the PNG boards (``evidence export``'s and the report's): round tick times, and a
dotted line where each round began, labelled ``scenario#round``, from the announcements in the
records' ``scenarios.jsonl`` (warm-ups apart).  One drawing for every board."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .runs import Announcement, ScenarioLogError, read_announcements, scenario_log_path

__all__ = ["date_num", "time_ticks", "round_marks", "draw_marks", "mark_label", "MARK_COLOR"]

MARK_COLOR = "#666666"
_TICK_STEPS_S = (1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def date_num(ts: float) -> float:
    """Unix seconds as matplotlib's date number (the boards' x axes are dates, in UTC)."""
    from matplotlib.dates import date2num

    return float(date2num(dt.datetime.fromtimestamp(ts, dt.timezone.utc)))


def time_ticks(start: float, end: float, most: int) -> list[float]:
    """At most ``most`` round times (whole multiples of a step of 1 s .. 1 day) in ``[start, end]``:
    as many labels as the plot's width holds without overlap."""
    span = max(end - start, 1.0)
    step = next((s for s in _TICK_STEPS_S if span / s < most), _TICK_STEPS_S[-1])
    first = math.ceil(start / step) * step
    return [float(t) for t in range(int(first), int(end) + 1, step)]


def round_marks(records_dir: Path | None, run: str | None, engine: str | None, start: float,
                end: float) -> list[Announcement]:
    """The round announcements that began inside ``start``..``end``, warm-ups apart: of ``run``
    (None: any) and ``engine`` (None: every engine), from the ``scenarios.jsonl`` beside the records
    (none where there is none, or it cannot be read)."""
    if records_dir is None:
        return []
    path = scenario_log_path(records_dir)
    if not path.is_file():
        return []
    try:
        spans = read_announcements(path).spans
    except ScenarioLogError:
        return []
    return [a for a in spans if (engine is None or a.engine == engine) and (run is None or a.run == run)
            and start <= a.start <= end and a.scenario != "warmup"]


def mark_label(mark: Announcement, with_engine: bool) -> str:
    """``scenario#round``, or ``engine scenario#round`` where a board holds several engines' rounds."""
    return (f"{mark.engine} " if with_engine else "") + f"{mark.scenario}#{mark.round}"


def draw_marks(ax: Any, marks: Sequence[Announcement], label: bool) -> None:
    """A dotted line at each round's start on a date axis; with ``label``, its ``scenario#round``
    (the engine's name before it where the marks are of several engines) along the line's top."""
    several = len({m.engine for m in marks}) > 1
    for m in marks:
        x = date_num(m.start)
        ax.axvline(x, color=MARK_COLOR, linestyle=":", linewidth=0.8, zorder=1)
        if label:
            ax.annotate(mark_label(m, several), (x, 1.0), xycoords=("data", "axes fraction"), rotation=90,
                        fontsize=6, va="top", ha="right", color="#444444",
                        bbox={"facecolor": "white", "alpha": 0.75, "edgecolor": "none", "pad": 0.6})
