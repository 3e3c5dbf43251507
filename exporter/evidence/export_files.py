"""The files of an export: each panel's data (``data/BOARD/PANEL.csv`` and ``.json``) and each
board's PNG (:func:`.render.render_board`), with what its panels' titles add (a rate over a window
shorter than its rate window, :func:`.totals.rate_mark`), the filters in its subtitle, and a dotted
line where each round began (``scenario#round``, from the records' ``scenarios.jsonl``)."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dashboards.catalogue import Board, Panel

from .evidence_md import QueryEvidence
from .promapi import parse_duration
from .render import render_board
from .runs import Announcement
from .totals import rate_mark
from .windows import Window, iso

__all__ = ["BoardLook", "board_files", "write_data"]


@dataclass(frozen=True)
class BoardLook:
    """What the PNGs show beside the series: ``scenario``, ``engine``: the filters (None: every
    value); ``totals``: the export has round totals (a rate panel's title points there); ``short``:
    what a rate panel's window is held against (:func:`.totals.shortest_span`); ``rounds``: the
    rounds marked; ``png``: whether the PNGs are drawn at all (False: the data files only)."""

    scenario: str | None
    totals: bool
    short: tuple[float, str]
    rounds: Sequence[Announcement] = ()
    engine: str | None = None
    png: bool = True

    def subtitle(self, step: float, rw: str) -> str:
        filters = [f"{name} filter: {value}" for name, value in (("scenario", self.scenario), ("engine", self.engine))
                   if value]
        marked = [f"{len(self.rounds)} rounds marked (dotted: where each began)"] if self.rounds else []
        return ", ".join([f"step {step:g} s, rate window {rw}", *filters, *marked])


def write_data(out: Path, board: str, panel: Panel, evs: list[QueryEvidence], window: Window, step: float) -> list[Path]:
    """A panel's ``data/BOARD/PANEL.csv`` and ``.json``: every query's series, as queried."""
    base = out / "data" / board
    base.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = base / f"{panel.key}.csv", base / f"{panel.key}.json"
    with open(csv_path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["query", "series", "time_unix", "time_utc", "value"])
        for ev in evs:
            for s in ev.series:
                for t, v in zip(s["times"], s["values"]):
                    w.writerow([ev.ref, s["name"], f"{t:.3f}", iso(t), repr(v)])
    doc = {
        "board": board, "panel": panel.key, "title": panel.title, "unit": panel.unit,
        "window": {"start": window.start, "end": window.end, "start_utc": iso(window.start), "end_utc": iso(window.end)},
        "step_s": step,
        "queries": [{"ref": ev.ref, "expr": ev.expr, "legend": ev.legend,
                     **({"first_bucket_bound": ev.first_bucket, "points_below_first_bucket_bound": ev.in_first_bucket}
                        if ev.first_bucket is not None else {}),
                     **({"evaluated": {"at": ev.span.at, "range_s": ev.span.range_s, "widened": True}} if ev.span else {}),
                     "series": [{"name": s["name"], "labels": s["labels"],
                                 "values": [[t, None if math.isnan(v) else v] for t, v in zip(s["times"], s["values"])]}
                                for s in ev.series]} for ev in evs],
    }
    json_path.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return [csv_path, json_path]




def board_files(out: Path, boards: dict[str, Board], results: dict[str, dict[str, list[QueryEvidence]]],
                window: Window, step: float, rw: str, look: BoardLook) -> list[Path]:
    """The data files and the PNG of each board of ``results`` (no PNG where ``look.png`` is False)."""
    files: list[Path] = []
    span, what = look.short
    for b, panels in results.items():
        board = boards[b]
        for panel in board.panels:
            files += write_data(out, b, panel, panels[panel.key], window, step)
        if not look.png:
            continue
        data = {key: [{**s, "ref": ev.ref} for ev in evs for s in ev.series] for key, evs in panels.items()}
        marks = {p.key: m for p in board.panels
                 if (m := rate_mark(p, span, parse_duration(rw), rw, look.totals, what))}
        files.append(render_board(board, data, (window.start, window.end), out / f"{b}.png",
                                  subtitle=look.subtitle(step, rw), marks=marks, rounds=look.rounds))
    return files
