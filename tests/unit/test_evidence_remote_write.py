"""prometheus/remote-write/: valid configs for a Prometheus (and an agent) per site forwarding to one store."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import require_prometheus

ROOT = Path(__file__).resolve().parents[2] / "prometheus" / "remote-write"


@pytest.mark.parametrize("name", ["prometheus.yml", "agent.yml"])
def test_remote_write_configs_label_their_site(name: str) -> None:
    doc = yaml.safe_load((ROOT / name).read_text(encoding="utf-8"))
    assert doc["remote_write"][0]["url"].endswith("/api/v1/write")
    assert doc["global"]["external_labels"]["site"]
    assert "llmbench-exporter" in {j["job_name"] for j in doc["scrape_configs"]}


@pytest.mark.slow  # promtool: a process of its own
@pytest.mark.parametrize("name, agent", [("prometheus.yml", False), ("agent.yml", True)])
def test_remote_write_configs_pass_promtool(name: str, agent: bool) -> None:
    require_prometheus()
    promtool = shutil.which("promtool")
    assert promtool is not None
    proc = subprocess.run([promtool, "check", "config", *(["--agent"] if agent else []), str(ROOT / name)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
