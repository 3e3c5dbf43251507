"""The proxy in front of a real engine: vLLM (the CPU build) driven by vLLM's own `vllm bench serve`,
interleaved direct / nginx / proxy, a real Prometheus scraping vLLM and the proxy.

    bash .ci/install-vllm.sh            # once: the vLLM venv
    python bench/real_engine.py [--rounds 5] [--prompts 64] [--concurrency 8] [--scrape-interval 5]

Builds a tiny random-weight llama (exporter/harness/tiny_model.py), starts `vllm serve`
(exporter/harness/real_vllm.py), the proxy (defaults, one engine), nginx (`nginx-light`,
`proxy_buffering off`; left out with a note when not installed) and Prometheus, then runs one
unmeasured warm-up straight to vLLM and, each round, one `vllm bench serve` (random 256 in /
64 out, ``--ignore-eos``) per path in the order direct, nginx, proxy (and, with ``--before
DIR``, another tree's proxy, scraped alike).  Prints each run's median TTFT and the medians
over runs of TTFT, TPOT and output throughput, the proxy's CPU seconds per request (all its
processes, from /proc) and nginx's, and the proxy's records' ``timing_uncertainty_s``.  The first proxy run, through a freshly
started proxy, is shown apart.  Speed is measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.harness.real_engine import start_proxy  # noqa: E402
from exporter.harness.real_vllm import VllmServer, bench_serve, build_model, vllm_missing  # noqa: E402
from exporter.harness.stack import (  # noqa: E402
    Child,
    free_port,
    render_prometheus_config,
    start_prometheus,
    wait_for_scrapes,
    wait_http,
)

from bench.proxy_overhead import NGINX_CONF  # noqa: E402
from bench.timing_procs import cpu_of_tree  # noqa: E402

PATHS = ("direct", "nginx", "proxy", "before")


def start_nginx(tmp: Path, up_port: int) -> tuple[Child, str] | None:
    binary = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)
    if binary is None:
        print("nginx not found (apt-get install -y nginx-light): no nginx path in this run")
        return None
    port = free_port()
    (tmp / "nginx.conf").write_text(NGINX_CONF.format(tmp=tmp, up_port=up_port, port=port))
    child = Child("nginx", [binary, "-c", str(tmp / "nginx.conf"), "-p", str(tmp)], tmp)
    wait_http(f"http://127.0.0.1:{port}/up/health", 30, child)
    return child, f"http://127.0.0.1:{port}/up"


def start_before(tree: Path, out: Path, upstream: str) -> tuple[Child, str]:
    """Another source tree's ``serve`` (defaults, one engine), ready: path ``before``."""
    import yaml

    port = free_port()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "proxy.yaml"
    path.write_text(yaml.safe_dump({"listen": f"127.0.0.1:{port}", "records_dir": str(out / "run"),
                                    "engines": [{"name": "vllm", "upstream": upstream}]}))
    code = f"import sys; sys.path.insert(0, {str(tree.resolve())!r}); from exporter.cli import main; sys.exit(main())"
    child = Child("before", [sys.executable, "-c", code, "serve", "--config", str(path)], out)
    wait_http(f"http://127.0.0.1:{port}/-/ready", 60, child)
    return child, f"http://127.0.0.1:{port}"


def one_run(args: argparse.Namespace, model: Path, url: str, out: Path, cpu_pid: int | None) -> dict[str, Any]:
    """One `vllm bench serve` against ``url``; its figures, and the CPU of ``cpu_pid``'s tree meanwhile."""
    cpu0 = cpu_of_tree(cpu_pid) if cpu_pid else 0.0
    result = bench_serve(url, model, out, input_len=args.input_len, output_len=args.output_len,
                         prompts=args.prompts, concurrency=args.concurrency, seed=args.seed,
                         request_id_prefix=f"{out.name}-")
    cpu = cpu_of_tree(cpu_pid) - cpu0 if cpu_pid else None
    return {"completed": result["completed"], "failed": result["failed"],
            "median_ttft_ms": result["median_ttft_ms"], "median_tpot_ms": result["median_tpot_ms"],
            "output_throughput": result["output_throughput"],
            "cpu_s_per_request": cpu / max(1, result["completed"]) if cpu is not None else None}


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r[key] is not None]
    return statistics.median(values) if values else None


def _fmt(value: float | None, spec: str) -> str:
    return format(value, spec) if value is not None else "-"


