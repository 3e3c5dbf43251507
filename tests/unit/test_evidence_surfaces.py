"""Issue 27: every surface of ``evidence summarize`` right: the share of requests whose timing is
uncertain, a warning when it is large, and nothing written beside the records unless asked."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from exporter.evidence.cli import main as evidence_main

RUN = "20261201T090000Z-aaaaaa"


def _round(rnd: int, t0: float, uncertainty: list[float], ttft: float = 0.2) -> list[dict[str, Any]]:
    """A closed loop of two clients, one request per uncertainty given."""
    return [{"id": f"r{rnd}-{i}", "run_id": RUN, "engine": "vllm", "scenario": "short-c2", "round": rnd,
             "start_unix": t0 + (i // 2) * 1.0, "e2e_s": 1.0, "ttft_s": ttft, "tpot_s": 0.01,
             "completion_tokens": 100, "outcome": "success", "reason": None, "timing_uncertainty_s": u}
            for i, u in enumerate(uncertainty)]


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_uncertain_share_per_round_and_a_warning_above_5_percent(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Round 1: 1 of 20 requests above 10% of its TTFT (5%: no warning); round 2: 3 of 20 (15%)."""
    calm = [0.001] * 19 + [0.05]  # 0.05 s > 10% of 0.2 s; 0.02 s exactly would not exceed it
    lagging = [0.001] * 17 + [0.3, 0.15, 0.021]
    d = _write(tmp_path / "rec", _round(1, 1000.0, calm) + _round(2, 2000.0, lagging)
               + [{**_round(3, 3000.0, [0.5])[0], "id": "failed", "outcome": "failure", "reason": "http_status",
                   "ttft_s": None}])
    out = tmp_path / "out"
    assert evidence_main(["summarize", "--records", str(d), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    s = json.loads((out / "summary.json").read_text())
    shares = {r["round"]: r["uncertain"] for r in s["rounds"]}
    assert shares[1] == pytest.approx(0.05) and shares[2] == pytest.approx(0.15)
    assert shares[3] is None  # no request with a TTFT: no share
    rounds_csv = list(csv.DictReader(open(out / "rounds.csv", newline="")))
    assert [float(r["uncertain"]) for r in rounds_csv if r["round"] == "2"] == [pytest.approx(0.15)]
    md = (out / "summary.md").read_text()
    table = md.split("## Rounds")[1]
    header = next(line for line in table.splitlines() if line.startswith("| engine"))
    assert "| uncertain |" in header
    assert "| 15.0 % |" in table and "| 5.0 % |" in table
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "short-c2#2" in warnings[0] and "15%" in warnings[0]
    assert "Traceback" not in captured.err
    # the medians say it too, over every request of the cell
    median, = s["medians"]
    assert median["uncertain"] == pytest.approx(4 / 40)


def test_no_warning_when_no_round_is_uncertain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _write(tmp_path / "rec", _round(1, 1000.0, [0.001] * 20))
    assert evidence_main(["summarize", "--records", str(d)]) == 0
    assert "warning:" not in capsys.readouterr().err


def test_summarize_writes_beside_the_records_only_when_asked(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Without --out the tables are printed and the live records directory is left as it was."""
    d = _write(tmp_path / "rec", _round(1, 1000.0, [0.001] * 20))
    before = sorted(p.name for p in d.iterdir())
    assert evidence_main(["summarize", "--records", str(d)]) == 0
    out = capsys.readouterr().out
    assert "## Median of rounds" in out and "nothing written" in out
    assert sorted(p.name for p in d.iterdir()) == before
    # several proxies' records need no --out either: nothing is written
    assert evidence_main(["summarize", "--records", str(d), "--records", str(d)]) == 0
    assert sorted(p.name for p in d.iterdir()) == before
    # asked for: beside the records is fine
    assert evidence_main(["summarize", "--records", str(d), "--out", str(d / "summary")]) == 0
    assert (d / "summary" / "summary.json").exists()
