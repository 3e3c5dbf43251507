"""Past one machine (SPEC section 14) with the real components: two proxies, each in front of
its own simulated SGLang and vLLM, scraped by a real Prometheus that remote-writes
(prometheus/remote-write/prometheus.yml) into a real VictoriaMetrics behind a path prefix.
Load goes through both proxies; the counts, the evidence exports and the merged round tables
must agree between Prometheus, VictoriaMetrics and the proxies' own records."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards.catalogue import BOARDS
from exporter.core.stats import percentile
from exporter.evidence.cli import main as evidence_main
from exporter.evidence.evidence_md import RATE_NOTE, panel_kind
from exporter.evidence.promapi import TOKEN_ENV, Prometheus
from exporter.harness.load import Cell, Driver, Plan, Stage
from exporter.harness.stack import (
    REPO_FILES,
    Child,
    exporter_argv,
    free_port,
    render_prometheus_config,
    wait_for_scrapes,
    wait_http,
)

from tests.helpers import listening_port, require_prometheus, scrapes_since, start_prometheus_on_port_0

ENGINES = ("sglang", "vllm")
SCRAPE = "1s"
STEP = 2.0
VM_PREFIX = "/vm"
SECRET = "s3cr3t-bearer-Token-for-the-test"
# chat: every board query has data, the first answer token's (TTFO) too, made on a chat stream's first answer
PLAN = Plan([Stage("core", [Cell("short-c4", input_tokens=32, output_tokens=64, requests=24, concurrency=4, rounds=2,
                                 chat=True)])])


def require_victoria_metrics() -> str:
    binary = shutil.which("victoria-metrics")
    if binary is None:
        msg = "victoria-metrics not installed (apt-get install -y --no-install-recommends victoria-metrics)"
        if os.environ.get("LLMBENCH_REQUIRE_PROMETHEUS") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return binary


@dataclass
class Site:
    tmp: Path
    children: list[Child] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)
    start: float = 0.0
    end: float = 0.0

    @property
    def prom(self) -> str:
        return f"http://127.0.0.1:{self.ports['prometheus']}"

    @property
    def vm(self) -> str:
        return f"http://127.0.0.1:{self.ports['vm']}{VM_PREFIX}"

    def proxy(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[f'proxy{i}']}"

    def records(self, i: int) -> Path:
        return self.tmp / f"records-{i}"

    def spawn(self, name: str, argv: list[str]) -> Child:
        child = Child(name, argv, self.tmp / "logs")
        self.children.append(child)
        return child


def _start_proxies(site: Site) -> None:
    for i in (1, 2):
        for engine in ENGINES:
            port = site.ports[f"{engine}{i}"] = free_port()  # sim and serve refuse port 0 and name no bound port
            # the simulated vLLM tells its own clock, as the demo's does: "Where TTFT goes" has its series
            faults = ["--fault-empty-text", "0.15", "--per-request-metrics"] if engine == "vllm" else []
            sim = site.spawn(f"sim-{engine}{i}", exporter_argv(
                "sim", "--profile", engine, "--listen", f"127.0.0.1:{port}", "--speed", "1", "--seed", str(i), *faults))
            wait_http(f"http://127.0.0.1:{port}/health", 30, sim)
        site.ports[f"proxy{i}"] = free_port()
        cfg = {"listen": f"127.0.0.1:{site.ports[f'proxy{i}']}",
               "engines": [{"name": e, "upstream": f"http://127.0.0.1:{site.ports[f'{e}{i}']}"} for e in ENGINES],
               "scenarios": ["short-c4"], "records_dir": str(site.records(i)), "gpu": "sim:2", "gpu_interval_s": 1}
        path = site.tmp / f"proxy{i}.yaml"
        path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
        proxy = site.spawn(f"proxy{i}", exporter_argv("serve", "--config", str(path)))
        wait_http(f"{site.proxy(i)}/-/ready", 30, proxy)


def _start_stores(site: Site, vm_binary: str) -> None:
    """VictoriaMetrics, then Prometheus writing to it: each bound to port 0, the port read back (the
    sims and proxies above take chosen ports: ``sim --listen`` and ``serve`` refuse port 0)."""
    vm = site.spawn("victoria-metrics", [
        vm_binary, "-httpListenAddr=127.0.0.1:0", f"-storageDataPath={site.tmp / 'vm-data'}",
        f"-http.pathPrefix={VM_PREFIX}", "-search.latencyOffset=1s", "-search.disableCache"])
    site.ports["vm"] = listening_port(vm.proc.pid)
    wait_http(f"{site.vm}/health", 30, vm)
    out = site.tmp / "prometheus"
    config = render_prometheus_config({
        "llmbench-exporter": [site.proxy(i)[7:] for i in (1, 2)],
        **{e: [f"127.0.0.1:{site.ports[f'{e}{i}']}" for i in (1, 2)] for e in ENGINES},
    }, out, template=REPO_FILES / "prometheus" / "remote-write" / "prometheus.yml", scrape_interval=SCRAPE)
    doc = yaml.safe_load(config.read_text(encoding="utf-8"))
    doc["remote_write"][0]["url"] = f"{site.vm}/api/v1/write"
    doc["remote_write"][0]["queue_config"]["batch_send_deadline"] = "1s"
    config.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    shutil.copytree(REPO_FILES / "prometheus" / "rules", out / "rules", dirs_exist_ok=True)
    prom, _ = start_prometheus_on_port_0(config, out / "data", site.tmp / "logs")
    site.children.append(prom)
    site.ports["prometheus"] = listening_port(prom.proc.pid)
    wait_for_scrapes(site.prom, 6)


async def _load(site: Site) -> None:
    async def one(i: int, engine: str) -> None:
        async with Driver(f"{site.proxy(i)}/{engine}", site.tmp / "load" / f"{engine}{i}", seed=i) as d:
            await d.run_plan(PLAN)

    await asyncio.gather(*(one(i, e) for i in (1, 2) for e in ENGINES))


def _count_query(prom: Prometheus, at: float) -> dict[tuple[str, str], float]:
    result = prom.query('sum by (engine, outcome) (llmbench_requests_total{job="llmbench-exporter"})', at=at)
    return {(s["metric"]["engine"], s["metric"]["outcome"]): float(s["value"][1]) for s in result
            if float(s["value"][1]) > 0}


def _wait_until_vm_caught_up(site: Site, timeout_s: float = 30.0) -> None:
    """remote_write batches: wait until VictoriaMetrics has the counts Prometheus has at the end."""
    want = _count_query(Prometheus(site.prom), site.end)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (got := _count_query(Prometheus(site.vm), site.end)) == want:
            return
        time.sleep(0.5)
    raise AssertionError(f"VictoriaMetrics has {got}, Prometheus {want} after {timeout_s:.0f} s")


@contextlib.contextmanager
def run_site(tmp: Path) -> Iterator[Site]:
    require_prometheus()
    vm_binary = require_victoria_metrics()
    site = Site(tmp)
    try:
        _start_proxies(site)
        _start_stores(site, vm_binary)
        site.start = math.floor(time.time())
        asyncio.run(_load(site))
        loaded = time.time()
        # the last counts scraped (and the rules evaluated after them): the window ends on the later
        # of those scrapes, not before it (a scrape's samples carry its start)
        last = max(scrapes_since(site.prom, site.proxy(i)[7:], loaded, rules=True) for i in (1, 2))
        site.end = math.ceil(last)
        time.sleep(max(0.0, site.end - time.time()))  # the window's end is not in the future
        _wait_until_vm_caught_up(site)
        yield site
    finally:
        for child in reversed(site.children):
            child.stop()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    with run_site(tmp_path_factory.mktemp("scale")) as s:
        yield s


def _records(site: Site) -> list[dict[str, Any]]:
    out = []
    for i in (1, 2):
        out += [json.loads(x) for x in (site.records(i) / "requests.jsonl").read_text().splitlines() if x.strip()]
    return out


def test_counts_agree_in_prometheus_victoria_metrics_and_the_records(site: Site) -> None:
    records = Counter((r["engine"], r["outcome"]) for r in _records(site))
    assert sum(records.values()) == 2 * 2 * 2 * 24 and records[("vllm", "failure")] > 0
    prom = _count_query(Prometheus(site.prom), site.end)
    vm = _count_query(Prometheus(site.vm), site.end)
    assert prom == {k: float(v) for k, v in records.items()}
    assert vm == prom
    # both proxies are told apart by instance, in the store as in Prometheus
    per_instance = Prometheus(site.vm).query('count by (instance) (llmbench_requests_total{job="llmbench-exporter"})',
                                             at=site.end)
    assert len(per_instance) == 2


def _export(site: Site, url: str, out: Path, *extra: str) -> dict[str, Any]:
    rc = evidence_main(["export", "--prometheus", url, "--window", f"{site.start:.0f},{site.end:.0f}",
                        "--out", str(out), "--header", "X-Scope-OrgID:lab-a", *extra])
    assert rc == 0
    return dict(json.loads((out / "manifest.json").read_text()))


def _panel_series(out: Path, board: str, panel: str) -> dict[str, dict[float, float | None]]:
    doc = json.loads((out / "data" / board / f"{panel}.json").read_text())
    return {f"{q['ref']} {s['name']}": {t: v for t, v in s["values"]} for q in doc["queries"] for s in q["series"]}


def _clean(md: str) -> None:
    """Every query of EVIDENCE.md: some series, no gaps, no series without a value."""
    rows = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| series")]
    assert rows
    for row in rows:
        series, _points, _nan, empty, gaps = (c.strip() for c in row.strip("|").split("|")[:5])
        assert int(series) > 0 and int(empty) == 0 and int(gaps) == 0, row
    assert "No series in this window" not in md


def _same_values(name: str, a: dict[str, dict[float, float | None]], b: dict[str, dict[float, float | None]]) -> None:
    """Point by point; a NaN (None: 0 of 0 requests is no ratio) is no point, as VictoriaMetrics,
    which never returns NaN, has it."""
    for series, all_points in a.items():
        points = {t: v for t, v in all_points.items() if v is not None}
        other = {t: v for t, v in b[series].items() if v is not None}
        assert set(points) == set(other), f"{name} {series}: different time grids"
        for t, v in points.items():
            assert other[t] == pytest.approx(v, rel=1e-9, abs=1e-9), f"{name} {series} at {t}: {v} vs {other[t]}"


def test_export_from_victoria_metrics_matches_prometheus(site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(TOKEN_ENV, SECRET)
    from_prom = tmp_path / "prom"
    from_vm = tmp_path / "vm"
    m_prom = _export(site, site.prom, from_prom, "--step", str(STEP))
    m_vm = _export(site, site.vm, from_vm, "--step", str(STEP))
    assert m_prom["prometheus"]["backend"]["name"] == "Prometheus" and m_prom["prometheus"]["backend"]["version"]
    assert m_vm["prometheus"]["backend"] == {**m_vm["prometheus"]["backend"], "name": "VictoriaMetrics", "version": None}
    assert m_vm["prometheus"]["url"] == site.vm and m_vm["grid_start"] == m_prom["grid_start"]
    md_prom, md_vm = (from_prom / "EVIDENCE.md").read_text(), (from_vm / "EVIDENCE.md").read_text()
    assert "Backend: Prometheus 2." in md_prom and RATE_NOTE not in md_prom
    assert "Backend: VictoriaMetrics (version not reported by the API)" in md_vm and RATE_NOTE in md_vm
    _clean(md_prom)
    _clean(md_vm)
    for board, spec in BOARDS.items():
        for panel in spec.panels:
            a, b = _panel_series(from_prom, board, panel.key), _panel_series(from_vm, board, panel.key)
            assert set(a) == set(b), f"{board}/{panel.key}: series differ"
            if panel_kind(panel) != "rate":
                _same_values(f"{board}/{panel.key}", a, b)
    for out in (from_prom, from_vm):
        for p in out.rglob("*"):
            assert not p.is_file() or SECRET.encode() not in p.read_bytes(), p
    printed = capsys.readouterr()
    assert SECRET not in printed.out + printed.err and "VictoriaMetrics" in printed.out


def test_victoria_metrics_export_states_its_default_step(site: Site, tmp_path: Path) -> None:
    manifest = _export(site, site.vm, tmp_path / "vm", "--boards", "comparison")
    md = (tmp_path / "vm" / "EVIDENCE.md").read_text()
    assert manifest["step_s"] == 15.0 and "does not report its scrape interval" in md
    # the grid ends on the window's end: the exact counts' last point covers the whole window
    ok = _panel_series(tmp_path / "vm", "comparison", "success_ratio")
    assert all(max(points) == site.end for points in ok.values())


def test_summarize_merges_both_proxies_exactly(site: Site, tmp_path: Path) -> None:
    out = tmp_path / "merged"
    assert evidence_main(["summarize", "--records", str(site.records(1)), "--records", str(site.records(2)),
                          "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    records = _records(site)
    for row in summary["rounds"]:
        mine = [r for r in records if (r["engine"], r["scenario"], r["round"]) == (row["engine"], row["scenario"], row["round"])]
        ok = [r for r in mine if r["outcome"] == "success"]
        assert row["requests"] == len(mine) == 2 * 24
        assert row["success"] == len(ok)
        assert row["ttft_p95_s"] == pytest.approx(percentile([r["ttft_s"] for r in ok], 95))
        assert row["tpot_p50_s"] == pytest.approx(percentile([r["tpot_s"] for r in ok if r["tpot_s"] is not None], 50))
        assert row["e2e_p95_s"] == pytest.approx(percentile([r["e2e_s"] for r in ok], 95))
    assert len(summary["rounds"]) == len(ENGINES) * 2
