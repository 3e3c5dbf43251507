"""``evidence summarize --engine-log DIR``: SGLang's own clock per request, joined to the records.

SGLang started with ``--enable-metrics --export-metrics-to-file --export-metrics-to-file-dir DIR``
writes one JSON line per finished request to ``DIR/sglang-request-metrics-YYYYMMDD_HH.log`` (a new
file each hour: every one is read).  A line's ``id`` is the response id the proxy records as
``response_id``; the records it matches get ``engine_queue_s``, ``engine_prefill_s``,
``engine_decode_s``, ``ttft_outside_engine_s`` and ``engine_timing: "engine-log"``
(:func:`exporter.core.enginetime.from_sglang_line`).  A line that matches no record (SGLang's own
start-up warm-up, a request that did not pass this proxy) is counted, not an error.  A line that
lacks a stamp leaves its part unset, and the report says which parts are missing for how many
requests rather than guess them.

The lines also hold the request's parameters, prompt included: of each line only its ``id`` and
the timing :func:`from_sglang_line` reads are kept, and nothing else of it reaches any output (the
report holds counts and the directories' names only).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter.core.enginetime import EngineTiming, from_sglang_line, missing_parts, outside_engine

__all__ = ["EngineLogError", "EngineLog", "read_engine_log", "join_engine_log", "join_dirs", "engine_log_lines",
           "FILE_GLOB"]

FILE_GLOB = "sglang-request-metrics-*.log"
SOURCE = "engine-log"


class EngineLogError(ValueError):
    """A directory that holds no SGLang request-metrics file, or one that cannot be read."""


@dataclass
class EngineLog:
    """What the files said: each response id's timing (None: a line without any stamp), and counts."""

    dirs: list[str]
    files: int = 0
    lines: int = 0
    unreadable: int = 0  # not a JSON object, or no string id: counted, never shown
    duplicates: int = 0  # an id seen again: the first line wins
    timings: dict[str, EngineTiming | None] = field(default_factory=dict)


def _files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise EngineLogError(f"--engine-log {directory}: not a directory (give the directory SGLang was started "
                             "with: --export-metrics-to-file-dir DIR)")
    files = sorted(directory.glob(FILE_GLOB))
    if not files:
        raise EngineLogError(f"--engine-log {directory}: no {FILE_GLOB} in it (was SGLang started with "
                             f"--export-metrics-to-file --export-metrics-to-file-dir {directory}?)")
    return files


def _read_file(path: Path, log: EngineLog) -> None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for raw in fh:
                if not raw.strip():
                    continue
                log.lines += 1
                try:
                    line = json.loads(raw)
                except ValueError:
                    line = None
                rid = line.get("id") if isinstance(line, dict) else None
                if not isinstance(rid, str):
                    log.unreadable += 1
                elif rid in log.timings:
                    log.duplicates += 1
                else:
                    log.timings[rid] = from_sglang_line(line)
    except OSError as exc:
        raise EngineLogError(f"--engine-log: cannot read {path}: {exc.strerror or exc}") from None


def read_engine_log(dirs: Sequence[Path]) -> EngineLog:
    """Every request-metrics file of every directory, in name order (the hours in turn)."""
    log = EngineLog([str(d) for d in dirs])
    for directory in dirs:
        for path in _files(directory):
            log.files += 1
            _read_file(path, log)
    return log


def _joined(record: Mapping[str, Any], timing: EngineTiming) -> dict[str, Any]:
    ttft = record.get("ttft_s")
    outside = outside_engine(float(ttft) if isinstance(ttft, (int, float)) else None, timing)
    return {**record, **timing.fields(), "ttft_outside_engine_s": None if outside is None else round(outside, 6)}


def join_engine_log(records: Sequence[Mapping[str, Any]], log: EngineLog) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The records, those with a line joined to it, and the report (counts only).  A record that
    already has the engine's timing from the stream keeps it."""
    out: list[dict[str, Any]] = []
    matched: set[str] = set()
    missing: Counter[str] = Counter()
    joined = kept = 0
    for record in records:
        rid = record.get("response_id")
        if not isinstance(rid, str) or rid not in log.timings:
            out.append(dict(record))
            continue
        matched.add(rid)
        timing = log.timings[rid]
        parts = missing_parts(timing)
        if parts:
            missing[", ".join(parts)] += 1
        if record.get("engine_timing") is not None:
            kept += 1
            out.append(dict(record))
        elif timing is None:
            out.append(dict(record))
        else:
            joined += 1
            out.append(_joined(record, timing))
    report = {"dirs": log.dirs, "files": log.files, "lines": log.lines, "matched": len(matched),
              "joined": joined, "kept_stream_timing": kept, "matched_no_record": len(log.timings) - len(matched),
              "unreadable": log.unreadable, "duplicates": log.duplicates, "missing_parts": dict(missing)}
    return out, report


def _n(count: int, what: str) -> str:
    return f"{count} {what}" + ("" if count == 1 else "s")


def engine_log_lines(report: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(notes, warnings): what the join did, and a ``warning:`` per set of missing parts."""
    dirs = ", ".join(report["dirs"])
    notes = [f"engine log {dirs}: {_n(report['files'], 'file')}, {_n(report['lines'], 'line')}; {report['matched']} "
             f"matched a record by its response id ({report['joined']} joined); {report['matched_no_record']} "
             "matched none (SGLang's own start-up warm-up, or requests that did not pass this proxy)"]
    if report["kept_stream_timing"]:
        notes.append(f"{_n(report['kept_stream_timing'], 'record')} kept the engine timing of their stream")
    if report["unreadable"] or report["duplicates"]:
        notes.append(f"{_n(report['unreadable'], 'line')} without a JSON object and a string id, "
                     f"{_n(report['duplicates'], 'repeated id')} (the first line kept)")
    warnings = [f"warning: {_n(n, 'request')}: engine log has no {parts} (was SGLang started with --enable-metrics?)"
                for parts, n in sorted(report["missing_parts"].items())]
    return notes, warnings


def join_dirs(records: Sequence[Mapping[str, Any]], dirs: Sequence[Path]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """:func:`read_engine_log` of ``dirs``, then :func:`join_engine_log`."""
    return join_engine_log(records, read_engine_log(dirs))
