"""Surfaces a new user misread (issue 38), each mended: the noise rule's ties within float error; a
run not compared with itself; ``--out`` of summarize and compare refused when not empty without
``--force``; ``evidence decode`` of a file that is not a capture exits 2; help descriptions."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.evidence.cli import build_parser, main
from exporter.evidence.noise import METRICS, verdict

from tests.report_records import write_records

SUCCESS = next(m for m in METRICS if m.key == "success_ratio")


def test_a_tie_within_float_error_is_within_noise() -> None:
    # 2/7 against 1.0: the difference and the spread (6/7 - 1/7) are the same ratio, one float apart
    a = {"success_ratio": 1.0, "rounds": 3, "spread": {"success_ratio": [1.0, 1.0]}, "ci95": {}}
    b = {"success_ratio": 2 / 7, "rounds": 3, "spread": {"success_ratio": [1 / 7, 6 / 7]}, "ci95": {}}
    assert abs(b["success_ratio"] - a["success_ratio"]) > 6 / 7 - 1 / 7  # the float tie itself
    assert verdict(a, b, SUCCESS) == "within noise"
    b_worse = {**b, "spread": {"success_ratio": [1 / 7, 5 / 7]}}
    assert verdict(a, b_worse, SUCCESS) == "worse"


def test_a_run_is_not_compared_with_itself(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = write_records(tmp_path / "records")
    assert main(["compare", str(records), str(records), "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "compared with themselves" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())
    assert main(["compare", str(records), str(records), "--label-a", "sglang", "--label-b", "vllm",
                 "--out", str(tmp_path / "c2"), "--no-png"]) == 0


@pytest.mark.parametrize("command", ["summarize", "compare"])
def test_a_non_empty_out_is_refused_without_force(tmp_path: Path, command: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    records = write_records(tmp_path / "records")
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    args = (["summarize", "--records", str(records)] if command == "summarize" else
            ["compare", str(records), str(records), "--label-a", "sglang", "--label-b", "vllm", "--no-png"])
    assert main([*args, "--out", str(out)]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["manifest.json"]
    assert main([*args, "--out", str(out), "--force"]) == 0
    assert not (out / "manifest.json").exists()


def test_decode_of_a_file_that_is_not_a_capture_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "notes.txt"
    junk.write_text("not a capture\n")
    assert main(["decode", str(junk)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a readable capture" in err[0] and "Traceback" not in err[0]


@pytest.mark.parametrize("command", ["decode", "summarize", "compare", "report"])
def test_each_command_has_a_description(command: str) -> None:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    parser = sub.choices[command]  # type: ignore[attr-defined]
    assert parser.description and len(parser.description) > 60


def test_summary_json_carries_the_uncertainty_warning(tmp_path: Path) -> None:
    import json

    from exporter.evidence.merge import load_records
    from exporter.evidence.summarize import summarize

    records = write_records(tmp_path / "records")
    lines = [json.loads(x) for x in (records / "requests.jsonl").read_text().splitlines()]
    for r in lines:  # the proxy's loop lagged by more than the requests' TTFT
        r["timing_uncertainty_s"] = 5.0
    (records / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    summary = summarize(load_records(records), records_dirs=[records])
    assert any("timing uncertainty above 10%" in w for w in summary["warnings"])


def test_the_load_drivers_own_records_are_not_taken_for_the_proxys(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import json

    records = write_records(tmp_path / "records")
    client = tmp_path / "load" / "sglang"
    client.mkdir(parents=True)
    lines = [json.loads(x) for x in (records / "requests.jsonl").read_text().splitlines()]
    client_side = [{**{k: v for k, v in r.items() if k != "run_id"}, "intended_start_unix": r["start_unix"],
                    "schedule_lag_s": 0.0} for r in lines]  # as load --out writes them
    (client / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in client_side))
    for args in (["summarize", "--records", str(client)], ["compare", str(client), str(records), "--out",
                                                           str(tmp_path / "c")],
                 ["report", "--format", "html", "--records", str(client), "--out", str(tmp_path / "r")]):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert "the load driver's own records (client-side" in err and len(err.strip().splitlines()) == 1
