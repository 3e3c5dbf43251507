"""The one-command demo, end to end, with the real Prometheus when it is installed."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from exporter.evidence.promapi import Prometheus
from exporter.harness.demo import table_row

from tests.helpers import require_prometheus


class _Output:
    """A child's output lines, read by a thread into a queue, so that a deadline holds also
    while the child prints nothing."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(proc.stdout,), daemon=True).start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.put(line)
        self.lines.put(None)

    def until(self, marker: str, timeout_s: float) -> Iterator[str]:
        """Lines up to the one containing ``marker``; fails at the deadline or at the end."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no {marker!r} from the demo within {timeout_s:.0f} s")
            if line is None:
                pytest.fail(f"the demo ended (status {self.proc.wait()}) before {marker!r}")
            yield line
            if marker in line:
                return

    def stop(self, timeout_s: float = 60) -> str:
        """SIGINT, then the rest of the output; SIGKILL when it does not end in time."""
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        rest = []
        while (line := self.lines.get(timeout=10)) is not None:
            rest.append(line)
        return "".join(rest)


def test_demo_end_to_end(tmp_path: Path) -> None:
    require_prometheus()
    out = tmp_path / "demo"
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter.cli", "demo", "--out", str(out), "--speed", "8", "--settle", "6",
         "--empty-text-rate", "0.1", "--keep-running"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: list[str] = []
    prom = None
    output = _Output(proc)
    rest = ""
    try:
        for line in output.until("stack left running", 300):
            lines.append(line)
            m = re.match(r"Prometheus: (http://\S+)", line)
            if m:
                prom = m.group(1)
        log = "".join(lines)
        assert "stack left running" in log, log
        assert prom, log

        series = Prometheus(prom).query

        ok = series('sum by (engine) (llmbench_requests_total{outcome="success"})')
        assert {s["metric"]["engine"] for s in ok} == {"sglang", "vllm"}
        assert series("vllm:generation_tokens_total") and series("sglang:generation_tokens_total")
        assert len(series("DCGM_FI_DEV_FB_USED")) == 8
        assert series("llmbench_time_to_first_token_seconds_bucket")
        assert re.search(r"^sglang\s+short-c1\s", log, re.M) and re.search(r"^vllm\s+short-c32\s", log, re.M), log
        assert "goodput %" in log and "good tok/s" in log and "SLO: TTFT <= 3.0 s" in log
        # the seed's empty 200s, diagnosed: the simulated vLLM was asked for its token ids
        empty = [json.loads(r) for r in (out / "records" / "requests.jsonl").read_text().splitlines()
                 if json.loads(r)["reason"] == "empty_text"]
        assert empty and f"empty 200s: {len(empty)} (" in log, log
        assert re.search(r"token ids \(0 with visible text\): \d+ x 2 '</s>' \(special\)", log), log
        for engine in ("sglang", "vllm"):
            summary = json.loads((out / "load" / engine / "summary.json").read_text())
            assert summary["cells"] and (out / "load" / engine / "rounds.csv").exists()
        records = (out / "records" / "requests.jsonl").read_text().splitlines()
        assert len(records) == sum(len((out / "load" / e / "requests.jsonl").read_text().splitlines())
                                   for e in ("sglang", "vllm", "sglang-replay", "vllm-replay"))
        _replays_its_own_traffic(out, log, "chat-s4", 12)
        # the demo ends with its report, and says where it is
        assert re.search(rf"^report:\s+{re.escape(str(out / 'report' / 'report.html'))}\s", log, re.M), log[-2000:]
        wide = [line for line in log.splitlines() if len(line) > 120 and not table_row(line)
                and len(line.split()) > 1]  # a path longer than a line stays whole
        assert not wide, wide
        assert {"What ran", "Core matrix"} <= set(re.findall(r"<h2>([^<]*)</h2>", (out / "report" / "report.html")
                                                               .read_text()))
        boards = sorted(p.name for p in (out / "dashboards").glob("*.json"))
        assert boards, "the demo writes the dashboards"
        assert (out / "evidence" / "EVIDENCE.md").exists() and (out / "evidence" / "comparison.png").exists()
        summary_md = (out / "summary" / "summary.md").read_text()
        assert "## Per turn" in summary_md and "## Per session" in summary_md, summary_md[-3000:]
        assert "## Per turn" in log  # the headline the demo prints shows the per-turn table too
        turns = json.loads((out / "summary" / "summary.json").read_text())["turns"]
        assert {(t["engine"], t["scenario"], t["turn"]) for t in turns} == {
            (e, "chat-s4", n) for e in ("sglang", "vllm") for n in (1, 2, 3)}
        assert all(t["cached_share"] > 0 for t in turns if t["turn"] > 1), turns
        # where TTFT goes: the simulated vLLM tells its own clock; at 24K and C32 the queue dominates
        parts = {(r["engine"], r["scenario"]): r for r in json.loads((out / "summary" / "summary.json").read_text())[
            "ttft_parts"]}
        long = parts[("vllm", "in24k-c32")]
        assert long["engine_timing"] == "stream" and long["timed"] == long["success"] > 0, long
        assert long["queue_at_p95_s"] > max(long["prefill_at_p95_s"], long["outside_at_p95_s"]), long
        assert parts[("sglang", "in24k-c32")]["engine_timing"] is None
        assert "## Where TTFT goes" in summary_md and "No engine timing: sglang" in summary_md
        compare = (out / "compare" / "compare.md").read_text()
        assert "vllm against sglang" in compare.lower() and "short-c32" in compare, compare[:500]
        assert (out / "compare" / "compare.csv").exists() and "compare:" in log
        _names_the_simulated_engines(out)
    finally:
        rest = output.stop()
    assert proc.returncode in (0, 130), rest
    assert "interrupted" in rest
    # every child is gone: nothing listens on the Prometheus port any more
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{prom}/-/ready", timeout=2)


def _replays_its_own_traffic(out: Path, log: str, scenario: str, n: int) -> None:
    """The proxy captured the demo's traffic (prefix hashes in every record), the demo wrote one cell of it
    as a Mooncake trace, replayed it against both engines as one more cell and captured the replay again:
    the same lengths and prefix sharing as the trace, each replay's row in the round table."""
    assert "trace: on" in log, log
    records = [json.loads(r) for r in (out / "records" / "requests.jsonl").read_text().splitlines()]
    assert all(r["prefix_hashes"] and r["trace_block_size"] == 64 for r in records if r["outcome"] == "success")
    trace = out / "trace" / f"{scenario}.jsonl"
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    assert len(lines) == n and "Block size: 64 tokens" in (out / "trace" / f"{scenario}.jsonl.md").read_text()
    assert f"trace:      {trace} ({n} requests of {scenario} on sglang" in re.sub(r"\n {2,}", " ", log), log
    for engine in ("sglang", "vllm"):
        assert re.search(rf"^{engine}\s+replay\s+\d+/{n}\s", log, re.M), log
        prose = re.sub(r"\n {2,}", " ", log)  # the demo wraps its prose at 120 columns, continuations indented
        assert re.search(rf"replay captured again \({engine}\): {n} of {n} requests( \(\d+ failed, compared by "
                         r"their usage\))?, lengths as in the trace, "
                         r"\d+ block ids with \d+ reused \(trace: \d+, \d+\): the same; arrivals within \d+ ms", prose), log
        replayed = json.loads((out / "load" / f"{engine}-replay" / "summary.json").read_text())
        assert replayed["cells"][0]["median"]["requests"] == n
    # the trace's prompts reach no file: the records keep hashes, the trace ids
    assert '"prompt"' not in (out / "records" / "requests.jsonl").read_text()


