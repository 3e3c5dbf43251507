"""Prometheus recording and alert rules, generated from the panel catalogue.

Recording rules (``level:metric:operations``) are the catalogue's own queries with every
engine and scenario selected, so a board, a rule and a rule test can never disagree.
Alerts carry a severity, a summary and a description.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .catalogue import MIXIN, PANELS, SLO_TPOT_S, SLO_TTFT_S, Panel, expand
from .promql import retarget

E = MIXIN.engine_label

__all__ = ["RULES_FILE", "FAILURE_RATIO_MAX", "recording_rules", "alert_rules", "slo_alert_rules", "rules_document",
           "write_rules"]

RULES_FILE = Path(__file__).resolve().parent.parent / "prometheus" / "rules" / "llmbench.rules.yml"
FAILURE_RATIO_MAX = 0.05
#: the recorded P95 of the requests' timing uncertainty, per engine
_UNCERTAINTY_RULE = next(name for name, _ in PANELS["proxy_timing_error"].rules if name.startswith("engine:"))


def recording_rules() -> list[dict[str, Any]]:
    return [{"record": name, "expr": expand(expr)} for p in PANELS.values() for name, expr in p.rules]


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
        # The requests' timing error P95 per engine; or, with no request finishing, the loop's
        # own lag P99 per proxy (and worker).
        _alert(
            "LLMBenchProxyLagging",
            f"{_UNCERTAINTY_RULE} > {lag:g} or {PANELS['proxy_timing_error'].rule} > {lag:g}", for_="5m",
            summary="{{ if $labels.engine }}llm-bench-exporter timing error P95 of {{ $labels.engine }} requests "
                    f"above {lag * 1000:g} ms{{{{ else }}}}llm-bench-exporter event-loop lag P99 of "
                    f"{{{{ $labels.instance }}}} above {lag * 1000:g} ms{{{{ end }}}}",
            description="{{ if $labels.engine }}95% of the requests to {{ $labels.engine }} that finished in the "
                        "last minute had a timing uncertainty of up to {{ $value | humanizeDuration }} (the largest "
                        "event-loop lag while each was in flight), for 5 minutes: their timestamps can be off by "
                        "that much. Read timing_uncertainty_s in the records; give the proxy a core of its own, "
                        "fewer scrapes, or more workers.{{ else }}The event loop of {{ $labels.instance }} ran "
                        "ready callbacks up to {{ $value | humanizeDuration }} late (P99) for 5 minutes: requests "
                        "sent to it now are timed that coarsely. Give the proxy a core of its own, fewer scrapes, "
                        "or more workers.{{ end }}",
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


def rules_document(job: str | None = None) -> dict[str, Any]:
    """The rule groups; ``job``: the proxies' Prometheus job (default: the mixin's)."""
    doc: dict[str, Any] = retarget({"groups": [
        {"name": "llmbench.recording", "interval": "5s", "rules": recording_rules()},
        {"name": "llmbench.alerts", "rules": alert_rules() + slo_alert_rules()},
    ]}, job)
    return doc


HEADER = "# Generated by `python -m dashboards --rules` from dashboards/catalogue.py and dashboards/rules.py.\n" \
         "# Do not edit: change the catalogue and regenerate (a test fails when this file is stale).\n"


def render_rules(job: str | None = None) -> str:
    return HEADER + yaml.safe_dump(rules_document(job), sort_keys=False, width=200)


def write_rules(path: Path = RULES_FILE, job: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_rules(job), encoding="utf-8")
    return path
