"""CPU time per output token of the two simulated engines under the same load.

    python bench/sim_fairness.py [--rounds 4] [--requests 32] [--concurrency 32] [--tokens 32]

Starts ``sim --profile vllm`` and ``sim --profile sglang`` (speed 20), warms both, then
serves the same round to each in the order A B B A A B B ... so that a drift of the
machine's speed cancels, and reads each sim's CPU time (all its threads) from /proc before
and after its rounds.  Prints CPU per token of each and their ratio (1.00 = fair).  The
tests count calls per token instead (``tests/unit/test_sim_fairness.py``): a figure in
seconds belongs here, where a busy machine only makes it noisy, not red.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.harness.load import Cell, Driver  # noqa: E402
from exporter.harness.stack import Child, exporter_argv, free_port, wait_http  # noqa: E402

PROFILES = ("vllm", "sglang")


def process_cpu_s(pid: int) -> float:
    """CPU time of a process so far, all its threads: the scheduler's nanoseconds where the
    kernel keeps them (/proc/PID/task/TID/schedstat), else user + system clock ticks."""
    tasks = list(Path(f"/proc/{pid}/task").glob("*/schedstat"))
    if tasks:
        return sum(int(t.read_text().split()[0]) for t in tasks) / 1e9
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def serve_round(port: int, cell: Cell) -> int:
    """One round of ``cell`` against the sim on ``port``; the output tokens it served."""
    async with Driver(f"http://127.0.0.1:{port}", model="m") as driver:
        records, _ = await driver.run_round(cell, cell.scenario, 1, cell.requests)
    return sum(r["completion_tokens"] or 0 for r in records if r["outcome"] == "success")


def measure(args: argparse.Namespace, tmp: Path) -> dict[str, tuple[float, int]]:
    """(CPU seconds, tokens) of each profile over ``args.rounds`` rounds each."""
    ports = {p: free_port() for p in PROFILES}
    sims = {p: Child(f"sim-{p}", exporter_argv("sim", "--profile", p, "--listen", f"127.0.0.1:{ports[p]}",
                                               "--speed", "20"), tmp) for p in PROFILES}
    cell = Cell(f"c{args.concurrency}", input_tokens=16, output_tokens=args.tokens, requests=args.requests,
                concurrency=args.concurrency)
    used = dict.fromkeys(PROFILES, 0.0)
    tokens = dict.fromkeys(PROFILES, 0)
    order = [PROFILES[(i + 1) // 2 % 2] for i in range(2 * args.rounds)]  # A B B A A B B A ...
    try:
        for p in PROFILES:
            wait_http(f"http://127.0.0.1:{ports[p]}/health", 30, sims[p])
            asyncio.run(serve_round(ports[p], Cell("warm", 16, 8, requests=cell.requests,
                                                   concurrency=cell.concurrency)))
        for p in order:
            before = process_cpu_s(sims[p].proc.pid)
            tokens[p] += asyncio.run(serve_round(ports[p], cell))
            used[p] += process_cpu_s(sims[p].proc.pid) - before
    finally:
        for child in sims.values():
            child.stop()
    return {p: (used[p], tokens[p]) for p in PROFILES}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4, help="rounds per profile (default 4)")
    ap.add_argument("--requests", type=int, default=32, help="requests per round (default 32)")
    ap.add_argument("--concurrency", type=int, default=32, help="concurrent requests (default 32)")
    ap.add_argument("--tokens", type=int, default=32, help="output tokens per request (default 32)")
    args = ap.parse_args()
    if not sys.platform.startswith("linux"):
        print("reads /proc: Linux only", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        got = measure(args, Path(tmp))
    print(f"profile   tokens  CPU s   µs CPU per token   (C{args.concurrency}, {args.rounds} rounds each)")
    per_token = {}
    for p, (cpu, n) in got.items():
        per_token[p] = cpu / n if n else float("nan")
        print(f"{p:8} {n:7d} {cpu:7.3f} {per_token[p] * 1e6:12.1f}")
    print(f"ratio sglang/vllm: {per_token['sglang'] / per_token['vllm']:.2f} (1.00 = the same CPU per token)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