def _names_the_simulated_engines(out: Path) -> None:
    """What was measured: the evidence manifest and each llm-d report name the simulated engines'
    versions and arguments, and the proxy's config."""
    from exporter.harness.sim_identity import sim_version

    manifest = json.loads((out / "evidence" / "manifest.json").read_text())
    assert {(e["name"], e["kind"], e["version"]) for e in manifest["engines"]} == {
        ("sglang", "sglang", sim_version()), ("vllm", "vllm", sim_version())}, manifest["engines"]
    assert all(e["server_args"] for e in manifest["engines"]) and manifest["proxy"]["config_sha256"]
    llmd = json.loads((out / "llm-d" / "manifest.json").read_text())
    assert llmd["reports"] and {e["name"] for e in llmd["engines"]} == {"sglang", "vllm"}
    for entry in llmd["reports"]:
        engine = json.loads((out / "llm-d" / entry["path"]).read_text())["scenario"]["stack"][0]
        assert (engine["standardized"]["tool"], engine["standardized"]["tool_version"]) == \
            (entry["engine"], sim_version()) and engine["native"]["args"], engine


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
    assert re.search(r"^sglang\s+short-c2\s", proc.stdout, re.M) and (out / "rounds.txt").exists()
    assert (out / "compare" / "compare.md").exists(), proc.stdout
    assert (out / "prometheus" / "prometheus.yml").exists()  # ready for a Prometheus started later
    _replays_its_own_traffic(out, proc.stdout, "short-c2", 4)  # no sessions in the plan: its first cell


def test_demo_without_the_trace_extra_says_what_it_skipped(tmp_path: Path) -> None:
    """Without tokenizers (the trace extra) the demo runs on, without a trace, and says so."""
    hide = tmp_path / "hide" / "tokenizers"
    hide.mkdir(parents=True)
    (hide / "__init__.py").write_text("raise ImportError('tokenizers hidden by the test')\n")
    plan = tmp_path / "tiny.yaml"
    plan.write_text("stages:\n  - name: core\n    cells:\n"
                    "      - {scenario: short-c2, input_tokens: 16, output_tokens: 8, concurrency: 2, requests: 4}\n")
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "demo", "--out", str(out), "--plan", str(plan), "--speed", "20",
         "--settle", "0", "--no-prometheus"], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(hide.parent), os.environ.get("PYTHONPATH", "")])},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "trace: skipped (the trace extra is not installed: pip install -e '.[trace]')" in proc.stdout
    assert "replaying" not in proc.stdout and "replay captured again" not in proc.stdout and not (out / "trace").exists()
    assert re.search(r"^vllm\s+short-c2\s+4/4", proc.stdout, re.M), proc.stdout
