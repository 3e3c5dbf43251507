"""Exact merge of several proxies' records.

Each proxy writes its own ``requests.jsonl``.  Percentiles over several proxies cannot be
recovered from their histograms (bucket bounds only bound them), but they can from the
requests: the union of the records is one population, and every figure of the round tables
is computed from it exactly.  Records of the same engine, scenario and round from different
proxies form one round (its duration from the first start to the last end over all of them).

Each proxy start is a run with its own ``run_id``, so the proxies of one experiment have one run
id each: runs of different directories whose spans (first start to last end) overlap in time are
one run, named by their ids joined with ``+`` (:func:`join_runs`).  Runs of one directory never
merge: they are successive ``serve`` starts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .runs import run_of

__all__ = ["load_records", "load_many", "join_runs", "MergeError"]


class MergeError(ValueError):
    """A records directory that cannot be read; the message names it and the cause."""


def load_records(path: Path) -> list[dict[str, Any]]:
    """Records from a directory's ``requests.jsonl`` (or the file itself); bad lines are reported."""
    file = path / "requests.jsonl" if path.is_dir() else path
    records = []
    try:
        with open(file, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    raise MergeError(f"{file}:{n}: not a JSON line") from None
                if not isinstance(rec, dict):
                    raise MergeError(f"{file}:{n}: not a JSON object")
                records.append(rec)
    except FileNotFoundError:
        raise MergeError(f"no records at {file}: give a records directory (with requests.jsonl) or the file") from None
    except OSError as exc:
        raise MergeError(f"cannot read {file}: {exc.strerror or exc}") from None
    return records


def load_many(paths: Sequence[Path]) -> tuple[list[dict[str, Any]], list[str]]:
    """The union of the records of every path, and notes on what was merged.

    The same request seen twice (one directory given twice, or a copy) is counted once:
    records are told apart by their ``id``.
    """
    seen: set[str] = set()
    merged: list[dict[str, Any]] = []
    notes: list[str] = []
    origin: list[int] = []
    for index, path in enumerate(paths):
        records = load_records(path)
        dupes = 0
        for rec in records:
            rid = rec.get("id")
            if isinstance(rid, str):
                if rid in seen:
                    dupes += 1
                    continue
                seen.add(rid)
            merged.append(rec)
            origin.append(index)
        notes.append(f"{path}: {len(records)} records" + (f", {dupes} already seen (counted once)" if dupes else ""))
    notes += join_runs(merged, origin)
    return merged, notes


def _spans(records: Sequence[dict[str, Any]], origin: Sequence[int]) -> dict[tuple[int, str], list[float]]:
    spans: dict[tuple[int, str], list[float]] = {}
    for rec, where in zip(records, origin):
        if rec.get("start_unix") is None:
            continue
        start = float(rec["start_unix"])
        end = start + float(rec.get("e2e_s") or 0.0)
        span = spans.setdefault((where, run_of(rec)), [start, end])
        span[0], span[1] = min(span[0], start), max(span[1], end)
    return spans


def join_runs(records: list[dict[str, Any]], origin: Sequence[int]) -> list[str]:
    """Give the runs of different directories (``origin``: each record's directory) that overlap
    in time one ``run_id``, their ids joined with ``+``; returns a note per joined run."""
    spans = _spans(records, origin)
    keys = sorted(spans, key=lambda k: spans[k][0])
    groups: list[list[tuple[int, str]]] = []
    for key in keys:
        for group in groups:
            if all(other[0] != key[0] for other in group) and any(
                    spans[other][0] <= spans[key][1] and spans[key][0] <= spans[other][1] for other in group):
                group.append(key)
                break
        else:
            groups.append([key])
    renamed: dict[tuple[int, str], str] = {}
    notes = []
    for group in groups:
        ids = sorted(dict.fromkeys(run for _, run in group))
        if len(ids) > 1:
            joined = "+".join(ids)
            renamed.update({key: joined for key in group})
            notes.append(f"runs {', '.join(ids)} overlap in time on different proxies: one run, {joined}")
    for i, (rec, where) in enumerate(zip(records, origin)):
        new = renamed.get((where, run_of(rec)))
        if new is not None:
            records[i] = {**rec, "run_id": new}
    return notes
