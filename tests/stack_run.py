"""A live stack for the tests that need a real Prometheus fed by the real exporter."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import yaml

from exporter.load import Cell, Driver, Plan, Stage
from exporter.stack import (Child, exporter_argv, free_port, render_prometheus_config, start_prometheus,
                            wait_for_scrapes, wait_http)

SCENARIOS = ["short-c2", "short-c8"]


@dataclass
class LiveStack:
    prom: str
    proxy: str
    records: Path
    start: float
    end: float
    summaries: list[dict[str, Any]] = field(default_factory=list)
    windows: dict[str, tuple[float, float]] = field(default_factory=dict)

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = at
        r = requests.get(f"{self.prom}/api/v1/query", params=params, timeout=10)
        r.raise_for_status()
        return r.json()["data"]["result"]

    def query_range(self, expr: str, step: float = 5.0) -> list[dict[str, Any]]:
        r = requests.get(f"{self.prom}/api/v1/query_range",
                         params={"query": expr, "start": self.start, "end": self.end, "step": step}, timeout=10)
        r.raise_for_status()
        return r.json()["data"]["result"]


@contextlib.contextmanager
def run_live_stack(tmp: Path) -> Iterator[LiveStack]:
    ports = {n: free_port() for n in ("sglang", "vllm", "proxy", "prom")}
    logs = tmp / "logs"
    children: list[Child] = []
    try:
        for name in ("sglang", "vllm"):
            faults = ["--fault-empty-text", "0.1"] if name == "vllm" else []
            children.append(Child(f"sim-{name}", exporter_argv(
                "sim", "--profile", name, "--listen", f"127.0.0.1:{ports[name]}", "--speed", "1", *faults), logs))
        cfg = tmp / "stack.yaml"
        cfg.write_text(yaml.safe_dump({
            "listen": f"127.0.0.1:{ports['proxy']}",
            "engines": [{"name": n, "upstream": f"http://127.0.0.1:{ports[n]}"} for n in ("sglang", "vllm")],
            "scenarios": SCENARIOS + ["warmup"], "records_dir": str(tmp / "records"),
            "gpu": "sim:4", "gpu_interval_s": 1,
        }))
        proxy = Child("proxy", exporter_argv("serve", "--config", str(cfg)), logs)
        children.append(proxy)
        for child, name in zip(children, ("sglang", "vllm")):
            wait_http(f"http://127.0.0.1:{ports[name]}/health", 30, child)
        wait_http(f"http://127.0.0.1:{ports['proxy']}/-/ready", 30, proxy)
        prom_cfg = render_prometheus_config({
            "llmbench-exporter": [f"127.0.0.1:{ports['proxy']}"],
            "sglang": [f"127.0.0.1:{ports['sglang']}"], "vllm": [f"127.0.0.1:{ports['vllm']}"],
        }, tmp / "prometheus")
        children.append(start_prometheus(prom_cfg, tmp / "prometheus" / "data", ports["prom"], logs))
        proxy_url = f"http://127.0.0.1:{ports['proxy']}"
        wait_for_scrapes(f"http://127.0.0.1:{ports['prom']}", 3)
        start = time.time()
        plan = Plan([Stage("core", [
            Cell("short-c2", input_tokens=64, output_tokens=32, requests=6, concurrency=2, rounds=1),
            # rounds of 10-14 s each: longer than two scrape intervals, so scenario_info sees them
            Cell("short-c8", input_tokens=256, output_tokens=128, requests=64, concurrency=8, rounds=2),
        ])])
        stack = LiveStack(f"http://127.0.0.1:{ports['prom']}", proxy_url, tmp / "records", start, start)
        for engine in ("sglang", "vllm"):
            t0 = time.time()

            async def drive(e: str = engine) -> dict[str, Any]:
                async with Driver(f"{proxy_url}/{e}", tmp / "load" / e, seed=3) as d:
                    return await d.run_plan(plan)

            stack.summaries.append(asyncio.run(drive()))
            stack.windows[engine] = (t0, time.time())
        time.sleep(12)  # two more scrapes and rule evaluations
        stack.end = time.time()
        yield stack
    finally:
        for child in reversed(children):
            child.stop()
