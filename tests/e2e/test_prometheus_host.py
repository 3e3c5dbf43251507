"""Issue 27: a Prometheus config for a host set-up that works as shipped.

``prometheus/prometheus.yml`` knows only the compose service names; for a host set-up the user
had to edit its targets and copy ``rules/`` beside the copy.  ``prometheus/prometheus-host.yml``
targets the proxy and the engines on this machine, and its ``rule_files`` resolve from the file's
own directory, whatever the working directory: ``promtool check config`` accepts it from
elsewhere, a real Prometheus started from elsewhere loads the rules, and the quick start uses it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import requests
import yaml

from dashboards.catalogue import MIXIN
from exporter.harness.stack import free_port, wait_http

from tests.helpers import require_prometheus

ROOT = Path(__file__).resolve().parents[2]
HOST = ROOT / "prometheus" / "prometheus-host.yml"
COMPOSE = ROOT / "prometheus" / "prometheus.yml"


def test_promtool_accepts_the_host_config_as_shipped_from_anywhere(tmp_path: Path) -> None:
    require_prometheus()
    for cwd in (tmp_path, ROOT, ROOT / "docs"):
        r = subprocess.run(["promtool", "check", "config", str(HOST)], cwd=cwd, capture_output=True, text=True,
                           timeout=120)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        assert "SUCCESS: 1 rule files found" in out and "rules found" in out, out


def test_the_host_config_targets_this_machine_with_the_boards_jobs() -> None:
    host, compose = yaml.safe_load(HOST.read_text()), yaml.safe_load(COMPOSE.read_text())
    assert host["global"] == compose["global"] and host["rule_files"] == compose["rule_files"]
    jobs = {j["job_name"]: j for j in host["scrape_configs"]}
    assert set(jobs) == {j["job_name"] for j in compose["scrape_configs"]}
    assert {MIXIN.job, MIXIN.vllm_job, MIXIN.sglang_job} <= set(jobs)
    targets = {name: [t for c in j["static_configs"] for t in c["targets"]] for name, j in jobs.items()}
    assert targets[MIXIN.job] == ["127.0.0.1:9464"]
    assert targets[MIXIN.sglang_job] == ["127.0.0.1:30000"] and targets[MIXIN.vllm_job] == ["127.0.0.1:30001"]
    quickstart = (ROOT / "docs" / "quickstart.md").read_text()
    assert "--config.file=prometheus/prometheus-host.yml" in quickstart
    for port in ("30000", "30001", "9464"):  # the quick start's own ports
        assert port in quickstart


def test_a_prometheus_started_elsewhere_loads_the_rules(tmp_path: Path) -> None:
    require_prometheus()
    port = free_port()
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen(["prometheus", f"--config.file={HOST}", f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], cwd=tmp_path, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", 60)
        groups = requests.get(f"http://127.0.0.1:{port}/api/v1/rules", timeout=10).json()["data"]["groups"]
        assert groups and sum(len(g["rules"]) for g in groups) > 0
        loaded = yaml.safe_load(requests.get(f"http://127.0.0.1:{port}/api/v1/status/config",
                                             timeout=10).json()["data"]["yaml"])
        jobs = {j["job_name"]: j for j in loaded["scrape_configs"]}
        assert jobs[MIXIN.job]["static_configs"][0]["targets"] == ["127.0.0.1:9464"]
        assert loaded["rule_files"] == [str(HOST.parent / "rules" / "*.yml")]  # resolved beside the file
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
