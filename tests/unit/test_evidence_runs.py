"""Runs that never mix, verdicts only with evidence, a summary you can paste."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from exporter.core.stats import median_of_rounds, round_row
from exporter.evidence.cli import main as evidence_main
from exporter.evidence.compare import compare_dirs
from exporter.evidence.noise import LOADS_DIFFER, ONE_ROUND
from exporter.proxy.config import DEFAULT_SLO

RUN_1, RUN_2 = "20261201T090000Z-aaaaaa", "20261201T100000Z-bbbbbb"


def _round(scenario: str, rnd: int, t0: float, *, run: str | None = RUN_1, engine: str = "vllm", c: int = 2,
           e2e: float = 1.0, ttft: float = 0.2, n: int = 10, fail: str | None = None) -> list[dict[str, Any]]:
    """A closed loop of ``c`` clients back to back: ``n`` requests of ``e2e`` seconds, 100 tokens
    each; the last one fails with ``fail`` when given."""
    out = []
    for i in range(n):
        rec = {"id": f"{run}-{engine}-{scenario}-{rnd}-{i}", "engine": engine, "scenario": scenario, "round": rnd,
               "start_unix": t0 + (i // c) * e2e, "e2e_s": e2e, "ttft_s": ttft + i * 1e-4, "tpot_s": 0.01,
               "completion_tokens": 100, "outcome": "success", "reason": None}
        if run is not None:
            rec["run_id"] = run
        if fail and i == n - 1:
            rec.update(outcome="failure", reason=fail, ttft_s=None, tpot_s=None)
        out.append(rec)
    return out


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _summary(tmp_path: Path, records: list[dict[str, Any]], *args: str) -> dict[str, Any]:
    d = _write(tmp_path / "rec", records)
    out = tmp_path / "out"
    assert evidence_main(["summarize", "--records", str(d), "--out", str(out), *args]) == 0
    return json.loads((out / "summary.json").read_text())


def test_rounds_of_two_runs_never_merge(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An ad-hoc run and a plan's run in one records directory, both with round 1 of short-c8."""
    recs = _round("short-c8", 1, 1000.0, run=RUN_1, n=4, e2e=5.0) + _round("short-c8", 1, 5000.0, run=RUN_2, n=20)
    s = _summary(tmp_path, recs)
    assert [(r["run"], r["requests"]) for r in s["rounds"]] == [(RUN_1, 4), (RUN_2, 20)]
    assert [(m["run"], m["rounds"]) for m in s["medians"]] == [(RUN_1, 1), (RUN_2, 1)]
    assert [r["run_id"] for r in s["runs"]] == [RUN_1, RUN_2]
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "| run |" in md and RUN_2 in md
    picked = _summary(tmp_path / "p", recs, "--run", RUN_2)
    assert [(r["run"], r["requests"]) for r in picked["rounds"]] == [(RUN_2, 20)]
    capsys.readouterr()
    assert evidence_main(["summarize", "--records", str(tmp_path / "rec"), "--run", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and RUN_1 in err and RUN_2 in err


def test_records_without_a_run_id_form_one_run_unknown(tmp_path: Path) -> None:
    s = _summary(tmp_path, _round("s", 1, 0.0, run=None) + _round("s", 2, 100.0, run=None))
    assert [r["run_id"] for r in s["runs"]] == ["unknown"] and s["medians"][0]["rounds"] == 2


def test_summary_md_is_in_plan_order_with_human_units(tmp_path: Path) -> None:
    recs = (_round("short-c8", 1, 0.0, fail="empty_text") + _round("short-c32", 1, 100.0)
            + _round("short-c8", 2, 200.0) + _round("short-c32", 2, 300.0))
    s = _summary(tmp_path, recs)
    assert [(r["scenario"], r["round"]) for r in s["rounds"]] == [("short-c8", 1), ("short-c32", 1),
                                                                  ("short-c8", 2), ("short-c32", 2)]
    assert [m["scenario"] for m in s["medians"]] == ["short-c8", "short-c32"]
    m8 = s["medians"][0]
    assert m8["failure_reasons"] == {"empty_text": 1} and "slo_attainment" not in m8
    assert "slo_attainment" not in m8["spread"] and "slo_attainment" not in s["rounds"][0]
    md = (tmp_path / "out" / "summary.md").read_text()
    median_table = md.split("## Median of rounds")[1].split("##")[0]
    assert median_table.index("| vllm | short-c8 |") < median_table.index("| vllm | short-c32 |")
    assert "TTFT P95 ms" in median_table and "goodput %" in median_table and "empty_text 1" in median_table
    ttft_p95 = s["medians"][1]["ttft_p95_s"]
    assert f"| {ttft_p95 * 1000:.0f} " in median_table and f"{ttft_p95:.4g}" not in md  # ms, not seconds
    assert "| 100.0 " in median_table  # goodput of short-c32 in per cent
    assert "slo_attainment" not in md
    for title in ("## Median of rounds", "## Engines side by side", "## Load per round", "## Rounds", "## TTFT"):
        heads = [line for line in md.splitlines() if line.startswith(title)]
        assert all("proxy-side, from requests.jsonl" in h for h in heads), heads
    cols = next(csv.reader(open(tmp_path / "out" / "medians.csv", newline="")))
    assert "ttft_p95_s" in cols and "goodput_ratio" in cols and "slo_attainment" not in cols


def test_a_zero_width_interval_is_no_interval() -> None:
    """Fixed-length outputs and no failures: resampling cannot move the throughput."""
    recs = _round("s", 1, 0.0, n=40)
    row = round_row(recs, slo=DEFAULT_SLO)
    m = median_of_rounds([row], [recs], slo=DEFAULT_SLO)
    assert m["ci95"]["output_throughput_tok_s"] is None
    assert m["ci95"]["ttft_p95_s"] is not None and m["ci95"]["ttft_p95_s"][1] > m["ci95"]["ttft_p95_s"][0]


def _rows(result: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["scenario"], r["metric"]): r for r in result["rows"]}


def test_compare_gives_no_verdict_on_one_round(tmp_path: Path) -> None:
    a = _write(tmp_path / "a", _round("s", 1, 0.0, engine="sglang", ttft=0.2))
    b = _write(tmp_path / "b", _round("s", 1, 0.0, engine="vllm", ttft=0.3, run=RUN_2))
    rows = _rows(compare_dirs(a, b, tmp_path / "o", "sglang", "vllm"))
    assert rows[("s", "ttft_p95_s")]["verdict"] == ONE_ROUND  # 50% slower, but one round: no spread
    assert ONE_ROUND in (tmp_path / "o" / "compare.md").read_text()


def test_compare_refuses_a_verdict_when_the_loads_differ(tmp_path: Path) -> None:
    a_recs = _round("s", 1, 0.0, engine="sglang", c=2) + _round("s", 2, 100.0, engine="sglang", c=2)
    b_recs = (_round("s", 1, 0.0, engine="vllm", c=5, ttft=0.5, n=20)  # 4 × C requests: a closed loop can be told
              + _round("s", 2, 100.0, engine="vllm", c=5, ttft=0.5, n=20))
    a, b = _write(tmp_path / "a", a_recs), _write(tmp_path / "b", b_recs)
    rows = _rows(compare_dirs(a, b, tmp_path / "o", "sglang", "vllm", png=False))
    row = rows[("s", "ttft_p95_s")]
    assert row["verdict"] == LOADS_DIFFER and "closed-loop 2 against closed-loop 5" in row["why"]
    md = (tmp_path / "o" / "compare.md").read_text()
    assert "closed-loop 2 against closed-loop 5" in md and "worse" not in md.split("Verdict rule")[1].split("\n", 1)[1]
    # the same load on both sides: judged
    b_same = _round("s", 1, 0.0, engine="vllm", ttft=0.5) + _round("s", 2, 100.0, engine="vllm", ttft=0.5)
    rows = _rows(compare_dirs(a, _write(tmp_path / "b2", b_same), tmp_path / "o2", "sglang", "vllm", png=False))
    assert rows[("s", "ttft_p95_s")]["verdict"] == "worse"


def test_compare_keeps_runs_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    both = _round("s", 1, 0.0, run=RUN_1) + _round("s", 2, 100.0, run=RUN_1) + _round("s", 1, 900.0, run=RUN_2)
    d = _write(tmp_path / "a", both)
    capsys.readouterr()
    assert evidence_main(["compare", str(d), str(d), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--run-a" in err and RUN_1 in err
    assert evidence_main(["compare", str(d), str(d), "--out", str(tmp_path / "o"), "--run-a", RUN_1,
                          "--run-b", RUN_2, "--no-png"]) == 0
    table = list(csv.DictReader(open(tmp_path / "o" / "compare.csv", newline="")))
    row = next(r for r in table if r["metric"] == "success_ratio")
    assert (row["rounds_a"], row["rounds_b"], row["verdict"]) == ("2", "1", ONE_ROUND)


def test_two_proxies_of_one_run_merge_and_a_later_run_does_not(tmp_path: Path) -> None:
    """Each proxy start has its own run id: proxies whose runs overlap in time are one run."""
    host_a = _write(tmp_path / "a", _round("s", 1, 1000.0, run=RUN_1, n=6))
    host_b = _write(tmp_path / "b", [{**r, "id": r["id"] + "-b", "start_unix": r["start_unix"] + 0.5}
                                     for r in _round("s", 1, 1000.0, run="20261201T090001Z-cccccc", n=8)])
    later = _write(tmp_path / "c", _round("s", 1, 9000.0, run=RUN_2, n=4))
    out = tmp_path / "out"
    assert evidence_main(["summarize", "--records", str(host_a), "--records", str(host_b), "--records", str(later),
                          "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    joined = f"{RUN_1}+20261201T090001Z-cccccc"
    assert [(r["run"], r["requests"]) for r in s["rounds"]] == [(joined, 14), (RUN_2, 4)]
    assert any("overlap in time" in note for note in s["sources"])
    assert evidence_main(["summarize", "--records", str(host_a), "--records", str(host_b), "--out", str(tmp_path / "p"),
                          "--run", RUN_1]) == 0
    picked = json.loads((tmp_path / "p" / "summary.json").read_text())
    assert [(r["run"], r["requests"]) for r in picked["rounds"]] == [(joined, 14)]
