"""The simulator is fair: both profiles cost the same CPU per token (issue 12), so a demo that
shows one engine slower shows the model's difference, not ours."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from exporter.harness.load import Cell, Driver
from exporter.harness.sim_engine import ThroughputWindow
from exporter.harness.stack import Child, exporter_argv, free_port, wait_http

PROFILES = ("vllm", "sglang")


def _cpu_seconds(pid: int) -> float:
    """CPU time of a process so far, all its threads: the scheduler's nanoseconds where the
    kernel keeps them (/proc/PID/task/TID/schedstat), else user + system clock ticks."""
    tasks = list(Path(f"/proc/{pid}/task").glob("*/schedstat"))
    if tasks:
        return sum(int(t.read_text().split()[0]) for t in tasks) / 1e9
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_throughput_window_is_tokens_over_the_last_seconds() -> None:
    w = ThroughputWindow(span_s=5.0)
    assert w.rate(100.0) == 0.0
    for t in range(100, 110):  # 10 tokens a second for 10 s
        for _ in range(10):
            w.add(1, t + 0.5)
    # buckets of the seconds 105..109 remain at 110.0: 50 tokens over 5 s
    assert w.rate(110.0) == pytest.approx(50 / 5)
    assert w.rate(200.0) == 0.0  # everything expired
    w.add(7, 300.2)
    assert w.rate(300.4) == pytest.approx(7.0)  # a young window counts over at least 1 s


async def _serve(port: int, cell: Cell) -> int:
    """One round of ``cell`` against the sim on ``port``; the output tokens it served."""
    async with Driver(f"http://127.0.0.1:{port}", model="m") as driver:
        records, _ = await driver.run_round(cell, cell.scenario, 1, cell.requests)
    return sum(r["completion_tokens"] or 0 for r in records if r["outcome"] == "success")


@pytest.mark.slow  # a subprocess or a whole-tree tool: runs in the full suite
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_both_profiles_cost_the_same_cpu_per_token_at_c32(tmp_path: Path) -> None:
    """Process CPU time of each profile's sim serving the same load (C32), in the order
    A B B A A B B A so that a drift of the machine's speed cancels; the ratio of CPU per token."""
    ports = {p: free_port() for p in PROFILES}
    sims = {p: Child(f"sim-{p}", exporter_argv("sim", "--profile", p, "--listen", f"127.0.0.1:{ports[p]}",
                                               "--speed", "20"), tmp_path) for p in PROFILES}
    cell = Cell("c32", input_tokens=16, output_tokens=32, requests=32, concurrency=32)
    used = dict.fromkeys(PROFILES, 0.0)
    tokens = dict.fromkeys(PROFILES, 0)
    try:
        for p in PROFILES:
            wait_http(f"http://127.0.0.1:{ports[p]}/health", 30, sims[p])
            asyncio.run(_serve(ports[p], Cell("warm", 16, 8, requests=32, concurrency=32)))
        for p in (*PROFILES, *reversed(PROFILES)) * 2:
            before = _cpu_seconds(sims[p].proc.pid)
            tokens[p] += asyncio.run(_serve(ports[p], cell))
            used[p] += _cpu_seconds(sims[p].proc.pid) - before
    finally:
        for child in sims.values():
            child.stop()
    assert tokens == {p: 4 * cell.requests * cell.output_tokens for p in PROFILES}
    per_token = {p: used[p] / tokens[p] for p in PROFILES}
    ratio = per_token["sglang"] / per_token["vllm"]
    assert 1 / 1.2 <= ratio <= 1.2, f"CPU per token: {per_token} (ratio {ratio:.2f})"