def report(runs: dict[str, list[dict[str, Any]]], uncertainty: list[float]) -> dict[str, Any]:
    """Print the table; return the medians by path."""
    print("\npath    runs  median TTFT of each run (ms)")
    for path, rs in runs.items():
        print(f"{path:<7} {len(rs):>4}  " + ", ".join(f"{r['median_ttft_ms']:.0f}" for r in rs))
    print("\npath    TTFT ms  TPOT ms  out tok/s  CPU ms/request   (medians of runs)")
    summary: dict[str, Any] = {}
    for path, rs in runs.items():
        m = {k: _median(rs, k) for k in ("median_ttft_ms", "median_tpot_ms", "output_throughput", "cpu_s_per_request")}
        summary[path] = m
        cpu_ms = m["cpu_s_per_request"] * 1000 if m["cpu_s_per_request"] is not None else None
        print(f"{path:<7} {m['median_ttft_ms']:>7.1f}  {m['median_tpot_ms']:>7.2f}  {m['output_throughput']:>9,.0f}"
              f"  {_fmt(cpu_ms, '>14.2f')}")
    ref = "nginx" if "nginx" in summary else "direct"
    print()
    for name in ("proxy", "before"):
        if name in summary:
            s, r = summary[name], summary[ref]
            print(f"{name} vs {ref}: TTFT x{s['median_ttft_ms'] / r['median_ttft_ms']:.2f}, "
                  f"output throughput x{s['output_throughput'] / r['output_throughput']:.2f}")
    proxy_runs = runs["proxy"]
    if len(proxy_runs) > 1:
        later = statistics.median(x["median_ttft_ms"] for x in proxy_runs[1:])
        first = proxy_runs[0]["median_ttft_ms"]
        print(f"first proxy run: TTFT {first:.1f} ms, x{first / later:.2f} the later runs' median ({later:.1f} ms)")
    if len(uncertainty) > 1:
        qs = statistics.quantiles(uncertainty, n=100)
        print(f"proxy records' timing_uncertainty_s: median {statistics.median(uncertainty) * 1000:.1f} ms, "
              f"p99 {qs[98] * 1000:.1f} ms, max {max(uncertainty) * 1000:.1f} ms ({len(uncertainty)} records)")
    return summary


def rounds(args: argparse.Namespace, model: Path, urls: dict[str, str], pids: dict[str, int],
           out: Path) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in PATHS if p in urls}
    for i in range(args.rounds):
        for path in runs:
            r = one_run(args, model, urls[path], out / f"{path}{i}", pids.get(path))
            runs[path].append(r)
            print(f"round {i + 1}/{args.rounds} {path:<6}: TTFT {r['median_ttft_ms']:6.1f} ms, TPOT "
                  f"{r['median_tpot_ms']:5.2f} ms, {r['output_throughput']:7,.0f} tok/s, {r['completed']} done, "
                  f"{r['failed']} failed", flush=True)
    return runs


def measure(args: argparse.Namespace, tmp: Path, children: list[Any]) -> dict[str, Any]:
    t0 = time.monotonic()
    server = VllmServer(build_model(tmp / "model"), tmp / "logs")
    children.append(server)
    server.start()
    print(f"vLLM ready in {time.monotonic() - t0:.0f} s (model built and server started)", flush=True)
    proxy, proxy_url = start_proxy(tmp / "proxy", [{"name": "vllm", "upstream": server.url}])
    children.append(proxy)
    urls, pids = {"direct": server.url, "proxy": f"{proxy_url}/vllm"}, {"proxy": proxy.proc.pid}
    if args.before:
        before, before_url = start_before(args.before, tmp / "before", server.url)
        children.append(before)
        urls["before"], pids["before"] = f"{before_url}/vllm", before.proc.pid
    nginx = None if args.no_nginx else start_nginx(tmp, server.port)
    if nginx is not None:
        children.append(nginx[0])
        urls["nginx"], pids["nginx"] = nginx[1], nginx[0].proc.pid
    proxies = [proxy_url] + ([before_url] if args.before else [])
    config = render_prometheus_config({"llmbench-exporter": [u.removeprefix("http://") for u in proxies],
                                       "vllm": [server.url.removeprefix("http://")]}, tmp / "prometheus",
                                      scrape_interval=f"{args.scrape_interval:g}s")
    prom_port = free_port()
    children.append(start_prometheus(config, tmp / "prometheus" / "data", prom_port, tmp / "logs"))
    wait_for_scrapes(f"http://127.0.0.1:{prom_port}", 2)
    one_run(args, server.model, server.url, tmp / "warmup", None)  # the engine warm before any path
    runs = rounds(args, server.model, urls, pids, tmp / "runs")
    records = [json.loads(x) for x in (tmp / "proxy" / "run" / "requests.jsonl").read_text().splitlines()]
    print(f"\nproxy records: {sum(r['outcome'] == 'success' for r in records)} successes of {len(records)}")
    summary = report(runs, [r["timing_uncertainty_s"] for r in records if r["timing_uncertainty_s"] is not None])
    return {"args": vars(args), "runs": runs, "summary": summary}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scrape-interval", type=float, default=5.0, help="Prometheus's, in seconds")
    ap.add_argument("--no-nginx", action="store_true", help="leave nginx out even when installed")
    ap.add_argument("--json", type=Path, help="write the runs and medians here")
    ap.add_argument("--before", type=Path, metavar="DIR",
                    help="also run the proxy of another source tree (e.g. `git worktree add DIR REV`) as path "
                         "'before', side by side (scraped like the proxy)")
    args = ap.parse_args()
    why = vllm_missing()
    if why:
        print(f"real_engine: {why}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # children are stopped in `finally`
    tmp = Path(tempfile.mkdtemp(prefix="llmbench-real-engine-"))
    children: list[Any] = []
    try:
        doc = measure(args, tmp, children)
    finally:
        for child in reversed(children):
            child.stop()
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1, default=str))
    print(f"\nlogs and bench results under {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
