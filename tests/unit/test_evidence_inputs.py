"""A user's mistakes give one line naming the cause and exit status 2, never a traceback (issue 12)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pytest

from exporter.evidence.cli import build_parser
from exporter.evidence.cli import main as evidence_main

NOW = time.time()


def _setup(tmp: Path) -> dict[str, str]:
    (tmp / "full").mkdir()
    (tmp / "full" / "old.csv").write_text("earlier export")
    (tmp / "afile").write_text("x")
    (tmp / "rec").mkdir()
    (tmp / "rec" / "requests.jsonl").write_text(json.dumps({"engine": "vllm", "scenario": "s", "round": 1,
                                                            "start_unix": 1.0, "outcome": "success"}) + "\n")
    (tmp / "bad").mkdir()
    (tmp / "bad" / "requests.jsonl").write_text('{"engine": "vllm"}\n{not json\n')
    return {"T": str(tmp)}


CASES = [
    ("export-last-0m", ["export", "--window", "last:0m", "--out", "{T}/o"], "empty window"),
    ("export-future", ["export", "--window", f"{NOW + 3600:.0f},{NOW + 7200:.0f}", "--out", "{T}/o"],
     "starts in the future"),
    ("export-ends-future", ["export", "--window", f"{NOW - 60:.0f},{NOW + 3600:.0f}", "--out", "{T}/o"],
     "ends in the future"),
    ("export-out-not-empty", ["export", "--window", "last:5m", "--out", "{T}/full"], "is not empty"),
    ("export-out-under-file", ["export", "--window", "last:5m", "--out", "{T}/afile/sub"], "cannot create output directory"),
    ("export-out-is-file", ["export", "--window", "last:5m", "--out", "{T}/afile"], "is a file"),
    ("export-bad-header", ["export", "--window", "last:5m", "--out", "{T}/o", "--header", "no colon"], "--header wants NAME:VALUE"),
    ("export-header-control", ["export", "--window", "last:5m", "--out", "{T}/o", "--header", "X-A:b\x01c"], "control character"),
    ("export-step-zero", ["export", "--window", "last:5m", "--out", "{T}/o", "--step", "0"], "--step must be a positive"),
    ("export-step-nan", ["export", "--window", "last:5m", "--out", "{T}/o", "--step", "nan"], "--step must be a positive"),
    ("export-bad-window", ["export", "--window", "yesterday", "--out", "{T}/o"], "bad window"),
    ("export-unreachable", ["export", "--window", "last:5m", "--out", "{T}/o"], "cannot reach Prometheus"),
    ("summarize-out-under-file", ["summarize", "--records", "{T}/rec", "--out", "{T}/afile/x"], "cannot create output directory"),
    ("summarize-missing", ["summarize", "--records", "{T}/nowhere"], "no records at"),
    ("summarize-bad-line", ["summarize", "--records", "{T}/bad"], "requests.jsonl:2: not a JSON line"),
    ("compare-missing", ["compare", "{T}/nowhere", "{T}/rec", "--out", "{T}/c"], "no records at"),
    ("compare-out-under-file", ["compare", "{T}/rec", "{T}/rec", "--out", "{T}/afile/c"], "cannot create output directory"),
]


@pytest.mark.parametrize("argv, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_mistakes_give_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], unused_tcp_port: int,
                                      argv: list[str], message: str) -> None:
    values = _setup(tmp_path)
    args = [a.format(**values) for a in argv]
    if args[0] == "export":
        args += ["--prometheus", f"http://127.0.0.1:{unused_tcp_port}"]
    assert evidence_main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert err.startswith("evidence: ") and err.count("\n") == 1
    assert (tmp_path / "full" / "old.csv").exists()  # a refused export touches nothing


def _options(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.Action]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += [(f"{name} {a.option_strings[0]}", a) for a in sub._actions
                        if a.option_strings and a.dest != "help"]
    return out


def test_every_option_has_help_with_its_default() -> None:
    options = _options(build_parser())
    assert len(options) > 12
    for name, action in options:
        assert action.help, f"{name} has no help"
        assert action.required or "default" in action.help, f"{name}: help does not say its default"
    step = dict(options)["export --step"]
    assert step.help and "seconds" in step.help
