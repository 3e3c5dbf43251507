"""Every board query, recording rule and alert against a real Prometheus fed by the real exporter."""

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
from exporter.harness.stack import render_prometheus_config

from tests.helpers import require_prometheus

ROOT = Path(__file__).resolve().parents[2]


PROM = ROOT / "prometheus"


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


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
