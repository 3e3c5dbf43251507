"""Noise beside medians, and the one rule that calls a difference real or within noise.

Used by ``evidence summarize`` (engines side by side) and ``evidence compare`` (run A vs B).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["METRICS", "Metric", "RULE", "verdict", "fmt_noise", "fmt_delta", "delta_pct"]

RULE = ("A difference is *within noise* when it is no larger than the wider of the two runs' round "
        "spreads (max − min of the figure over rounds), or when the two bootstrap 95% intervals of the "
        "median overlap; otherwise B is *better* or *worse* than A in the metric's direction "
        "(higher is better for success, throughput and goodput; lower for latencies).")


@dataclass(frozen=True)
class Metric:
    key: str
    title: str
    unit: str
    higher_is_better: bool


#: The metrics compared between runs and engines.
METRICS: tuple[Metric, ...] = (
    Metric("success_ratio", "Success ratio", "", True),
    Metric("output_throughput_tok_s", "Successful output throughput", "tok/s", True),
    Metric("goodput_ratio", "Goodput ratio (SLO met / judged)", "", True),
    Metric("goodput_tok_s", "Goodput throughput", "tok/s", True),
    Metric("ttft_p95_s", "TTFT P95", "s", False),
    Metric("tpot_p95_s", "TPOT P95", "s", False),
    Metric("e2e_p95_s", "E2E P95", "s", False),
)


def _width(spread: Any) -> float:
    return float(spread[1] - spread[0]) if spread else 0.0


def _overlap(a: Any, b: Any) -> bool:
    return bool(a and b and a[0] <= b[1] and b[0] <= a[1])


def verdict(a: Mapping[str, Any], b: Mapping[str, Any], metric: Metric) -> str | None:
    """``better``, ``worse`` or ``within noise`` for B against A (medians of rounds with their
    ``spread`` and ``ci95``), by :data:`RULE`; None when either value is missing."""
    va, vb = a.get(metric.key), b.get(metric.key)
    if va is None or vb is None:
        return None
    spread_a = (a.get("spread") or {}).get(metric.key)
    spread_b = (b.get("spread") or {}).get(metric.key)
    ci_a, ci_b = (a.get("ci95") or {}).get(metric.key), (b.get("ci95") or {}).get(metric.key)
    diff = vb - va
    if abs(diff) <= max(_width(spread_a), _width(spread_b)) or _overlap(ci_a, ci_b):
        return "within noise"
    return "better" if (diff > 0) == metric.higher_is_better else "worse"


def delta_pct(va: float | None, vb: float | None) -> float | None:
    """(B − A) / A in per cent; None when A is zero or a value is missing."""
    if va is None or vb is None or va == 0:
        return None
    return (vb - va) / abs(va) * 100.0


def fmt_delta(row: Mapping[str, Any], key: str = "delta_pct") -> str:
    """A signed per-cent delta for tables: ``+4.2 %``."""
    v = row.get(key)
    return "-" if v is None else f"{v:+.1f} %"


def _num(v: float) -> str:
    return f"{v:.4g}"


def fmt_noise(median: Mapping[str, Any], key: str) -> str:
    """``value [min–max] ±95% lo–hi``: the median of rounds with its noise, for tables."""
    v = median.get(key)
    if v is None:
        return "-"
    text = _num(v)
    spread = (median.get("spread") or {}).get(key)
    if spread and median.get("rounds", 0) > 1 and spread[0] != spread[1]:
        text += f" [{_num(spread[0])}–{_num(spread[1])}]"
    ci = (median.get("ci95") or {}).get(key)
    if ci and ci[0] != ci[1]:
        text += f" (CI {_num(ci[0])}–{_num(ci[1])})"
    return text
