"""``--job NAME`` (issue 19 item 8): boards, rules and manifests for a Prometheus job other than the
mixin's, and the one-line refusal of a name no selector can hold."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from dashboards.__main__ import main as dashboards_main
from dashboards.catalogue import BOARDS, MIXIN, boards_for

from tests.helpers import require_prometheus

JOB = "myproxy"


def _selectors(text: str) -> list[str]:
    return re.findall(r'job=\\?"([^"\\]+)\\?"', text)


def test_dashboards_command_writes_boards_rules_and_manifests_for_the_job(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    assert dashboards_main(["--out", str(tmp_path / "boards"), "--rules", str(rules), "--k8s", str(tmp_path / "k8s"),
                            "--job", JOB]) == 0
    boards = {p.stem: p.read_text() for p in (tmp_path / "boards").glob("*.json")}
    assert set(boards) == set(BOARDS)
    engine_jobs = {MIXIN.vllm_job, MIXIN.sglang_job, f"{MIXIN.vllm_job}|{MIXIN.sglang_job}"}
    for name, text in boards.items():
        jobs = set(_selectors(text))
        assert MIXIN.job not in jobs, name
        if name != "gpu":
            assert JOB in jobs and jobs <= {JOB} | engine_jobs, (name, jobs)
    doc = yaml.safe_load(rules.read_text())
    exprs = [r["expr"] for g in doc["groups"] for r in g["rules"]]
    assert all(MIXIN.job not in e for e in exprs)
    assert all(f'job="{JOB}"' in r["expr"] for r in doc["groups"][0]["rules"])  # every recording rule
    assert {"LLMBenchEmptyTextResponses", "LLMBenchExporterDown"} <= {
        r["alert"] for r in doc["groups"][1]["rules"] if f'job="{JOB}"' in r["expr"]}
    service = yaml.safe_load((tmp_path / "k8s" / "servicemonitor.yaml").read_text().split("---")[-1])
    assert service["metadata"]["name"] == JOB  # the Service's name is the job label prometheus-operator gives
    proxy = (tmp_path / "k8s" / "proxy.yaml").read_text()
    assert f"name: {JOB}\n" in proxy and f"name: {MIXIN.job}" not in proxy
    assert f"llm-bench/job: {JOB}\n" in proxy and MIXIN.job not in proxy  # the scraped Service names the job too
    cm = yaml.safe_load((tmp_path / "k8s" / "grafana-dashboard-comparison.yaml").read_text().split("---")[-1])
    assert json.loads(next(iter(cm["data"].values()))) == json.loads(boards["comparison"])


@pytest.mark.slow  # promtool: a process of its own
def test_rules_for_another_job_pass_promtool(tmp_path: Path) -> None:
    require_prometheus()
    rules = tmp_path / "rules.yml"
    assert dashboards_main(["--out", str(tmp_path / "b"), "--rules", str(rules), "--job", JOB]) == 0
    r = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("bad", ['my"job', "a\\b", "", "x}"])
def test_a_job_name_no_selector_can_hold_is_refused_in_one_line(tmp_path: Path, bad: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert dashboards_main(["--out", str(tmp_path / "b"), "--job", bad]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--job" in err and "Traceback" not in err
    assert not (tmp_path / "b").exists()


def test_k8s_for_another_job_needs_its_own_rules_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert dashboards_main(["--out", str(tmp_path / "b"), "--k8s", str(tmp_path / "k"), "--job", JOB]) == 2
    assert "--rules" in capsys.readouterr().err and not (tmp_path / "k").exists()


def test_boards_for_the_default_job_are_the_catalogue() -> None:
    assert boards_for() is BOARDS and boards_for(MIXIN.job) is BOARDS
    other = boards_for(JOB)
    for name, board in BOARDS.items():
        for p, q in zip(board.panels, other[name].panels):
            for a, b in zip(p.queries, q.queries):
                assert b.expr == a.expr.replace(MIXIN.job_selector, f'job="{JOB}"')
