"""Noise beside medians, and the one rule that calls a difference real or within noise.

Used by ``evidence summarize`` (engines side by side) and ``evidence compare`` (run A vs B).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .experiment import same_load

__all__ = ["METRICS", "Metric", "RULE", "ONE_ROUND", "LOADS_DIFFER", "verdict", "judged_verdict", "fmt_noise", "fmt_delta", "delta_pct", "human",
           "unit_of"]

#: The verdict where either side has fewer than two rounds: no spread, so no noise to judge by.
ONE_ROUND = "one round: no noise estimate"
#: The verdict where the two sides ran different loads (see :func:`judged_verdict`).
LOADS_DIFFER = "not judged: loads differ"
RULE = ("A difference is *within noise* when it is no larger than the wider of the two runs' round "
        "spreads (max − min of the figure over rounds), or when the two bootstrap 95% intervals of the "
        "median overlap; otherwise B is *better* or *worse* than A in the metric's direction "
        "(higher is better for success, throughput and goodput; lower for latencies). With fewer than "
        f"two rounds on either side there is no noise estimate, and the verdict says \"{ONE_ROUND}\". When "
        "the two sides ran different loads (load verdicts differ, open-loop offered rates more than 10% "
        "apart, or the requests' mean prompt or output tokens more than 10% apart) no difference is judged: "
        f"\"{LOADS_DIFFER}\", and the reason beside it.")


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
    ``rounds``, ``spread`` and ``ci95``), by :data:`RULE`; :data:`ONE_ROUND` when either has fewer
    than two rounds; None when either value is missing."""
    va, vb = a.get(metric.key), b.get(metric.key)
    if va is None or vb is None:
        return None
    if min(int(a.get("rounds") or 0), int(b.get("rounds") or 0)) < 2:
        return ONE_ROUND
    spread_a = (a.get("spread") or {}).get(metric.key)
    spread_b = (b.get("spread") or {}).get(metric.key)
    ci_a, ci_b = (a.get("ci95") or {}).get(metric.key), (b.get("ci95") or {}).get(metric.key)
    diff = vb - va
    width = max(_width(spread_a), _width(spread_b))
    # a tie within float error is a tie: ratios built from counts (k/n) meet their spreads exactly
    if abs(diff) <= width or math.isclose(abs(diff), width, rel_tol=1e-9) or _overlap(ci_a, ci_b):
        return "within noise"
    return "better" if (diff > 0) == metric.higher_is_better else "worse"


def judged_verdict(a: Mapping[str, Any], b: Mapping[str, Any], metric: Metric) -> tuple[str | None, str | None]:
    """(verdict, why): :func:`verdict`, unless the two sides' loads differ (their ``load_verdict``
    or, for open loops, ``offered_rate_rps`` more than 10% apart): then :data:`LOADS_DIFFER` and
    why, since a faster or slower figure under another load says nothing of the engine."""
    if a.get(metric.key) is None or b.get(metric.key) is None:
        return None, None
    why = same_load(a, b)
    return (LOADS_DIFFER, why) if why else (verdict(a, b, metric), None)


def delta_pct(va: float | None, vb: float | None) -> float | None:
    """(B − A) / A in per cent; None when A is zero or a value is missing."""
    if va is None or vb is None or va == 0:
        return None
    return (vb - va) / abs(va) * 100.0


def fmt_delta(row: Mapping[str, Any], key: str = "delta_pct") -> str:
    """A signed per-cent delta for tables: ``+4.2 %``."""
    v = row.get(key)
    return "-" if v is None else f"{v:+.1f} %"


def unit_of(key: str) -> str:
    """The unit a human table shows a figure in: ms for seconds, % for ratios and shares."""
    if key.endswith("_s") and not key.endswith("_tok_s"):
        return "ms"
    if key.endswith(("_ratio", "_share", "_attainment")):
        return "%"
    if key.endswith("_tok_s"):
        return "tok/s"
    if key.endswith("_rps"):
        return "req/s"
    return ""


def human(key: str, v: Any) -> str:
    """A figure for a human table, in :func:`unit_of` its key (JSON and CSV keep base units)."""
    if v is None:
        return "-"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    unit = unit_of(key)
    x = v * 1000 if unit == "ms" else v * 100 if unit == "%" else v
    if unit == "%" or (unit == "ms" and 10 <= abs(x) < 100):
        return f"{x:.1f}"
    if unit == "ms":
        return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"
    return f"{x:.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def fmt_noise(median: Mapping[str, Any], key: str) -> str:
    """``value [min–max] (CI lo–hi)``: the median of rounds with its noise, in human units; a
    spread or an interval whose ends print the same is left out (it is no interval)."""
    v = median.get(key)
    if v is None:
        return "-"
    text = human(key, v)
    spread = (median.get("spread") or {}).get(key)
    if spread and median.get("rounds", 0) > 1 and human(key, spread[0]) != human(key, spread[1]):
        text += f" [{human(key, spread[0])}–{human(key, spread[1])}]"
    ci = (median.get("ci95") or {}).get(key)
    if ci and human(key, ci[0]) != human(key, ci[1]):
        text += f" (CI {human(key, ci[0])}–{human(key, ci[1])})"
    return text
