"""The first run through a freshly started proxy against the later ones, side by side.

    python bench/cold_start.py [--trials 3] [--runs 3] [--requests 64] [--before DIR]

For each trial a fresh ``llm-bench-exporter serve`` starts (2 engines x 10 scenarios
configured, a 1 s scraper on /metrics as Prometheus would be); as soon as ``/-/ready``
answers, ``--runs`` runs of ``--requests`` requests at C8 go through it (64 events a stream,
paced 5 ms, as in ``proxy_overhead.py``).  Printed per trial: the very first request's TTFT,
and each run's median and p95 TTFT (client side); then the target's ratio, the first run's
median TTFT over the later runs' (at most 1.2).  ``--before DIR`` starts another source
tree's proxy in each trial too, interleaved, so that both face the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.harness.stack import Child, exporter_argv, free_port, wait_http  # noqa: E402

from bench.proxy_overhead import batch, one  # noqa: E402


def _config(tmp: Path, name: str, port: int, up_port: int) -> Path:
    cfg = tmp / f"{name}.yaml"
    engines = "".join(f"  - name: {e}\n    upstream: http://127.0.0.1:{up_port}\n" for e in ("up", "other"))
    cfg.write_text(f"listen: 127.0.0.1:{port}\nscenarios: [{', '.join(f's{i}' for i in range(10))}]\n"
                   f"engines:\n{engines}records_dir: {tmp / name}\ncapture_raw_sse: none\n")
    return cfg


def _argv(tree: Path | None, cfg: Path) -> list[str]:
    if tree is None:
        return exporter_argv("serve", "--config", str(cfg))
    code = f"import sys; sys.path.insert(0, {str(tree.resolve())!r}); from exporter.cli import main; sys.exit(main())"
    return [sys.executable, "-c", code, "serve", "--config", str(cfg)]


def _start(tmp: Path, name: str, tree: Path | None, up_port: int) -> tuple[int, Child]:
    """A ready proxy on a free port (another port when the one picked was taken meanwhile)."""
    for attempt in range(3):
        port = free_port()
        proxy = Child(f"{name}-{attempt}", _argv(tree, _config(tmp, name, port, up_port)), tmp)
        try:
            wait_http(f"http://127.0.0.1:{port}/-/ready", 30, proxy)
            return port, proxy
        except RuntimeError:
            proxy.stop()
    raise RuntimeError(f"{name}: no proxy started in 3 attempts")


async def _trial(base: str, runs: int, requests: int) -> tuple[float, list[tuple[float, float]]]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def scrape() -> None:
            while True:
                async with s.get(f"{base}/metrics") as r:
                    await r.read()
                await asyncio.sleep(1.0)

        scraper = asyncio.create_task(scrape())
        first, _ = await one(s, f"{base}/up/v1/completions", None)
        rows = []
        for _ in range(runs):
            ttft = sorted(t for t, _ in await batch(s, f"{base}/up/v1/completions", requests, 8, None) if t is not None)
            rows.append((statistics.median(ttft), ttft[int(0.95 * (len(ttft) - 1))]))
        scraper.cancel()
    return first or 0.0, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--before", type=Path, metavar="DIR", help="also start another source tree's proxy, interleaved")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="llmbench-cold-"))
    up_port = free_port()
    upstream = Child("upstream", [sys.executable, str(Path(__file__).parent / "proxy_overhead.py"), "--serve-upstream",
                                  str(up_port), "--chunks", "64", "--interval-ms", "5"], tmp)
    trees: dict[str, Path | None] = {"proxy": None, **({"before": args.before} if args.before else {})}
    ratios: dict[str, list[float]] = {name: [] for name in trees}
    try:
        wait_http(f"http://127.0.0.1:{up_port}/health", 30, upstream)
        print(f"{'trial':<12} {'1st req ms':>10}  run medians / p95 (ms)")
        for trial in range(args.trials):
            for name, tree in trees.items():
                port, proxy = _start(tmp, f"{name}-{trial}", tree, up_port)
                try:
                    t0 = time.monotonic()
                    first, rows = asyncio.run(_trial(f"http://127.0.0.1:{port}", args.runs, args.requests))
                finally:
                    proxy.stop()
                ratios[name].append(rows[0][0] / statistics.median(r[0] for r in rows[1:]))
                print(f"{name} {trial:<6} {first * 1e3:>10.2f}  " +
                      "  ".join(f"{m * 1e3:6.2f}/{p * 1e3:6.2f}" for m, p in rows) +
                      f"   ({time.monotonic() - t0:.1f} s)", flush=True)
        for name, values in ratios.items():
            print(f"{name}: first run's median TTFT / later runs' = " + ", ".join(f"{r:.2f}" for r in values) +
                  f" (median {statistics.median(values):.2f}; target <= 1.2)")
    finally:
        upstream.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
