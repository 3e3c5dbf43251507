"""``evidence summarize --engine-log DIR`` against a real SGLang (0.5.23 on the CPU, the tiny
model of ``tests/sglang_engine.py``): started with ``--enable-metrics --export-metrics-to-file
--export-metrics-to-file-dir DIR``, it writes one line per request, its prompt included.  Requests
through the proxy, then the join: every record gets SGLang's queue, prefill and decode by its
response id, SGLang's own start-up warm-up matches no record, and the prompt reaches no output.

A server of its own (the one of ``test_sglang_real.py`` is started without the file export, and
its last tests kill it).  Needs ``.ci/install-sglang.sh`` (skipped without it, failed without it
when LLMBENCH_REQUIRE_SGLANG=1).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from exporter.evidence.cli import main as evidence_main
from exporter.evidence.enginelog import FILE_GLOB, join_dirs

from tests.helpers import read_records
from tests.sglang_engine import SglangServer, build_model, require_sglang
from tests.vllm_engine import start_proxy

#: in every prompt: SGLang's lines hold it, no output of ours may
MARKER = "zebra-7c41"
#: (route, usage): streams that ask for usage and streams whose usage the proxy injects
REQUESTS = [("completions", "require"), ("chat/completions", "require"), ("completions", "inject"),
            ("chat/completions", "inject"), ("completions", "require")]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(the proxy's records directory, SGLang's metrics directory) after the requests."""
    require_sglang()
    out = tmp_path_factory.mktemp("sglang-engine-log")
    metrics_dir = out / "sglang-metrics"
    with contextlib.ExitStack() as stack:
        server = SglangServer(build_model(out / "model"), out / "logs",  # its argv has --enable-metrics
                              extra=["--export-metrics-to-file", "--export-metrics-to-file-dir", str(metrics_dir)])
        stack.callback(server.stop)
        server.start()
        proxy, url = start_proxy(out, [{"name": "sglang", "upstream": server.url, "usage": "require"},
                                       {"name": "sglang-inject", "upstream": server.url, "usage": "inject"}])
        stack.callback(proxy.stop)
        for i, (route, usage) in enumerate(REQUESTS):
            _send(url, route, usage, i)
        _wait_for(lambda: len(read_records(out)) == len(REQUESTS), "the proxy's records")
        # SGLang writes each line from a task after the request ended
        _wait_for(lambda: _lines(metrics_dir) >= len(REQUESTS) + 1, "SGLang's request lines")
        yield out / "run", metrics_dir


def _send(url: str, route: str, usage: str, i: int) -> None:
    engine = "sglang" if usage == "require" else "sglang-inject"
    prompt = f"Request {i}: tell me about the {MARKER} in one line."
    body: dict[str, Any] = {"model": "tiny", "stream": True, "ignore_eos": True, "max_tokens": 8}
    if route == "completions":
        body["prompt"] = prompt
    else:
        body["messages"] = [{"role": "user", "content": prompt}]
    if usage == "require":
        body["stream_options"] = {"include_usage": True}
    with requests.post(f"{url}/{engine}/v1/{route}", json=body, stream=True, timeout=300) as r:
        assert r.status_code == 200
        for _ in r.iter_content(None):
            pass


def _lines(directory: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in directory.glob(FILE_GLOB)) if directory.is_dir() else 0


def _wait_for(done: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout_s:.0f} s")
        time.sleep(0.1)


def test_every_record_gets_sglangs_parts_and_the_warm_up_matches_none(served: tuple[Path, Path]) -> None:
    records_dir, metrics_dir = served
    records = read_records(records_dir.parent)  # the proxy writes them under run/
    assert all(r["outcome"] == "success" and r["engine_timing"] is None for r in records), records
    joined, report = join_dirs(records, [metrics_dir])
    assert report["matched"] == report["joined"] == len(records) and report["matched_no_record"] == 1, report
    assert report["missing_parts"] == {} and report["unreadable"] == 0, report
    for r in joined:
        assert r["engine_timing"] == "engine-log", r
        assert r["engine_queue_s"] >= 0 and r["engine_prefill_s"] > 0 and r["engine_decode_s"] > 0, r
        # SGLang's clock sees less than the proxy's: its queue and prefill lie inside the TTFT
        assert r["engine_queue_s"] + r["engine_prefill_s"] < r["ttft_s"], r
        assert r["ttft_outside_engine_s"] == pytest.approx(r["ttft_s"] - r["engine_queue_s"] - r["engine_prefill_s"],
                                                           abs=2e-6)


def test_summarize_splits_ttft_and_no_prompt_reaches_an_output(served: tuple[Path, Path], tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    records_dir, metrics_dir = served
    assert MARKER in "".join(p.read_text() for p in metrics_dir.glob(FILE_GLOB))  # SGLang does keep the prompt
    out = tmp_path / "summary"
    assert evidence_main(["summarize", "--records", str(records_dir), "--engine-log", str(metrics_dir),
                          "--out", str(out)]) == 0
    std = capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["engine_log"]["matched_no_record"] == 1 and "1 matched none" in std.out
    rows = summary["ttft_parts"]
    assert rows and sum(r["timed"] for r in rows) == len(REQUESTS)
    for row in rows:
        assert row["engine_timing"] == "engine-log" and row["timed"] == row["success"]
        parts = [row[f"{p}_at_p95_s"] for p in ("queue", "prefill", "outside")]
        assert sum(parts) == pytest.approx(row["ttft_p95_s"])
    assert "## Where TTFT goes" in (out / "summary.md").read_text() and "engine log has no" not in std.err
    for path in out.rglob("*"):
        assert MARKER not in path.read_text(errors="replace"), path
    assert MARKER not in std.out and MARKER not in std.err
