"""Process helpers for the benchmarks: CPU time of a process tree, CPU pinning, and a quantile
of the proxy's loop-lag histogram between two scrapes."""

from __future__ import annotations

import os
from pathlib import Path


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        children = task / "children"
        if children.exists():
            out += [int(x) for x in children.read_text().split()]
    return out


def _tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        todo += _children(p)
    return pids


def cpu_split(pid: int) -> tuple[float, float]:
    """A process's CPU seconds so far: (user, kernel), at the clock tick's resolution."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_split_of_tree(pid: int) -> tuple[float, float]:
    """(user, kernel) CPU seconds of ``pid`` and all its descendants."""
    splits = [cpu_split(p) for p in _tree(pid)]
    return sum(u for u, _ in splits), sum(k for _, k in splits)


def cpu_of_tree(pid: int) -> float:
    return sum(cpu_split_of_tree(pid))


def pin(pid: int, cpus: set[int], tree: bool = False) -> None:
    for p in (_tree(pid) if tree else [pid]):
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                os.sched_setaffinity(int(task.name), cpus)
            except OSError:
                pass


def _lag_buckets(text: str) -> dict[float, float]:
    """Cumulative counts by upper bound, all workers summed."""
    out: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith("llmbench_proxy_event_loop_lag_seconds_bucket{"):
            le = line.split('le="')[1].split('"')[0]
            bound = float("inf") if le == "+Inf" else float(le)
            out[bound] = out.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def lag_quantile(before: str, after: str, q: float) -> float | None:
    """The q-quantile's bucket upper bound of the lag samples taken between two scrapes."""
    b, a = _lag_buckets(before), _lag_buckets(after)
    delta = sorted((bound, a[bound] - b.get(bound, 0.0)) for bound in a)
    if not delta or delta[-1][1] <= 0:
        return None
    total = delta[-1][1]
    for bound, count in delta:
        if count >= q * total:
            return bound
    return None
