"""Soak: many requests with injected faults at high concurrency; nothing lost, memory flat.

    python bench/soak.py [--requests 10000] [--concurrency 64] [--fault-rate 0.05]

Starts a simulated vLLM (its faults spread evenly over disconnect, SSE error, empty text,
missing [DONE] and HTTP 500) and the proxy in front of it, drives the requests through it
in ten slices, and after each slice reads the proxy's RSS from /proc.  At the end it checks
that the client's requests, the proxy's records and the proxy's counters agree, outcome
by outcome, and prints the RSS series.  Exit status 1 when anything disagrees.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

import requests
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.harness.load import Cell, Driver  # noqa: E402
from exporter.harness.stack import Child, exporter_argv, free_port, wait_http  # noqa: E402

FAULTS = ("disconnect", "sse_error", "empty_text", "missing_done", "http_500")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def counters(url: str) -> Counter[tuple[str, str]]:
    from prometheus_client.parser import text_string_to_metric_families

    out: Counter[tuple[str, str]] = Counter()
    for fam in text_string_to_metric_families(requests.get(url, timeout=30).text):
        for s in fam.samples:
            if s.name == "llmbench_requests_total":
                out[(s.labels["outcome"], s.labels["reason"])] += int(s.value)
    return +out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--fault-rate", type=float, default=0.05)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="llmbench-soak-"))
    sim_port, proxy_port = free_port(), free_port()
    each = args.fault_rate / len(FAULTS)
    faults = [x for f in FAULTS for x in (f"--fault-{f.replace('_', '-')}", str(each))]
    children = [Child("sim", exporter_argv("sim", "--profile", "vllm", "--listen", f"127.0.0.1:{sim_port}",
                                           "--speed", "50", "--seed", "1", *faults), tmp)]
    cfg = tmp / "stack.yaml"
    cfg.write_text(yaml.safe_dump({"listen": f"127.0.0.1:{proxy_port}", "records_dir": str(tmp / "run"),
                                   "scenarios": ["soak"],
                                   "engines": [{"name": "vllm", "upstream": f"http://127.0.0.1:{sim_port}"}]}))
    children.append(Child("proxy", exporter_argv("serve", "--config", str(cfg)), tmp))
    rss = []
    try:
        wait_http(f"http://127.0.0.1:{sim_port}/health", 30, children[0])
        wait_http(f"http://127.0.0.1:{proxy_port}/-/ready", 30, children[1])
        pid = children[1].proc.pid
        rss.append(rss_mib(pid))
        per = max(1, args.requests // 10)

        async def drive() -> None:
            async with Driver(f"http://127.0.0.1:{proxy_port}/vllm", tmp / "load", model="m") as d:
                for i in range(10):
                    cell = Cell("soak", input_tokens=32, output_tokens=16, requests=per, concurrency=args.concurrency)
                    await d.run_round(cell, "soak", i + 1, per)
                    rss.append(rss_mib(pid))

        asyncio.run(drive())
        metric = counters(f"http://127.0.0.1:{proxy_port}/metrics")
    finally:
        for c in reversed(children):
            c.stop()
    client = [json.loads(x) for x in (tmp / "load" / "requests.jsonl").read_text().splitlines()]
    records = [json.loads(x) for x in (tmp / "run" / "requests.jsonl").read_text().splitlines()]
    by_client = Counter((r["outcome"], r["reason"] or "none") for r in client)
    by_record = Counter((r["outcome"], r["reason"] or "none") for r in records)
    print(f"requests sent {len(client)}, proxy records {len(records)}, proxy counter {sum(metric.values())}")
    print(f"{'outcome':<10} {'reason':<20} {'client':>7} {'records':>8} {'counter':>8}")
    for key in sorted(set(by_client) | set(by_record) | set(metric)):
        print(f"{key[0]:<10} {key[1]:<20} {by_client[key]:>7} {by_record[key]:>8} {metric[key]:>8}")
    print("proxy RSS MiB after each tenth: " + ", ".join(f"{x:.1f}" for x in rss))
    ok = len(client) == len(records) == sum(metric.values()) and by_record == metric
    # the client sees a cut stream as a disconnect too; every other verdict must match exactly
    ok &= all(by_client[k] == by_record[k] for k in by_record if k[1] != "upstream_disconnect")
    print("all agree" if ok else "DISAGREEMENT")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
