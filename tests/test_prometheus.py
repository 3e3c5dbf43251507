"""Prometheus config, rules and every board query, against promtool and a real Prometheus."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
import yaml

from dashboards.boards import GENERATED, build_all, render_json
from dashboards.catalogue import BOARDS, PANELS, expand
from dashboards.rules import RULES_FILE, render_rules
from exporter.stack import render_prometheus_config

from .prom import require_prometheus

ROOT = Path(__file__).resolve().parent.parent
PROM = ROOT / "prometheus"


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_generated_rules_are_fresh() -> None:
    assert RULES_FILE.read_text() == render_rules(), "run: python -m dashboards --rules"


def test_promtool_check_config_and_rules(tmp_path: Path) -> None:
    require_prometheus()
    r = _run("promtool", "check", "rules", str(RULES_FILE))
    assert r.returncode == 0, r.stdout + r.stderr
    r = _run("promtool", "check", "config", str(PROM / "prometheus.yml"))
    assert r.returncode == 0, r.stdout + r.stderr
    rendered = render_prometheus_config({"llmbench-exporter": ["127.0.0.1:1"], "vllm": ["127.0.0.1:2"]}, tmp_path)
    r = _run("promtool", "check", "config", str(rendered))
    assert r.returncode == 0, r.stdout + r.stderr


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


# -- against a real Prometheus fed by the real exporter ---------------------------------------

def _has_data(series: list[dict]) -> bool:
    return any(not math.isnan(float(v)) for s in series for _, v in s["values"])


@pytest.mark.parametrize("key", sorted(PANELS))
def test_every_board_query_returns_data(live_stack, key: str) -> None:
    panel = PANELS[key]
    for q in panel.queries:
        expr = expand(q.expr, range_s=live_stack.end - live_stack.start)
        series = live_stack.query_range(expr)
        assert _has_data(series), f"{key}: no data for {expr}"


def test_recording_rules_evaluate(live_stack) -> None:
    for panel in PANELS.values():
        if panel.rule:
            assert _has_data(live_stack.query_range(panel.rule)), panel.rule
    ratio = live_stack.query_range('engine:llmbench_requests:success_ratio_rate1m{engine="sglang"}')
    assert ratio and all(float(v) == 1.0 for _, v in ratio[0]["values"] if v != "NaN")


def test_empty_text_alert_fires(live_stack) -> None:
    alerts = live_stack.query('ALERTS{alertname="LLMBenchEmptyTextResponses", alertstate="firing"}')
    assert alerts and {a["metric"]["engine"] for a in alerts} == {"vllm"}
    assert not live_stack.query('ALERTS{alertname="LLMBenchExporterDown"}')


def test_prometheus_counts_agree_with_records(live_stack) -> None:
    records = [json.loads(x) for x in (live_stack.records / "requests.jsonl").read_text().splitlines()]
    total = live_stack.query("sum(llmbench_requests_total)")
    assert float(total[0]["value"][1]) == len(records)
    empty = live_stack.query("sum(llmbench_empty_text_responses_total)")
    assert float(empty[0]["value"][1]) == sum(r["reason"] == "empty_text" for r in records) > 0


def test_scenario_windows_are_exported(live_stack) -> None:
    series = live_stack.query_range("llmbench_scenario_info")
    got = {(s["metric"]["engine"], s["metric"]["scenario"], s["metric"]["round"]) for s in series}
    events = [json.loads(x) for x in (live_stack.records / "scenarios.jsonl").read_text().splitlines()]
    long_rounds = {(e["engines"][0], e["scenario"], str(e["round"])) for e, nxt in zip(events, events[1:])
                   if e["scenario"] and nxt["unix"] - e["unix"] >= 10}  # two scrape intervals or more
    assert {e for e, _, _ in long_rounds} == {"vllm", "sglang"}
    # a round shorter than a scrape interval can fall between scrapes; the long ones cannot
    assert long_rounds <= got
    assert {s for _, s, _ in got} <= {"short-c2", "short-c8", "warmup"}


# -- the generated dashboards -----------------------------------------------------------------

def test_generated_dashboards_are_fresh() -> None:
    for name, data in build_all().items():
        path = GENERATED / f"{name}.json"
        assert path.read_text() == render_json(data), "run: python -m dashboards"
    assert {p.stem for p in GENERATED.glob("*.json")} == set(BOARDS)
