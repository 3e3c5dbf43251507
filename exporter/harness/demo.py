"""``llm-bench-exporter demo``: the whole stack on one machine with simulated engines.

Starts a simulated SGLang and a simulated vLLM (the latter with a small ``empty_text``
rate, the seed's failure), the proxy in front of both with 8 simulated GPUs, and a real
Prometheus with the repo's config when one is installed.  Then it runs a short plan against
each engine in turn, like the seed, writes the dashboards and the round tables, prints
where everything is, and shuts every child down.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from exporter.harness.load import Driver, load_plan
from exporter.harness.stack import ENGINES, REPO_FILES, LocalStack

__all__ = ["add_parser", "run_demo"]



def _say(msg: str) -> None:
    print(msg, flush=True)


def _table(summaries: list[dict[str, Any]]) -> str:
    head = f"{'engine':<8} {'scenario':<12} {'success':>9} {'tok/s':>9} {'TTFT P95 s':>11} {'TPOT P95 ms':>12} {'E2E P95 s':>10}"
    lines = [head, "-" * len(head)]

    def f(v: Any, scale: float = 1.0, nd: int = 3) -> str:
        return "-" if v is None else f"{v * scale:.{nd}f}"

    for s in summaries:
        for cell in s["cells"]:
            m = cell["median"]
            lines.append(f"{s['engine']:<8} {cell['cell']['scenario']:<12} {m['success']:>4}/{m['requests']:<4} "
                         f"{f(m['output_throughput_tok_s'], nd=1):>9} {f(m['ttft_p95_s']):>11} "
                         f"{f(m['tpot_p95_s'], 1000, 1):>12} {f(m['e2e_p95_s']):>10}")
        for stop in s["stops"]:
            lines.append(f"{s['engine']:<8} stage {stop['stage']} stopped after {stop['after']}: {stop['reason']}")
    return "\n".join(lines)


def _write_dashboards(out: Path) -> Path | None:
    try:
        from dashboards.boards import write_all
    except ImportError:
        return None
    target = out / "dashboards"
    write_all(target)
    return target


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _evidence(prom_url: str, window: str, out: Path) -> Path | None:
    """The evidence tool on the demo's own window, while Prometheus still runs."""
    try:
        from dashboards.evidence.export import ExportError, export
        from dashboards.evidence.promapi import Prometheus, PromError
        from dashboards.evidence.summarize import load_records, summarize, write_summary
        from dashboards.evidence.windows import parse_window
    except ImportError:
        return None
    prom = Prometheus(prom_url)
    try:
        export(prom, parse_window(window), out / "evidence", progress=False)
        write_summary(summarize(load_records(out / "records"), prom), out / "summary")
    except (ExportError, PromError, OSError, ValueError) as exc:
        _say(f"evidence export failed: {exc}")
        return None
    return out / "evidence"


def run_demo(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops the stack as cleanly as Ctrl-C
    out = Path(args.out).resolve()
    if out.exists() and not args.keep_output:
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    plan = load_plan(args.plan)
    scenarios = sorted({c.scenario for st in plan.stages for c in st.cells} | {"warmup"})
    stack = LocalStack(out)
    try:
        stack.start(scenarios=scenarios, speed=args.speed, gpu=args.gpu,
                    vllm_faults=["--fault-empty-text", str(args.empty_text_rate)])
        prom_url = None
        if args.no_prometheus:
            _say("Prometheus: skipped (--no-prometheus)")
        else:
            try:
                prom_url = stack.start_prometheus()
                _say(f"Prometheus: {prom_url} (config {stack.prom_config})")
            except FileNotFoundError:
                _say("Prometheus: no `prometheus` binary on PATH, going on without it. Get one with\n"
                     "  apt-get install -y --no-install-recommends prometheus   (Debian/Ubuntu)\n"
                     f"  and it will scrape with {stack.prom_config}")
        _say(f"proxy: {stack.proxy_url}  (metrics at /metrics)")
        started = time.time()
        summaries = []
        for name in ENGINES:  # one engine after the other, like the seed
            _say(f"running plan {args.plan} against {name} ...")

            async def drive(engine: str = name) -> dict[str, Any]:
                base = f"{stack.proxy_url}/{engine}"
                async with Driver(base, out / "load" / engine, seed=11) as driver:
                    return await driver.run_plan(plan)

            summaries.append(asyncio.run(drive()))
        ended = time.time()
        time.sleep(args.settle)  # let Prometheus scrape the last counts
        (out / "summary.json").write_text(json.dumps(summaries, indent=2), encoding="utf-8")
        table = _table(summaries)
        (out / "rounds.txt").write_text(table + "\n", encoding="utf-8")
        boards = _write_dashboards(out)
        window = f"{int(started)},{int(ended + args.settle)}"
        evidence = _evidence(prom_url, window, out) if prom_url else None
        _say("\n" + table + "\n")
        _say(f"records:    {out / 'records' / 'requests.jsonl'} (raw SSE of failures in {out / 'records' / 'captures'})")
        _say(f"tables:     {out / 'load'}/<engine>/rounds.csv, summary.json; {out / 'rounds.txt'}")
        if boards:
            _say(f"dashboards: {boards} (import into Grafana, or use compose/)")
        _say(f"logs:       {stack.logs}")
        if evidence:
            _say(f"evidence:   {evidence}/EVIDENCE.md (PNG boards, CSV/JSON per panel, manifest.json); "
                 f"round tables with histogram-vs-exact P95 in {out / 'summary'}")
        if prom_url and args.keep_running:
            _say(f"again:      evidence export --prometheus {prom_url} --window {window} --out DIR")
        if args.keep_running:
            _say("stack left running; Ctrl-C stops it")
            while stack.alive():
                time.sleep(1)
        return 0
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    finally:
        stack.stop()


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="the whole stack on one machine with simulated engines")
    p.add_argument("--out", default="demo-run", help="output directory (default: ./demo-run)")
    p.add_argument("--plan", default=str(REPO_FILES / "examples" / "plans" / "demo.yaml"))
    p.add_argument("--speed", type=float, default=1.5, help="simulated engine speed factor")
    p.add_argument("--empty-text-rate", type=float, default=0.02, help="vLLM sim's empty_text fault rate")
    p.add_argument("--gpu", default="sim:8", help="GPU collector of the proxy: off | nvml | sim:N")
    p.add_argument("--settle", type=float, default=6.0, help="seconds to wait for a last scrape")
    p.add_argument("--no-prometheus", action="store_true")
    p.add_argument("--keep-running", action="store_true", help="leave the stack up until Ctrl-C")
    p.add_argument("--keep-output", action="store_true", help="do not clear --out first")
    p.set_defaults(func=run_demo)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run_demo(argparse.Namespace()))
