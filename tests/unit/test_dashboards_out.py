"""``llm-bench-exporter dashboards`` writes where it is told: under ``--out DIR`` (a bare ``--rules`` or
``--k8s`` too), the repository's tracked files only with ``--in-repo``; neither is one line, exit 2."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from dashboards.__main__ import main as dashboards_main
from dashboards.boards import GENERATED
from dashboards.rules import RULES_FILE


def _tracked() -> dict[Path, str]:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in [RULES_FILE, *sorted(GENERATED.glob("*.json"))]}


def test_no_out_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    before = _tracked()
    assert dashboards_main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out DIR" in err[0] and "--in-repo" in err[0]
    assert _tracked() == before


def test_a_bare_rules_and_k8s_go_under_out(tmp_path: Path) -> None:
    before = _tracked()
    out = tmp_path / "boards"
    assert dashboards_main(["--out", str(out), "--rules", "--k8s"]) == 0
    assert sorted(p.name for p in out.glob("*.json")) == sorted(p.name for p in GENERATED.glob("*.json"))
    assert (out / RULES_FILE.name).read_text() == RULES_FILE.read_text()
    assert any((out / "kubernetes").iterdir())
    assert _tracked() == before


def test_out_and_in_repo_exclude_each_other(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert dashboards_main(["--out", str(tmp_path), "--in-repo"]) == 2
    assert "exclude each other" in capsys.readouterr().err
