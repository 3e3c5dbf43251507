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

from exporter.load import Cell, Driver, Plan, Stage
from exporter.stack import LocalStack

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
    with LocalStack(tmp) as local:
        local.start(scenarios=SCENARIOS + ["warmup"], speed=1, vllm_faults=["--fault-empty-text", "0.1"],
                    gpu="sim:4", gpu_interval_s=1)
        prom = local.start_prometheus()
        proxy_url = local.proxy_url
        start = time.time()
        plan = Plan([Stage("core", [
            Cell("short-c2", input_tokens=64, output_tokens=32, requests=6, concurrency=2, rounds=1),
            # rounds of 10-14 s each: longer than two scrape intervals, so scenario_info sees them
            Cell("short-c8", input_tokens=256, output_tokens=128, requests=64, concurrency=8, rounds=2),
        ])])
        stack = LiveStack(prom, proxy_url, tmp / "records", start, start)
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
