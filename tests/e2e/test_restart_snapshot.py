"""Counters that never go back across a real restart of ``serve --workers 2`` on the same records directory:
after a graceful stop every counter and histogram continues exactly where the last scrape left it; a second
``serve`` on that directory is refused with one line; after a kill -9 the counts continue from the last
periodic snapshot."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from exporter.harness.stack import Child, exporter_argv, free_port, wait_http
from exporter.proxy.snapshot import LOCK, SNAPSHOT

from tests.helpers import metric_value, scrape_until_exit

pytestmark = pytest.mark.slow
SCRAPER = {"User-Agent": "Prometheus/restart-test"}
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _counts(text: str) -> Samples:
    """Every counter and histogram sample of a scrape."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text)
            if f.type in ("counter", "histogram") for s in f.samples}


def _scrape(url: str) -> str:
    with urllib.request.urlopen(urllib.request.Request(f"{url}/metrics", headers=SCRAPER), timeout=10) as resp:
        return resp.read().decode()


async def _send(url: str, n: int) -> list[int]:
    req = {"prompt": "x", "max_tokens": 4, "ignore_eos": True, "stream": True}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        statuses = []
        for _ in range(n):
            async with s.post(f"{url}/vllm/v1/completions", json=req) as r:
                await r.read()
                statuses.append(r.status)
        return statuses


def _wait(what: str, ready: object, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _snapshot_requests(records: Path) -> float:
    with contextlib.suppress(OSError, ValueError):
        doc = json.loads((records / SNAPSHOT).read_text())
        return sum(v for k, v in doc["counter"] if json.loads(k)[1] == "llmbench_requests_total")
    return -1.0


def _lock_free(records: Path) -> bool:
    fd = os.open(records / LOCK, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_counts_survive_a_graceful_restart_and_a_kill(tmp_path: Path) -> None:
    ports = {name: free_port() for name in ("sim", "proxy")}
    url = f"http://127.0.0.1:{ports['proxy']}"
    records = tmp_path / "run"
    cfg = tmp_path / "proxy.yaml"
    cfg.write_text(yaml.safe_dump({"listen": f"127.0.0.1:{ports['proxy']}", "records_dir": str(records),
                                   "engines": [{"name": "vllm", "upstream": f"http://127.0.0.1:{ports['sim']}"}]}))
    sim = Child("sim", exporter_argv("sim", "--profile", "vllm", "--listen", f"127.0.0.1:{ports['sim']}",
                                     "--speed", "50"), tmp_path)
    serve = exporter_argv("serve", "--config", str(cfg), "--workers", "2")
    proxies = [Child("proxy-1", serve, tmp_path)]
    try:
        wait_http(f"http://127.0.0.1:{ports['sim']}/health", 30, sim)
        wait_http(f"{url}/-/ready", 30, proxies[0])
        assert asyncio.run(_send(url, 6)) == [200] * 6
        assert metric_value(_scrape(url), "llmbench_requests_total") == 6
        proxies[0].proc.send_signal(signal.SIGTERM)
        last = _counts(scrape_until_exit(url, proxies[0].proc, SCRAPER)[-1])
        assert proxies[0].proc.returncode == 0

        proxies.append(Child("proxy-2", serve, tmp_path))
        wait_http(f"{url}/-/ready", 30, proxies[1])
        again = _counts(_scrape(url))
        went_back = {k: (v, again.get(k)) for k, v in last.items() if again.get(k, -1.0) < v}
        assert not went_back  # every counter and histogram of the last scrape, none lower
        moved = {k for k in last if again[k] != last[k]}
        assert all(k[0].startswith("llmbench_proxy_event_loop_lag") for k in moved), moved  # the rest: exact
        second = subprocess.run(serve, capture_output=True, text=True, timeout=60)
        assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
        assert "is in use by another proxy" in second.stderr and "Traceback" not in second.stderr

        assert asyncio.run(_send(url, 4)) == [200] * 4
        assert metric_value(_scrape(url), "llmbench_requests_total") == 10
        _wait("a periodic snapshot with the 10 requests", lambda: _snapshot_requests(records) == 10)
        os.kill(proxies[1].proc.pid, signal.SIGKILL)  # the workers die with it
        proxies[1].proc.wait(30)
        _wait("the records directory free", lambda: _lock_free(records))
        proxies.append(Child("proxy-3", serve, tmp_path))
        wait_http(f"{url}/-/ready", 30, proxies[2])
        assert metric_value(_scrape(url), "llmbench_requests_total") == 10
        assert metric_value(_scrape(url), "llmbench_arrivals_total") == 10  # what no record holds, too
    finally:
        for proxy in reversed(proxies):
            proxy.stop()
        sim.stop()
    for proxy in proxies:
        log = proxy.log_path.read_text()
        assert "Traceback" not in log, log
    assert "every count starts at 0" in proxies[0].log_path.read_text()
    assert "(exact: a graceful stop" in proxies[1].log_path.read_text()
    assert "(from the last periodic snapshot" in proxies[2].log_path.read_text()
