"""``evidence summarize --engine-log DIR``: SGLang's per-request lines joined to the records by
response id, and where each round's TTFT went (exporter/evidence/enginelog.py, ttftparts.py).

SGLang's lines hold the prompt (``request_parameters``): a marker put there, and in every other
field a line may carry, must reach no output file, nor stdout or stderr."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from exporter.evidence.cli import main as evidence_main
from exporter.evidence.enginelog import join_dirs
from exporter.evidence.ttftparts import ttft_parts

MARKER = "PROMPT-MARKER-5e1f0c"
T0 = 1_767_000_000.0


def _rec(engine: str, rid: str, ttft: float, start: float, **extra: Any) -> dict[str, Any]:
    return {"id": f"req-{rid}", "run_id": "run1", "engine": engine, "scenario": "long-c8", "round": 1,
            "start_unix": T0 + start, "e2e_s": ttft + 1.0, "ttft_s": ttft, "tpot_s": 0.01, "completion_tokens": 100,
            "outcome": "success", "reason": None, "response_id": rid, "engine_queue_s": None,
            "engine_prefill_s": None, "engine_decode_s": None, "ttft_outside_engine_s": None, "engine_timing": None,
            **extra}


def _line(rid: str, queue: float | None, prefill: float | None, decode: float = 1.0) -> str:
    """An SGLang request line: its stamps (unix seconds), the prompt, and other meta_info."""
    line: dict[str, Any] = {"request_parameters": json.dumps({"text": f"tell me {MARKER}", "rid": rid}),
                            "id": rid, "prompt_tokens": 12, "completion_tokens": 100, "e2e_latency": 2.0,
                            "finish_reason": {"type": "length", "note": MARKER}, "output_text": MARKER}
    if queue is not None:
        line["queue_time"] = queue
    if prefill is not None:
        entry = T0 + 50.0
        line.update(forward_entry_time=entry, prefill_finished_time=entry + prefill,
                    request_finished_ts=entry + prefill + decode)
    return json.dumps(line) + "\n"


def _engine_log(directory: Path) -> Path:
    """Two hours' files: SGLang's warm-up first (it matches no record), a line without the
    --enable-metrics stamps, and one that is no JSON at all."""
    directory.mkdir()
    (directory / "sglang-request-metrics-20260101_09.log").write_text(
        _line("warmup-0d4e", 0.0, 0.05) + _line("s1", 0.1, 0.2) + _line("s2", 0.2, 0.3))
    (directory / "sglang-request-metrics-20260101_10.log").write_text(
        _line("s3", 1.0, 0.5) + _line("s4", 0.4, None) + f"not json {MARKER}\n")
    (directory / "other.log").write_text(_line("s1", 9.0, 9.0))  # not SGLang's name: not read
    return directory


def _records(directory: Path) -> Path:
    recs = [_rec("sglang", "s1", 0.5, 0.0), _rec("sglang", "s2", 1.0, 1.0), _rec("sglang", "s3", 2.0, 2.0),
            _rec("sglang", "s4", 1.5, 3.0), _rec("vllm", "v1", 0.4, 10.0)]
    directory.mkdir()
    (directory / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return directory


def test_summarize_joins_sglangs_request_log_and_keeps_the_prompt_out(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    records, log, out = _records(tmp_path / "records"), _engine_log(tmp_path / "sglang-metrics"), tmp_path / "out"
    assert evidence_main(["summarize", "--records", str(records), "--engine-log", str(log), "--out", str(out)]) == 0
    std = capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    report = summary["engine_log"]
    assert (report["files"], report["lines"], report["matched"], report["joined"]) == (2, 6, 4, 4)
    assert report["matched_no_record"] == 1 and report["unreadable"] == 1  # the warm-up; the non-JSON line
    assert report["missing_parts"] == {"prefill_s, decode_s": 1}
    assert ("warning: 1 request: engine log has no prefill_s, decode_s (was SGLang started with "
            "--enable-metrics?)") in std.err
    assert "1 matched none (SGLang's own start-up warm-up" in std.out
    sglang, vllm = summary["ttft_parts"]
    assert sglang["engine"] == "sglang" and sglang["engine_timing"] == "engine-log" and sglang["timed"] == 3
    assert sglang["success"] == 4
    # s1..s3 (ttft, queue, prefill, outside): (0.5, .1, .2, .2), (1, .2, .3, .5), (2, 1, .5, .5)
    assert (sglang["ttft_p50_s"], sglang["queue_at_p50_s"], sglang["prefill_at_p50_s"]) == pytest.approx((1, .2, .3))
    assert sglang["outside_at_p50_s"] == pytest.approx(0.5)
    p95 = [sglang[k] for k in ("queue_at_p95_s", "prefill_at_p95_s", "outside_at_p95_s")]
    assert p95 == pytest.approx([0.92, 0.48, 0.5]) and sum(p95) == pytest.approx(sglang["ttft_p95_s"]) == 1.9
    means = [sglang[k] for k in ("queue_mean_s", "prefill_mean_s", "outside_mean_s")]
    assert means == pytest.approx([1.3 / 3, 1.0 / 3, 1.2 / 3]) and sum(means) == pytest.approx(3.5 / 3)
    assert vllm["engine_timing"] is None and vllm["timed"] == 0
    md = (out / "summary.md").read_text()
    assert "## Where TTFT goes" in md and "No engine timing: vllm long-c8" in md
    assert "| sglang | long-c8 | 1 | 3/4 | engine-log | P95 | 1900 | 920 | 480 | 500 | queue |" in md
    assert (out / "ttft_parts.csv").exists()
    for path in out.rglob("*"):  # nothing of a line but its timing reaches any output
        assert MARKER not in path.read_text(errors="replace"), path
    assert MARKER not in std.out and MARKER not in std.err


def test_a_record_with_the_streams_timing_keeps_it(tmp_path: Path) -> None:
    log = _engine_log(tmp_path / "log")
    stream = _rec("sglang", "s1", 0.5, 0.0, engine_queue_s=0.01, engine_prefill_s=0.02, engine_decode_s=0.3,
                  ttft_outside_engine_s=0.47, engine_timing="stream")
    (kept, joined), report = join_dirs([stream, _rec("sglang", "s2", 1.0, 1.0)], [log])
    assert kept == stream and report["kept_stream_timing"] == 1
    assert joined["engine_timing"] == "engine-log" and joined["ttft_outside_engine_s"] == pytest.approx(0.5)
    assert (joined["engine_queue_s"], joined["engine_prefill_s"]) == pytest.approx((0.2, 0.3))
    assert MARKER not in json.dumps([kept, joined, report])


def test_ttft_parts_say_no_engine_timing_without_it() -> None:
    rows = ttft_parts({("r", "sglang", "s", 1): [_rec("sglang", "x", 1.0, 0.0)]})
    assert rows[0]["timed"] == 0 and rows[0]["engine_timing"] is None and rows[0]["queue_at_p95_s"] is None


def test_an_engine_log_dir_without_sglangs_files_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records, empty = _records(tmp_path / "records"), tmp_path / "empty"
    empty.mkdir()
    assert evidence_main(["summarize", "--records", str(records), "--engine-log", str(empty)]) == 2
    err = capsys.readouterr().err
    assert "no sglang-request-metrics-*.log" in err and "--export-metrics-to-file-dir" in err
    assert evidence_main(["summarize", "--records", str(records), "--engine-log", str(tmp_path / "nope")]) == 2
