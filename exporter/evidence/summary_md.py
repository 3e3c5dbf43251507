"""``summary.md`` of ``evidence summarize``: medians with their noise, engines side by side,
rounds, TTFT variants and the histogram check."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from exporter.core.stats import MIN_BOOTSTRAP_REQUESTS

from .noise import fmt_delta, fmt_noise

__all__ = ["summary_markdown", "md_table"]

_ROUND_COLS = ["engine", "scenario", "round", "success", "requests", "ttft_p50_s", "ttft_p95_s", "tpot_p50_s",
               "tpot_p95_s", "e2e_p95_s", "output_throughput_tok_s", "goodput_ratio", "goodput_tok_s",
               "slo_attainment", "failure_reasons"]
_MEDIAN_PLAIN = ["engine", "scenario", "rounds", "success", "requests"]
_MEDIAN_NOISY = ["ttft_p95_s", "tpot_p95_s", "e2e_p95_s", "output_throughput_tok_s", "goodput_ratio", "goodput_tok_s"]
_VARIANT_COLS = ["engine", "scenario", "success", "ttft_p50_s", "ttft_p95_s", "ttfb_p50_s", "ttfb_p95_s",
                 "ttfe_p50_s", "ttfe_p95_s"]


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k} {n}" for k, n in sorted(v.items())) or "-"
    return str(v)


def md_table(rows: list[dict[str, Any]], cols: list[str],
             fmt: Mapping[str, Callable[[Any, str], str]] | None = None) -> list[str]:
    fmt = fmt or {}
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt[c](r, c) if c in fmt else _cell(r.get(c)) for c in cols) + " |" for r in rows]
    return lines


def _medians(summary: dict[str, Any]) -> list[str]:
    slo = summary.get("slo") or {}
    lines = ["# Round tables", "",
             "Median of rounds per engine × scenario (success counts add up over rounds). Beside each median: "
             "[min–max over rounds] and, with at least "
             f"{MIN_BOOTSTRAP_REQUESTS} requests, (CI lo–hi): a bootstrap 95% interval of the median. "
             f"Goodput: requests that met the SLO (TTFT ≤ {slo.get('ttft_s', '?')} s, TPOT ≤ {slo.get('tpot_s', '?')} s) "
             "over judged requests (all but client aborts).", ""]
    fmt = {c: fmt_noise for c in _MEDIAN_NOISY}
    return lines + md_table(summary["medians"], _MEDIAN_PLAIN + _MEDIAN_NOISY, fmt)


def _compared(summary: dict[str, Any]) -> list[str]:
    rows = summary.get("engines_compared") or []
    if not rows:
        return []
    lines = ["", "Engines side by side (B against A, medians of rounds):", "", summary.get("noise_rule", ""), ""]
    return lines + md_table(rows, ["scenario", "metric", "a", "b", "value_a", "value_b", "delta_pct", "verdict"],
                           {"delta_pct": fmt_delta})


def _variants(summary: dict[str, Any]) -> list[str]:
    rows = summary.get("ttft_variants") or []
    if not rows:
        return []
    lines = ["", "TTFT variants of successful requests: ttft = first visible text, "
             "ttfb = first body byte, ttfe = first event with choices (what vLLM's bench client stamps):", ""]
    lines += md_table(rows, _VARIANT_COLS)
    if any(r.get("ttfb_n", 0) < r.get("success", 0) or r.get("ttfe_n", 0) < r.get("success", 0) for r in rows):
        lines += ["", "Some records carry no ttfb_s/ttfe_s (written by an older proxy): those variants count "
                      "only the records that have them, and show - where none do."]
    return lines


def summary_markdown(summary: dict[str, Any]) -> str:
    md = _medians(summary) + _compared(summary)
    md += ["", "Rounds:", ""] + md_table(summary["rounds"], _ROUND_COLS)
    md += _variants(summary)
    if summary.get("sources"):
        md += ["", "Records merged (the union of requests; same engine, scenario and round form one round):", ""]
        md += [f"- {note}" for note in summary["sources"]]
    if summary.get("histogram_vs_exact"):
        keys = ("ttft", "tpot", "e2e")
        cols = ["engine", "scenario"] + [f"{k}_p95_{x}" for k in keys for x in ("exact_s", "histogram_s", "rel_error")]
        md += ["", "Histogram-estimated P95 (Prometheus) beside the exact P95 of the same requests:", ""]
        md += md_table(summary["histogram_vs_exact"], cols)
    return "\n".join(md) + "\n"
