"""``evidence report --format html|md``: the records read once, ``evidence summarize``'s document
built once, every section laid out from it, and the files written with a manifest: ``report.html``
(or ``report.md`` and its PNGs), ``summary.json``, ``rounds.csv`` and ``manifest.json`` with each
file's SHA-256 and the records'."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from exporter import __version__

from ..merge import load_many
from ..outdir import check_out, prepare_out
from ..runs import RunError, refuse_client_side, runs_in, select_run
from ..summarize import summarize, write_rows
from ..windows import iso
from .boards import boards
from .caveats import caveats, history, ttft_section
from .cells import CellInfo, cell_map, plan_stops
from .doc import Items, Para, Section
from .failures import failures
from .figures import concurrency_figures, frontier_figure, sweep_figure
from .model import Report, build
from .page import html_page, markdown_page
from .sections import core_matrix, decode_blocks, rate_sweep, what_ran

__all__ = ["ReportOptions", "ReportError", "write_report", "RECORD_FILES"]

RECORD_FILES = ("requests.jsonl", "scenarios.jsonl", "engines.jsonl")


class ReportError(ValueError):
    """A report that cannot be made: one line."""


@dataclass
class ReportOptions:
    records: list[Path]
    out: Path
    fmt: str = "html"
    run: str | None = None
    prom: Any = None
    baseline: Path | None = None
    plan: Path | None = None
    force: bool = False
    vocabulary: Any = None
    cells: Mapping[str, CellInfo] = field(default_factory=dict)
    stops: Sequence[Mapping[str, Any]] = ()


def _one_run(records: Sequence[Mapping[str, Any]], run: str | None, where: str) -> tuple[list[Mapping[str, Any]], str]:
    chosen = select_run(records, run)
    runs = runs_in(chosen)
    if not runs:
        raise ReportError(f"no records in {where}")
    if len(runs) > 1:
        raise ReportError(f"{where} holds {len(runs)} runs ({', '.join(runs)}): pick one with --run ID")
    return chosen, runs[0]


def _baseline(path: Path) -> dict[str, Any]:
    records, _ = load_many([path])
    chosen, _ = _one_run(records, None, f"--baseline {path}")
    return summarize(chosen, records_dirs=[path])


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _records_hashes(dirs: Sequence[Path]) -> list[dict[str, Any]]:
    out = []
    for d in dirs:
        for name in RECORD_FILES:
            p = d / name if d.is_dir() else d.parent / name
            if p.is_file():
                out.append({"path": str(p), "bytes": p.stat().st_size, "sha256": _sha(p)})
    return out


def _sections(report: Report, records: Sequence[Mapping[str, Any]], opts: ReportOptions,
              baseline: Mapping[str, Any] | None, hashes: list[dict[str, Any]]) -> list[Section]:
    figs = Section("Figures against concurrency", [*concurrency_figures(report)] or [
        Para("No closed-loop cell with a known shape and concurrency: nothing to plot against concurrency.")])
    frontier = frontier_figure(report)
    inter = Section("Throughput against interactivity", [frontier] if frontier else [
        Para("No cell with a TPOT and a throughput: no frontier.")])
    sweep = rate_sweep(report, [*opts.stops, *plan_stops(opts.plan)])
    if (fig := sweep_figure(report)) is not None:
        sweep.blocks.insert(0, fig)
    records_dir = opts.records[0] if opts.records[0].is_dir() else opts.records[0].parent
    attach = Section("Attachments", [Items((
        "summary.json: evidence summarize's document of this run, and the report's totals and cells",
        "rounds.csv: one row per round (base units, named in the columns)",
        "manifest.json: every file's SHA-256, and the records' below",
        *(f"{h['path']}: {h['bytes']} bytes, SHA-256 {h['sha256']}" for h in hashes)))])
    core = core_matrix(report)
    core.blocks += decode_blocks(report)  # per cell decode, and embeddings/rerank apart
    return [what_ran(report), core, figs, inter, sweep, ttft_section(report),
            failures(report, records, [p if p.is_dir() else p.parent for p in opts.records], opts.vocabulary),
            boards(report, records, records_dir, opts.prom, opts.out), caveats(report, opts.prom is not None),
            attach, history(report, baseline, str(opts.baseline) if opts.baseline else None)]


def _manifest(out: Path, hashes: list[dict[str, Any]], report: Report) -> dict[str, Any]:
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "manifest.json")
    return {"tool": "llm-bench-exporter evidence report", "version": __version__, "created_utc": iso(time.time()),
            "run_id": report.run_id, "engines": report.engines,
            "files": [{"path": str(p.relative_to(out)), "bytes": p.stat().st_size, "sha256": _sha(p)} for p in files],
            "records": hashes}


def write_report(opts: ReportOptions) -> dict[str, Any]:
    """Write the report; returns the manifest.  ReportError, OutDirError, MergeError, RunError,
    CellsError for a mistake of the user's (one line each)."""
    check_out(opts.out, opts.force)
    records, _ = load_many(opts.records)
    try:
        refuse_client_side(records, ", ".join(map(str, opts.records)))
        chosen, _ = _one_run(records, opts.run, ", ".join(map(str, opts.records)))
    except RunError as exc:
        raise ReportError(str(exc)) from None
    cells = cell_map(opts.records, opts.plan, opts.cells)
    summary = summarize(chosen, opts.prom, run=opts.run, records_dirs=opts.records)
    report = build(summary, chosen, cells)
    baseline = _baseline(opts.baseline) if opts.baseline is not None else None
    hashes = _records_hashes(opts.records)
    prepare_out(opts.out, opts.force)
    sections = _sections(report, chosen, opts, baseline, hashes)
    title = f"LLM serving benchmark: {' vs '.join(report.engines) or 'no engine'}"
    subtitle = (f"run {report.run_id}; generated {iso(time.time())} by llm-bench-exporter {__version__} from "
                f"{', '.join(map(str, opts.records))}")
    if opts.fmt == "md":
        (opts.out / "report.md").write_text(markdown_page(title, subtitle, sections, opts.out), encoding="utf-8")
    else:
        (opts.out / "report.html").write_text(html_page(title, subtitle, sections), encoding="utf-8")
    doc = {**summary, "report": {"totals": report.totals, "cells": {k: asdict(v) for k, v in cells.items()},
                                 "calibration": report.calibration}}
    (opts.out / "summary.json").write_text(json.dumps(doc, indent=1, default=str), encoding="utf-8")
    write_rows(opts.out / "rounds.csv", summary.get("rounds") or [])
    manifest = _manifest(opts.out, hashes, report)
    (opts.out / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return manifest
