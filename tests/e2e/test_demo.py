"""The one-command demo, end to end, with the real Prometheus when it is installed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.helpers import require_prometheus


def test_demo_end_to_end(tmp_path: Path) -> None:
    require_prometheus()
    out = tmp_path / "demo"
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter.cli", "demo", "--out", str(out), "--speed", "8", "--settle", "6",
         "--keep-running"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: list[str] = []
    prom = None
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 300
        for line in proc.stdout:
            lines.append(line)
            m = re.match(r"Prometheus: (http://\S+)", line)
            if m:
                prom = m.group(1)
            if "stack left running" in line or time.monotonic() > deadline:
                break
        log = "".join(lines)
        assert "stack left running" in log, log
        assert prom, log

        def series(expr: str) -> list[dict]:
            r = requests.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=10)
            r.raise_for_status()
            return r.json()["data"]["result"]

        ok = series('sum by (engine) (llmbench_requests_total{outcome="success"})')
        assert {s["metric"]["engine"] for s in ok} == {"sglang", "vllm"}
        assert series("vllm:generation_tokens_total") and series("sglang:generation_tokens_total")
        assert len(series("DCGM_FI_DEV_FB_USED")) == 8
        assert series("llmbench_time_to_first_token_seconds_bucket")
        assert "sglang   short-c1" in log and "vllm     short-c32" in log
        for engine in ("sglang", "vllm"):
            summary = json.loads((out / "load" / engine / "summary.json").read_text())
            assert summary["cells"] and (out / "load" / engine / "rounds.csv").exists()
        records = (out / "records" / "requests.jsonl").read_text().splitlines()
        assert len(records) == sum(
            len((out / "load" / e / "requests.jsonl").read_text().splitlines()) for e in ("sglang", "vllm"))
        boards = sorted(p.name for p in (out / "dashboards").glob("*.json"))
        assert boards, "the demo writes the dashboards"
        assert (out / "evidence" / "EVIDENCE.md").exists() and (out / "evidence" / "comparison.png").exists()
        assert (out / "summary" / "summary.md").exists()
    finally:
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    assert proc.returncode in (0, 130), rest
    assert "interrupted" in rest
    # every child is gone: nothing listens on the Prometheus port any more
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{prom}/-/ready", timeout=2)


def test_demo_without_prometheus_says_how_to_get_it(tmp_path: Path) -> None:
    plan = tmp_path / "tiny.yaml"
    plan.write_text("stages:\n  - name: core\n    cells:\n"
                    "      - {scenario: short-c2, input_tokens: 16, output_tokens: 8, concurrency: 2, requests: 4}\n")
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "demo", "--out", str(out), "--plan", str(plan), "--speed", "20",
         "--settle", "0"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PATH": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no `prometheus` binary on PATH" in proc.stdout and "apt-get install" in proc.stdout
    assert "sglang   short-c2" in proc.stdout and (out / "rounds.txt").exists()
    assert (out / "prometheus" / "prometheus.yml").exists()  # ready for a Prometheus started later
