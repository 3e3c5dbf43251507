"""Every board query, recording rule and alert against a real Prometheus fed by the real exporter."""

from __future__ import annotations

import json
import math
import re

import pytest

from dashboards.catalogue import PANELS, ROUND_ANNOTATIONS, expand

from tests.helpers import announcements


def _has_data(series: list[dict]) -> bool:
    return any(not math.isnan(float(v)) for s in series for _, v in s["values"])


#: Series the boards read that other parts of the proxy add (who adds them): until then, a panel
#: on them has no data, and the tests below say which metric is missing instead of "no data".
ADDED_BY = {
    "llmbench_slo_requests_total": "the SLO counters (issue 11 item 1, SPEC section 11)",
    "llmbench_goodput_tokens_total": "the SLO counters (issue 11 item 1, SPEC section 11)",
    "llmbench_proxy_event_loop_lag_seconds": "the loop-lag histogram (issue 9 item 2, SPEC section 10)",
    "llmbench_scenario_round_start_timestamp_seconds": "the round gauges (issue 11 item 5, SPEC section 16)",
    "llmbench_scenario_round_end_timestamp_seconds": "the round gauges (issue 11 item 5, SPEC section 16)",
}


def _require_exported(live_stack, what: str, expr: str) -> None:
    """Fail, naming the metric, when ``expr`` reads a proxy metric Prometheus never received."""
    names = set(re.findall(r"\b(llmbench_\w+?)(?:_bucket|_count|_sum)?\b[{\[]", expr))
    exported = {s["metric"]["__name__"] for s in live_stack.query('count by (__name__) ({__name__=~"llmbench_.+"})')}
    exported |= {re.sub(r"_(bucket|count|sum)$", "", n) for n in exported}
    missing = sorted(names - exported)
    if missing:
        pytest.fail(f"{what}: the proxy does not export {', '.join(missing)} yet, so this board query cannot "
                    f"return data ({'; '.join(sorted({ADDED_BY.get(m, 'unknown') for m in missing}))})")


@pytest.mark.parametrize("key", sorted(PANELS))
def test_every_board_query_returns_data(live_stack, key: str) -> None:
    panel = PANELS[key]
    for q in panel.queries:
        expr = expand(q.expr, range_s=live_stack.end - live_stack.start)
        _require_exported(live_stack, key, expr)
        series = live_stack.query_range(expr)
        assert _has_data(series), f"{key}: no data for {expr}"


def test_recording_rules_evaluate(live_stack) -> None:
    for panel in PANELS.values():
        if panel.rule:
            _require_exported(live_stack, panel.rule, expand(panel.queries[0].expr))
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


@pytest.mark.parametrize("name", [a.name for a in ROUND_ANNOTATIONS])
def test_round_annotations_mark_each_round(live_stack, name: str) -> None:
    """Each round of the load, on each engine, gets its start and end mark, at the proxy's time."""
    ann = next(a for a in ROUND_ANNOTATIONS if a.name == name)
    expr = expand(ann.expr)
    _require_exported(live_stack, name, expr)
    series = live_stack.query_range(expr)
    marks = {(s["metric"]["engine"], s["metric"]["scenario"], s["metric"]["round"]):
             {float(v) / 1000 for _, v in s["values"]} for s in series}
    events = announcements(live_stack.records / "scenarios.jsonl")
    rounds = {(e["engines"][0], e["scenario"], str(e["round"])) for e in events if e["scenario"]}
    assert rounds and rounds <= set(marks), rounds - set(marks)  # short rounds included
    for key in rounds:
        assert len(marks[key]) == 1, (key, marks[key])  # one mark per round, as Grafana groups it
        (t,) = marks[key]
        assert live_stack.start - 1 <= t <= live_stack.end, (key, t)


def test_scenario_windows_are_exported(live_stack) -> None:
    series = live_stack.query_range("llmbench_scenario_info")
    got = {(s["metric"]["engine"], s["metric"]["scenario"], s["metric"]["round"]) for s in series}
    events = announcements(live_stack.records / "scenarios.jsonl")
    long_rounds = {(e["engines"][0], e["scenario"], str(e["round"])) for e, nxt in zip(events, events[1:])
                   if e["scenario"] and nxt["unix"] - e["unix"] >= 10}  # two scrape intervals or more
    assert {e for e, _, _ in long_rounds} == {"vllm", "sglang"}
    # a round shorter than a scrape interval can fall between scrapes; the long ones cannot
    assert long_rounds <= got
    assert {s for _, s, _ in got} <= {"short-c2", "short-c8", "warmup"}
