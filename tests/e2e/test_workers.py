"""``serve --workers N`` (SPEC section 14): one /metrics view of all workers, whole record
lines that add up, one scenario state, the GPU collector once, a clean stop (SPEC section 29: a
graceful one, tests/e2e/test_drain_serve.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest
import yaml

from exporter.harness.stack import Child, exporter_argv, free_port, wait_http

from tests.helpers import metric_value, scrape_until_exit


def _metrics(url: str) -> str:
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
            return resp.read().decode()
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"/metrics: HTTP {exc.code}: {exc.read()[:300]!r}") from None


async def _send(url: str, n: int, headers: dict[str, str] | None = None) -> list[int]:
    req = {"prompt": "x", "max_tokens": 4, "ignore_eos": True, "stream": True}
    statuses = []

    async def one() -> None:
        # a new connection each time, so that requests spread over the workers
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
            async with s.post(f"{url}/vllm/v1/completions", json=req, headers=headers or {}) as r:
                await r.read()
                statuses.append(r.status)

    for start in range(0, n, 16):
        await asyncio.gather(*(one() for _ in range(min(16, n - start))))
    return statuses


def test_workers_share_one_view(tmp_path: Path) -> None:
    ports = {name: free_port() for name in ("sim", "proxy")}  # sim and serve refuse port 0 and name no bound port
    url = f"http://127.0.0.1:{ports['proxy']}"
    cfg = tmp_path / "proxy.yaml"
    cfg.write_text(yaml.safe_dump({
        "listen": f"127.0.0.1:{ports['proxy']}", "records_dir": str(tmp_path / "run"),
        "scenarios": ["s1", "s2"], "gpu": "sim:2", "gpu_interval_s": 0.2,
        "engines": [{"name": "vllm", "upstream": f"http://127.0.0.1:{ports['sim']}", "usage": "inject"}]}))
    sim = Child("sim", exporter_argv("sim", "--profile", "vllm", "--listen", f"127.0.0.1:{ports['sim']}",
                                     "--speed", "50"), tmp_path)
    proxy = Child("proxy", exporter_argv("serve", "--config", str(cfg), "--workers", "2"), tmp_path)
    try:
        wait_http(f"http://127.0.0.1:{ports['sim']}/health", 30, sim)
        wait_http(f"{url}/-/ready", 30, proxy)
        assert asyncio.run(_send(url, 48)) == [200] * 48
        body = json.dumps({"scenario": "s2", "round": 5}).encode()
        urllib.request.urlopen(urllib.request.Request(f"{url}/-/scenario", data=body, method="POST"), timeout=30)
        assert asyncio.run(_send(url, 32)) == [200] * 32  # on whichever worker: all see s2 round 5
        text = _metrics(url)
        records = [json.loads(x) for x in (tmp_path / "run" / "requests.jsonl").read_text().splitlines()]
        assert len(records) == 80 == metric_value(text, "llmbench_requests_total")
        assert metric_value(text, "llmbench_requests_total", outcome="success") == 80
        assert [(r["scenario"], r["round"]) for r in records[48:]] == [("s2", 5)] * 32
        assert metric_value(text, "llmbench_requests_total", scenario="s2") == 32
        assert all(r["usage_injected"] for r in records)
        # each record's uncertainty is observed once, by the worker that served it, in the one view
        assert metric_value(text, "llmbench_request_timing_uncertainty_seconds_count") == 80
        assert metric_value(text, "llmbench_request_timing_uncertainty_seconds_sum") == pytest.approx(
            sum(r["timing_uncertainty_s"] for r in records), abs=80e-6)
        lag = {s for s in text.splitlines() if s.startswith("llmbench_proxy_event_loop_lag_seconds_count")}
        assert {line.split('worker="')[1][0] for line in lag} == {"0", "1"}  # both workers, one scrape
        assert text.count("llmbench_scenario_info{") == 1
        assert metric_value(text, "llmbench_scenario_info", scenario="s2", round="5") == 1
        gpus = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_GPU_TEMP{")]
        assert len(gpus) == 2  # the GPU collector runs once, not once per worker
        assert metric_value(text, "llmbench_requests_in_flight") == 0
        proxy.proc.send_signal(signal.SIGTERM)
        texts = scrape_until_exit(url, proxy.proc)  # this scraper was seen: it reads the final counts twice first
        assert proxy.proc.returncode == 0 and len(texts) >= 2
        assert metric_value(texts[-1], "llmbench_requests_total") == 80
    finally:
        proxy.stop()
        sim.stop()
    log = proxy.log_path.read_text()
    assert "Traceback" not in log, log


def _children_of(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_a_dead_worker_stops_the_proxy_at_once(tmp_path: Path) -> None:
    """SIGKILL one worker: serve exits 1 soon after, naming the worker and how it died, and
    stops and reaps the other one (how soon the supervisor is told: tests/unit/test_children.py)."""
    ports = {name: free_port() for name in ("sim", "proxy")}  # sim and serve refuse port 0 and name no bound port
    cfg = tmp_path / "proxy.yaml"
    cfg.write_text(yaml.safe_dump({
        "listen": f"127.0.0.1:{ports['proxy']}", "records_dir": str(tmp_path / "run"), "scenarios": ["s1"],
        "engines": [{"name": "vllm", "upstream": f"http://127.0.0.1:{ports['sim']}"}]}))
    sim = Child("sim", exporter_argv("sim", "--profile", "vllm", "--listen", f"127.0.0.1:{ports['sim']}"), tmp_path)
    proxy = Child("proxy", exporter_argv("serve", "--config", str(cfg), "--workers", "2"), tmp_path)
    try:
        wait_http(f"http://127.0.0.1:{ports['sim']}/health", 30, sim)
        wait_http(f"http://127.0.0.1:{ports['proxy']}/-/ready", 30, proxy)
        workers = _children_of(proxy.proc.pid)
        assert len(workers) == 2, workers
        t = time.monotonic()
        os.kill(workers[1], signal.SIGKILL)
        assert proxy.proc.wait(15) == 1
        assert time.monotonic() - t < 5  # the other worker's clean stop included
        assert not Path(f"/proc/{workers[0]}").exists()  # stopped and reaped
    finally:
        proxy.stop()
        sim.stop()
    log = proxy.log_path.read_text()
    assert f"(pid {workers[1]}) exited (killed by SIGKILL): stopping the proxy" in log, log
    assert "Traceback" not in log, log


def test_a_signal_to_every_process_stops_cleanly(tmp_path: Path) -> None:
    """SIGTERM to the workers and the supervisor at once, as a service manager that signals the
    whole control group does (or `pkill -f`): the workers take the first signal and ignore the
    supervisor's second, so serve exits 0, prints no traceback, and records the request that was
    in flight."""
    ports = {name: free_port() for name in ("sim", "proxy")}  # sim and serve refuse port 0 and name no bound port
    url = f"http://127.0.0.1:{ports['proxy']}"
    cfg = tmp_path / "proxy.yaml"
    cfg.write_text(yaml.safe_dump({
        "listen": f"127.0.0.1:{ports['proxy']}", "records_dir": str(tmp_path / "run"), "scenarios": ["s1"],
        "drain_timeout_s": 1,  # the request in flight is far longer: the drain ends it
        "engines": [{"name": "vllm", "upstream": f"http://127.0.0.1:{ports['sim']}", "usage": "inject"}]}))
    sim = Child("sim", exporter_argv("sim", "--profile", "vllm", "--listen", f"127.0.0.1:{ports['sim']}",
                                     "--speed", "0.05"), tmp_path)
    proxy = Child("proxy", exporter_argv("serve", "--config", str(cfg), "--workers", "2"), tmp_path)

    async def in_flight_then_signals() -> None:
        req = {"prompt": "x", "max_tokens": 400, "ignore_eos": True, "stream": True}
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{url}/vllm/v1/completions", json=req) as r:
                assert r.status == 200
                await r.content.readline()  # the stream has begun: the request is in flight
                for pid in [*_children_of(proxy.proc.pid), proxy.proc.pid]:
                    os.kill(pid, signal.SIGTERM)
                with pytest.raises(aiohttp.ClientError):
                    await r.read()  # cut by the shutdown

    try:
        wait_http(f"http://127.0.0.1:{ports['sim']}/health", 30, sim)
        wait_http(f"{url}/-/ready", 30, proxy)
        asyncio.run(in_flight_then_signals())
        assert proxy.proc.wait(30) == 0
    finally:
        proxy.stop()
        sim.stop()
    log = proxy.log_path.read_text()
    assert "Traceback" not in log and "failed" not in log, log
    records = [json.loads(x) for x in (tmp_path / "run" / "requests.jsonl").read_text().splitlines()]
    assert len(records) == 1 and records[0]["outcome"] != "success", records
