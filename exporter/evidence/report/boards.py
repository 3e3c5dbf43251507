"""The boards section: with ``--prometheus``, ``evidence export`` over each engine's own window
(its first request's start to its last one's end) into ``boards/<engine>/``, the comparison and
GPU boards' PNGs shown with their evidence notes (window, step, queries, data-point checks); the
export's files, EVIDENCE.md and manifest.json included, stay beside the report.  Without it, the
section says the boards were not fetched."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..promapi import PromError
from ..windows import Window, iso
from .doc import Figure, Items, Para, Section
from .energy import energy_block
from .engine_board import engine_board, round_marks
from .model import Report

__all__ = ["boards", "engine_window", "BOARDS_SHOWN"]

BOARDS_SHOWN = ("comparison", "gpu")


def engine_window(records: Sequence[Mapping[str, Any]], engine: str, pad_s: float = 5.0) -> Window | None:
    """The engine's own window: its records' first start to last end, padded by a scrape."""
    mine = [r for r in records if r.get("engine") == engine and isinstance(r.get("start_unix"), (int, float))]
    if not mine:
        return None
    start = min(float(r["start_unix"]) for r in mine)
    end = max(float(r["start_unix"]) + float(r.get("e2e_s") or 0.0) for r in mine)
    return Window(start - pad_s, end + pad_s, f"{int(start - pad_s)},{int(end + pad_s) + 1}", source=f"{engine}'s records")


def _notes(manifest: Mapping[str, Any], window: Window) -> list[str]:
    counts = manifest.get("exact_counts") or {}
    return [f"window {iso(window.start)} to {iso(window.end)} (unix {window.start:.0f} to {window.end:.0f}), step "
            f"{manifest.get('step_s')} s ({manifest.get('step_note')})",
            f"{len(manifest.get('files') or [])} files (each panel's query, CSV and JSON, with its series, point, "
            f"gap and NaN counts in EVIDENCE.md); " + (str(manifest["no_series"]) if manifest.get("no_series")
                                                      else "every board has series"),
            *([f"exact counts: {counts['note']}"] if counts.get("note") else []),
            *(str(w) for w in manifest.get("warnings") or [])]


def _one(prom: Any, report: Report, records: Sequence[Mapping[str, Any]], records_dir: Path | None, engine: str,
         out: Path) -> tuple[list[Figure], list[str]]:
    from ..export import ExportError, export
    from ..promapi import PromError

    window = engine_window(records, engine)
    if window is None:
        return [], [f"{engine}: no records, no window"]
    target = out / "boards" / engine
    try:
        manifest = export(prom, window, target, boards=list(BOARDS_SHOWN), progress=False, records=records_dir)
    except (ExportError, PromError, ValueError, OSError) as exc:
        return [], [f"{engine}: boards not exported: {exc}"]
    marks = round_marks(records_dir, report.run_id, engine, window.start, window.end)
    own = engine_board(target / "data" / "comparison", engine, report.color(engine), (window.start, window.end), marks)
    figures = [*([own] if own else []), *(
        Figure(f"boards/{engine}/gpu.png", (target / "gpu.png").read_bytes(), f"{engine}: the GPU board over "
               f"{engine}'s own window (every engine's host GPUs); queries and checks in boards/{engine}/EVIDENCE.md",
               f"{engine} GPU board") for _ in [0] if (target / "gpu.png").is_file())]
    notes = [*_notes(manifest, window), f"{len(marks)} rounds marked; the comparison board of both engines over "
             f"this window: boards/{engine}/comparison.png"]
    return figures, [f"{engine}: {n}" for n in notes]


def boards(report: Report, records: Sequence[Mapping[str, Any]], records_dir: Path | None, prom: Any,
           out: Path) -> Section:
    s = Section("Boards")
    if prom is None:
        s.blocks.append(Para("Not fetched: no --prometheus given. With it, each engine's comparison and GPU boards "
                             "over that engine's own window are exported beside the report (boards/ENGINE/, with "
                             "EVIDENCE.md) and shown here with their evidence notes."))
        return s
    for engine in report.engines:
        figures, notes = _one(prom, report, records, records_dir, engine, out)
        s.blocks.extend(figures)
        s.blocks.append(Items(tuple(notes)))
    try:
        s.blocks.extend(energy_block(report, records, prom))
    except (PromError, OSError) as exc:
        s.blocks.append(Para(f"Energy per output token: withheld, Prometheus did not answer: {exc}"))
    return s
