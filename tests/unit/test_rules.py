"""Prometheus config, rules and every board query, against promtool and a real Prometheus."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from dashboards.boards import GENERATED, build_all, render_json
from dashboards.catalogue import BOARDS, PANELS, expand
from dashboards.rules import RULES_FILE, render_rules
from exporter.harness.stack import render_prometheus_config

from tests.helpers import require_prometheus

ROOT = Path(__file__).resolve().parents[2]


PROM = ROOT / "prometheus"


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_generated_rules_are_fresh() -> None:
    assert RULES_FILE.read_text() == render_rules(), "run: python -m dashboards --rules"


@pytest.mark.slow  # promtool: a process of its own
def test_promtool_check_config_and_rules(tmp_path: Path) -> None:
    require_prometheus()
    r = _run("promtool", "check", "rules", str(RULES_FILE))
    assert r.returncode == 0, r.stdout + r.stderr
    r = _run("promtool", "check", "config", str(PROM / "prometheus.yml"))
    assert r.returncode == 0, r.stdout + r.stderr
    rendered = render_prometheus_config({"llmbench-exporter": ["127.0.0.1:1"], "vllm": ["127.0.0.1:2"]}, tmp_path)
    r = _run("promtool", "check", "config", str(rendered))
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow  # promtool: a process of its own
def test_promtool_rule_unit_tests() -> None:
    require_prometheus()
    r = _run("promtool", "test", "rules", str(PROM / "tests" / "llmbench.test.yml"))
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_rule_tests_cover_every_rule() -> None:
    rules = yaml.safe_load(RULES_FILE.read_text())["groups"]
    records = {r["record"] for g in rules for r in g["rules"] if "record" in r}
    alerts = {r["alert"]: r for g in rules for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load((PROM / "tests" / "llmbench.test.yml").read_text())["tests"]
    tested_exprs = {t["expr"] for case in tests for t in case.get("promql_expr_test", [])}
    assert records <= tested_exprs, records - tested_exprs
    firing = {t["alertname"] for c in tests for t in c.get("alert_rule_test", []) if t["exp_alerts"]}
    silent = {t["alertname"] for c in tests for t in c.get("alert_rule_test", []) if not t["exp_alerts"]}
    assert set(alerts) == firing == silent
    for name, rule in alerts.items():
        assert name[0].isupper() and "_" not in name
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    for name in records:
        level, metric, ops = name.split(":")
        assert level and metric.startswith("llmbench_") and ops


def test_recording_rules_come_from_the_catalogue() -> None:
    rules = {r["record"]: r["expr"] for g in yaml.safe_load(RULES_FILE.read_text())["groups"]
             for r in g["rules"] if "record" in r}
    for panel in PANELS.values():
        if panel.rule:
            assert rules[panel.rule] == expand(panel.queries[0].expr)


def test_generated_dashboards_are_fresh() -> None:
    for name, data in build_all().items():
        path = GENERATED / f"{name}.json"
        assert path.read_text() == render_json(data), "run: python -m dashboards"
    assert {p.stem for p in GENERATED.glob("*.json")} == set(BOARDS)
