"""Exact merge of several proxies' records.

Each proxy writes its own ``requests.jsonl``.  Percentiles over several proxies cannot be
recovered from their histograms (bucket bounds only bound them), but they can from the
requests: the union of the records is one population, and every figure of the round tables
is computed from it exactly.  Records of the same engine, scenario and round from different
proxies form one round (its duration from the first start to the last end over all of them).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["load_records", "load_many", "MergeError"]


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
    for path in paths:
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
        notes.append(f"{path}: {len(records)} records" + (f", {dupes} already seen (counted once)" if dupes else ""))
    return merged, notes
