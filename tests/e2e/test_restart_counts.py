"""The boards' exact counts stay right across a real restart of the proxy (issue 10 item 4).

Simulated engines, the real proxy and a real Prometheus with the repo's prometheus.yml (5 s
scrapes), forwarding by remote_write to VictoriaMetrics when it is installed.  A first load, the
proxy stopped (Prometheus sees it down: its series go stale) and started again on the same port
and records directory, a second load; then the catalogue's count expressions over the whole
window must equal the records, request for request, in Prometheus and in VictoriaMetrics, where
the old max - min count must not.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards.catalogue import MIXIN, PANELS, exact_count, expand
from dashboards.promql import COUNT_STEP
from exporter.evidence.promapi import Prometheus, parse_duration
from exporter.harness.load import Cell, Driver, Plan, Stage
from exporter.harness.stack import (
    ENGINES,
    Child,
    exporter_argv,
    free_port,
    render_prometheus_config,
    wait_for_scrapes,
    wait_http,
)
from exporter.proxy.snapshot import SNAPSHOT

from tests.helpers import require_prometheus, scrapes_since, start_prometheus_on_port_0, start_victoriametrics_on_port_0

SCENARIO = "short-c4"
REQUESTS = {"first": 16, "second": 11}  # different sizes: a restart cannot hide behind equal peaks
_REQ = f"llmbench_requests_total{{{MIXIN.job_selector}}}"
_UP = f"up{{{MIXIN.job_selector}}}"


def _wait(what: str, ready: Callable[[], bool], timeout_s: float = 45.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.5)
    raise TimeoutError(f"Prometheus never saw: {what} (within {timeout_s:.0f} s)")


class Stack:
    def __init__(self, out: Path) -> None:
        self.out = out
        # the sims and the proxy take ports chosen here: ``sim --listen`` and ``serve`` refuse port 0
        # (and the proxy restarts on its port, the one Prometheus scrapes); Prometheus and
        # VictoriaMetrics bind port 0 and say which port they got (tests/helpers.py)
        self.ports = {name: free_port() for name in (*ENGINES, "proxy")}
        self.children: list[Child] = []
        self.proxy: Child | None = None
        self.config = out / "proxy.yaml"
        self.config.write_text(yaml.safe_dump({
            "listen": f"127.0.0.1:{self.ports['proxy']}",
            "engines": [{"name": n, "upstream": f"http://127.0.0.1:{self.ports[n]}"} for n in ENGINES],
            "scenarios": [SCENARIO, "warmup"], "records_dir": str(out / "records"),
        }))
        self.prom_url = ""  # once Prometheus runs
        self.prom = Prometheus("http://127.0.0.1:1")
        self.vm: Prometheus | None = None

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['proxy']}"

    def start(self) -> None:
        for name in ENGINES:
            faults = ["--fault-empty-text", "0.25"] if name == "vllm" else []  # failures count too
            sim = Child(f"sim-{name}", exporter_argv("sim", "--profile", name, "--listen",
                                                      f"127.0.0.1:{self.ports[name]}", "--speed", "4",
                                                      "--seed", "5", *faults), self.out / "logs")
            self.children.append(sim)
            wait_http(f"http://127.0.0.1:{self.ports[name]}/health", 30, sim)
        self.start_proxy("proxy-1")
        config = render_prometheus_config({MIXIN.job: [f"127.0.0.1:{self.ports['proxy']}"]}, self.out / "prometheus")
        if shutil.which("victoria-metrics"):
            self.start_victoriametrics(config)
        self.start_prometheus(config)
        wait_for_scrapes(self.prom_url, 1)

    def start_prometheus(self, config: Path) -> None:
        prom, self.prom_url = start_prometheus_on_port_0(config, self.out / "prometheus" / "data", self.out / "logs")
        self.children.append(prom)
        self.prom = Prometheus(self.prom_url)

    def start_victoriametrics(self, prom_config: Path) -> None:
        """Debian's single-node VictoriaMetrics, fed by Prometheus's remote_write; the newest
        samples visible after 1 s instead of 30 (``-search.latencyOffset``)."""
        vm, url = start_victoriametrics_on_port_0(self.out / "vm", self.out / "logs", "-search.latencyOffset=1s")
        self.children.append(vm)
        doc = yaml.safe_load(prom_config.read_text())
        doc["remote_write"] = [{"url": f"{url}/api/v1/write", "queue_config": {"batch_send_deadline": "1s"}}]
        prom_config.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.vm = Prometheus(url)

    def start_proxy(self, name: str) -> None:
        self.proxy = Child(name, exporter_argv("serve", "--config", str(self.config)), self.out / "logs")
        wait_http(f"{self.proxy_url}/-/ready", 30, self.proxy)

    def stop_proxy(self) -> None:
        assert self.proxy is not None
        assert self.proxy.stop(60) == 0  # a graceful stop: Prometheus's last scrapes read the final counts

    def scalar(self, expr: str, api: Prometheus | None = None) -> float | None:
        result = (api or self.prom).query(expr)
        return float(result[0]["value"][1]) if result else None

    def load(self, requests: int, tag: str) -> None:
        plan = Plan([Stage("core", [Cell(SCENARIO, input_tokens=32, output_tokens=16, requests=requests,
                                          concurrency=4, rounds=1)])])
        for engine in ENGINES:
            async def drive(e: str = engine) -> dict[str, Any]:
                async with Driver(f"{self.proxy_url}/{e}", self.out / "load" / tag / e, seed=3) as d:
                    return await d.run_plan(plan)
            asyncio.run(drive())

    def stop(self) -> None:
        for child in reversed([*self.children, *([self.proxy] if self.proxy else [])]):
            child.stop()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    require_prometheus()
    s = Stack(tmp_path)
    try:
        s.start()
        yield s
    finally:
        s.stop()


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("snapshot", ["kept", "lost"])
def test_exact_counts_survive_a_proxy_restart(stack: Stack, snapshot: str) -> None:
    """``kept``: the restarted proxy continues its counters from the snapshot in its records directory, and
    no count series goes down.  ``lost`` (a new volume, or a kill -9 before any snapshot): its counters start
    at 0, and the restart-safe count still finds every request."""
    records_file = stack.out / "records" / "requests.jsonl"
    t0 = time.time()
    stack.load(REQUESTS["first"], "first")
    first = len(_records(records_file))
    assert first == 2 * REQUESTS["first"]
    _wait(f"{first} requests", lambda: stack.scalar(f"sum({_REQ})") == first)

    stack.stop_proxy()
    _wait("the proxy down", lambda: stack.scalar(_UP) == 0)  # a failed scrape: its series are stale now
    if snapshot == "lost":
        (stack.out / "records" / SNAPSHOT).unlink()
    base = first if snapshot == "kept" else 0
    stack.start_proxy("proxy-2")
    _wait(f"the restarted proxy's counters at {base}",
          lambda: stack.scalar(_UP) == 1 and stack.scalar(f"sum({_REQ})") == base)

    stack.load(REQUESTS["second"], "second")
    records = _records(records_file)
    assert len(records) == first + 2 * REQUESTS["second"]
    _wait("the second load", lambda: stack.scalar(f"sum({_REQ})") == len(records) - first + base)
    # one more count step past the last sample: a scrape that began a step after it was seen
    at = scrapes_since(stack.prom_url, f"127.0.0.1:{stack.ports['proxy']}", time.time() + parse_duration(COUNT_STEP))
    range_s = at - t0 + 5  # the whole window, from before the first load: both backends at the same time

    _check_counts(stack.prom, records, range_s, at, snapshot == "kept")
    if stack.vm is None:
        pytest.skip("victoria-metrics not installed: the counts were checked in Prometheus only")
    vm = stack.vm
    _wait("every sample in VictoriaMetrics", lambda: stack.scalar(f"sum({_REQ})", vm) == len(records) - first + base)
    _check_counts(vm, records, range_s, at, snapshot == "kept")


def _check_counts(api: Prometheus, records: list[dict[str, Any]], range_s: float, at: float, kept: bool) -> None:
    def count(expr: str, *by: str) -> dict[tuple[str, ...], float]:
        result = api.query(expand(expr, range_s=range_s), at)
        return {tuple(r["metric"].get(k, "") for k in by): float(r["value"][1]) for r in result}

    # every request, per engine and outcome
    want = Counter((r["engine"], r["outcome"]) for r in records)
    got = count(f"sum by ({MIXIN.engine_label}, outcome) ({exact_count(_REQ)})", MIXIN.engine_label, "outcome")
    assert {k: v for k, v in got.items() if v} == dict(want)
    naive = count(f"sum by ({MIXIN.engine_label}, outcome) (max_over_time({_REQ}[$__range]) - "
                  f"min_over_time({_REQ}[$__range]))", MIXIN.engine_label, "outcome")
    if kept:  # no count went down: even the plain max - min counts every request
        assert naive == got
    else:
        assert naive != got  # the old count loses the first load: the restart is inside the window

    # the board's stat panels, as Grafana evaluates them over the window
    failures = Counter((r["engine"], r["reason"]) for r in records if r["outcome"] == "failure")
    assert failures, "the simulated vLLM's empty-text faults give failures"
    assert count(PANELS["failures_by_reason"].queries[0].expr, MIXIN.engine_label, "reason") == dict(failures)
    empty = Counter(r["engine"] for r in records if r["reason"] == "empty_text")
    got_empty = count(PANELS["empty_text"].queries[0].expr, MIXIN.engine_label)
    assert {k: v for k, v in got_empty.items() if v} == {(e,): float(n) for e, n in empty.items()}
    judged = Counter(r["engine"] for r in records if r["outcome"] != "client_abort")
    ok = Counter(r["engine"] for r in records if r["outcome"] == "success")
    ratio = count(PANELS["success_ratio"].queries[0].expr, MIXIN.engine_label)
    assert ratio == pytest.approx({(e,): ok[e] / judged[e] for e in ENGINES}, rel=1e-12)
