"""prometheus/remote-write/: valid configs for a Prometheus (and an agent) per site forwarding to one store."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2] / "prometheus" / "remote-write"


@pytest.mark.parametrize("name, agent", [("prometheus.yml", False), ("agent.yml", True)])
def test_remote_write_configs_are_valid_and_label_their_site(name: str, agent: bool) -> None:
    doc = yaml.safe_load((ROOT / name).read_text(encoding="utf-8"))
    assert doc["remote_write"][0]["url"].endswith("/api/v1/write")
    assert doc["global"]["external_labels"]["site"]
    assert "llmbench-exporter" in {j["job_name"] for j in doc["scrape_configs"]}
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    proc = subprocess.run([promtool, "check", "config", *(["--agent"] if agent else []), str(ROOT / name)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
