"""Counters that never go back: the proxy's counts kept in its records directory across restarts.

``serve`` keeps every counter and histogram it exports (the loop-lag histogram and
``llmbench_arrivals_total`` too, which no record holds) in ``metrics-snapshot.json`` in its
``records_dir``: every few seconds while it runs (written in a thread, off the event loop, by a
rename: a snapshot is never half-written), and once more after its workers have exited (exact after
a graceful stop).  A ``serve`` started on the same ``records_dir`` writes the snapshot's values into
a value file of its own (``counter_restored.db``, ``histogram_restored.db``) beside the workers',
so that every scrape adds them to the live counts: each series continues where it stopped (after a
kill -9, where the last periodic snapshot left it).

Two proxies never share a ``records_dir``: ``serve`` holds an exclusive ``flock`` on its
``.llmbench-serve.lock`` for as long as it (or a worker of it) runs, and a second ``serve`` is refused
at start with one line.  A directory without a snapshot (new, or lost) starts every count at 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import glob
import json
import logging
import os
import struct
import time
from pathlib import Path
from typing import Any

__all__ = ["SNAPSHOT", "LOCK", "INTERVAL_S", "RecordsInUse", "lock_records", "read_values", "write_snapshot",
           "restore", "snapshot_forever", "final_snapshot"]

log = logging.getLogger("llmbench")

SNAPSHOT = "metrics-snapshot.json"
LOCK = ".llmbench-serve.lock"
#: seconds between the periodic snapshots: what a kill -9 can lose at most (the restart-safe count covers it)
INTERVAL_S = 5.0
_KINDS = ("counter", "histogram")  # value files whose values add up across processes


class RecordsInUse(Exception):
    """Another proxy holds the records directory (one line for the user)."""


def lock_records(records_dir: Path) -> int:
    """Hold ``records_dir`` for this process (and the workers it forks): the lock file's descriptor, to
    keep open; RecordsInUse when another proxy holds it."""
    path = records_dir / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RecordsInUse(f"records_dir {records_dir} is in use by another proxy (pid {holder}): "
                           "two proxies never share one; give this one a records_dir of its own") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def read_values(run_dir: Path) -> dict[str, dict[str, float]]:
    """Every counter and histogram value in ``run_dir``'s value files, summed per key over the files (what
    a scrape shows, before the merge): ``{"counter": {key: value}, "histogram": {key: value}}``."""
    from prometheus_client.mmap_dict import MmapedDict

    out: dict[str, dict[str, float]] = {kind: {} for kind in _KINDS}
    for kind in _KINDS:
        values = out[kind]
        for path in sorted(glob.glob(str(run_dir / f"{kind}_*.db"))):
            for item in MmapedDict.read_all_values_from_file(path):
                key, value = item[0], float(item[1])
                values[key] = values.get(key, 0.0) + value
    return out


def write_snapshot(records_dir: Path, run_dir: Path, run_id: str | None, final: bool) -> None:
    """``metrics-snapshot.json`` from the value files now: written beside, synced, then renamed over the
    last one.  OSError when it cannot be written."""
    values = read_values(run_dir)
    doc: dict[str, Any] = {"format": 1, "written_unix": round(time.time(), 3), "run_id": run_id, "final": final,
                           **{kind: sorted(values[kind].items()) for kind in _KINDS}}
    tmp = records_dir / f".{SNAPSHOT}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, separators=(",", ":"))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, records_dir / SNAPSHOT)


def restore(records_dir: Path, run_dir: Path) -> str:
    """Write the snapshot's values into ``run_dir`` as value files of their own (before any worker starts);
    one line saying what was restored, or why nothing was."""
    from prometheus_client.mmap_dict import MmapedDict

    path = records_dir / SNAPSHOT
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        parts = [(kind, [(str(k), float(v)) for k, v in doc[kind]]) for kind in _KINDS]
    except FileNotFoundError:
        return f"no {SNAPSHOT} in {records_dir}: every count starts at 0"
    except (OSError, ValueError, TypeError, KeyError) as exc:
        return f"{path} cannot be read ({type(exc).__name__}): every count starts at 0"
    for kind, values in parts:
        store = MmapedDict(str(run_dir / f"{kind}_restored.db"))
        try:
            for key, value in values:
                store.write_value(key, value, 0.0)
        finally:
            store.close()
    how = "exact: a graceful stop" if doc.get("final") else "from the last periodic snapshot"
    return (f"counts continue from {path} ({how}, run {doc.get('run_id')}, "
            f"{sum(len(v) for _, v in parts)} values)")


async def snapshot_forever(records_dir: Path, run_dir: Path, run_id: str | None, stop: asyncio.Event,
                           interval_s: float = INTERVAL_S) -> None:
    """A snapshot every ``interval_s`` until ``stop``, each in a thread."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
            return
        try:
            await asyncio.to_thread(write_snapshot, records_dir, run_dir, run_id, False)
        except (OSError, RuntimeError, ValueError, struct.error) as exc:  # a full disk, a value file being made
            log.warning("metrics snapshot not written: %s", exc)


def final_snapshot(records_dir: Path, run_dir: Path, run_id: str | None) -> None:
    """The last snapshot, once every worker is gone: exact (a failure is logged, the start after it then
    continues from the last periodic one)."""
    try:
        write_snapshot(records_dir, run_dir, run_id, True)
    except (OSError, RuntimeError, ValueError, struct.error) as exc:
        log.error("metrics snapshot not written to %s: %s", records_dir, exc)
