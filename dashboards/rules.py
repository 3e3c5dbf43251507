"""Prometheus recording and alert rules, generated from the panel catalogue.

Recording rules (``level:metric:operations``) are the catalogue's own queries with every
engine and scenario selected, so a board, a rule and a rule test can never disagree.
Alerts carry a severity, a summary and a description.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .catalogue import MIXIN, PANELS, SLO_TPOT_S, SLO_TTFT_S, Panel, rule_expr

E = MIXIN.engine_label

__all__ = ["RULES_FILE", "FAILURE_RATIO_MAX", "recording_rules", "alert_rules", "slo_alert_rules", "rules_document",
           "write_rules"]

RULES_FILE = Path(__file__).resolve().parent.parent / "prometheus" / "rules" / "llmbench.rules.yml"
FAILURE_RATIO_MAX = 0.05


def recording_rules() -> list[dict[str, Any]]:
    return [{"record": p.rule, "expr": rule_expr(p)} for p in PANELS.values() if p.rule]


def _alert(name: str, expr: str, *, summary: str, description: str, for_: str | None = None,
           severity: str = "warning") -> dict[str, Any]:
    rule: dict[str, Any] = {"alert": name, "expr": expr}
    if for_:
        rule["for"] = for_
    rule["labels"] = {"severity": severity}
    rule["annotations"] = {"summary": summary, "description": description}
    return rule


def _slo_breach(short: str, what: str, panel: Panel, threshold: float, slo: str) -> dict[str, Any]:
    return _alert(
        f"LLMBench{short}SLOBreach", f"{panel.rule} > {threshold:g}", for_="2m",
        summary="{{ $labels.engine }} " + f"{what} above the {slo} SLO",
        description=f"{short} P95 of " + "{{ $labels.engine }} is {{ $value | humanizeDuration }} "
                    f"(SLO {slo}) over 1-minute windows.",
    )


def slo_alert_rules() -> list[dict[str, Any]]:
    """Goodput under the SLO and the proxy's own timing error."""
    ratio, lag = MIXIN.goodput_ratio_min, MIXIN.proxy_lag_max_s
    return [
        _alert(
            "LLMBenchGoodputLow", f"{PANELS['goodput_ratio_1m'].rule} < {ratio:g}", for_="5m",
            summary="{{ $labels.engine }} goodput below " + f"{ratio:.0%}" + " of requests",
            description="Only {{ $value | humanizePercentage }} of {{ $labels.engine }} requests met the SLO "
                        "over the last minute, for 5 minutes (failures count against it); see "
                        "llmbench_slo_requests_total by result and llmbench_requests_total by reason.",
        ),
        _alert(
            "LLMBenchProxyLagging", f"{PANELS['proxy_timing_error'].rule} > {lag:g}", for_="5m",
            summary="llm-bench-exporter {{ $labels.instance }} event-loop lag P99 above " + f"{lag * 1000:g} ms",
            description="The event loop of proxy {{ $labels.instance }} {{ $labels.worker }} is late by "
                        "{{ $value | humanizeDuration }} (P99, 1-minute windows) for 5 minutes: its "
                        "timestamps can be off by that much. Read timing_uncertainty_s in the records; "
                        "give the proxy a core of its own, fewer scrapes, or more workers.",
        ),
    ]


def alert_rules() -> list[dict[str, Any]]:
    return [
        _alert(
            "LLMBenchEmptyTextResponses",
            f"sum by ({E}, scenario) (increase(llmbench_empty_text_responses_total{MIXIN.proxy()}[5m])) > 0",
            summary="{{ $labels.engine }} returned HTTP 200 streams with no visible text",
            description="{{ $value | humanize }} empty-text responses in 5 minutes from {{ $labels.engine }} "
                        "(scenario {{ $labels.scenario }}): HTTP 200, [DONE] and usage but zero visible text. "
                        "They are failures; look at the raw SSE captures in the records directory.",
        ),
        _alert(
            "LLMBenchFailureRatioHigh", f"1 - engine:llmbench_requests:success_ratio_rate1m > {FAILURE_RATIO_MAX}",
            for_="2m",
            summary="{{ $labels.engine }} fails more than " + f"{FAILURE_RATIO_MAX:.0%}" + " of requests",
            description="{{ $value | humanizePercentage }} of {{ $labels.engine }} requests failed over the "
                        "last minute; see llmbench_requests_total by reason.",
        ),
        _slo_breach("TTFT", "TTFT P95", PANELS["ttft_p95"], SLO_TTFT_S, f"{SLO_TTFT_S:g} s"),
        _slo_breach("TPOT", "per-request TPOT P95", PANELS["tpot_p95"], SLO_TPOT_S, f"{SLO_TPOT_S * 1000:g} ms"),
        _alert(
            "LLMBenchExporterDown", f"up{{{MIXIN.job_selector}}} == 0 or absent(up{{{MIXIN.job_selector}}})",
            for_="1m", severity="critical",
            summary="llm-bench-exporter is not being scraped",
            description="Prometheus cannot scrape the llm-bench-exporter proxy: benchmark traffic through it "
                        "fails and no request is measured.",
        ),
    ]


def rules_document() -> dict[str, Any]:
    return {"groups": [
        {"name": "llmbench.recording", "interval": "5s", "rules": recording_rules()},
        {"name": "llmbench.alerts", "rules": alert_rules() + slo_alert_rules()},
    ]}


HEADER = "# Generated by `python -m dashboards --rules` from dashboards/catalogue.py and dashboards/rules.py.\n" \
         "# Do not edit: change the catalogue and regenerate (a test fails when this file is stale).\n"


def render_rules() -> str:
    return HEADER + yaml.safe_dump(rules_document(), sort_keys=False, width=200)


def write_rules(path: Path = RULES_FILE) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_rules(), encoding="utf-8")
    return path
