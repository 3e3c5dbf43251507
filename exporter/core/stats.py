"""Exact statistics over finished requests: percentiles, medians, round tables.

Shared by the load driver and ``evidence summarize`` so both report the same numbers.
Percentiles interpolate linearly between closest ranks (NumPy's default, "type 7").
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

__all__ = ["percentile", "median", "round_row", "median_of_rounds", "SloLike"]


class SloLike(Protocol):
    """An SLO as the config defines it (``exporter.proxy.config.Slo``): seconds."""

    @property
    def ttft_s(self) -> float: ...

    @property
    def tpot_s(self) -> float: ...


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0..100) of the values, or None when there are none."""
    xs = sorted(values)
    if not xs:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0..100")
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.median(xs) if xs else None


def round_row(records: Sequence[Mapping[str, Any]], duration_s: float | None = None, *,
              slo: SloLike) -> dict[str, Any]:
    """One round's table row from its request records (SPEC section 7).

    Throughput is success output tokens over the round's duration; failed requests stay
    in the denominator of the success rate and in the duration.  SLO attainment counts a
    failed request as a miss; TPOT attainment of a 1-token success counts as met.
    """
    ok = [r for r in records if r.get("outcome") == "success"]
    total = len(records)
    if duration_s is None:
        starts = [r["start_unix"] for r in records if r.get("start_unix") is not None]
        ends = [r["start_unix"] + (r.get("e2e_s") or 0.0) for r in records if r.get("start_unix") is not None]
        duration_s = (max(ends) - min(starts)) if starts else 0.0
    tokens = sum(r.get("completion_tokens") or 0 for r in ok)
    ttft = [r["ttft_s"] for r in ok if r.get("ttft_s") is not None]
    tpot = [r["tpot_s"] for r in ok if r.get("tpot_s") is not None]
    e2e = [r["e2e_s"] for r in ok if r.get("e2e_s") is not None]
    reasons: dict[str, int] = {}
    for r in records:
        if r.get("outcome") != "success":
            key = r.get("reason") or "unknown"
            reasons[key] = reasons.get(key, 0) + 1
    ttft_met = sum(1 for r in ok if r.get("ttft_s") is not None and r["ttft_s"] <= slo.ttft_s)
    tpot_met = sum(1 for r in ok if r.get("tpot_s") is None or r["tpot_s"] <= slo.tpot_s)
    both_met = sum(
        1 for r in ok
        if r.get("ttft_s") is not None and r["ttft_s"] <= slo.ttft_s
        and (r.get("tpot_s") is None or r["tpot_s"] <= slo.tpot_s)
    )
    return {
        "requests": total,
        "success": len(ok),
        "failures": total - len(ok),
        "failure_reasons": reasons,
        "duration_s": duration_s,
        "success_output_tokens": tokens,
        "output_throughput_tok_s": tokens / duration_s if duration_s > 0 else None,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p95_s": percentile(ttft, 95),
        "tpot_p50_s": percentile(tpot, 50),
        "tpot_p95_s": percentile(tpot, 95),
        "e2e_p95_s": percentile(e2e, 95),
        "slo_ttft_attainment": ttft_met / total if total else None,
        "slo_tpot_attainment": tpot_met / total if total else None,
        "slo_attainment": both_met / total if total else None,
    }


_MEDIAN_KEYS = (
    "duration_s", "output_throughput_tok_s", "ttft_p50_s", "ttft_p95_s", "tpot_p50_s",
    "tpot_p95_s", "e2e_p95_s", "slo_ttft_attainment", "slo_tpot_attainment", "slo_attainment",
)


def median_of_rounds(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Median of each figure over rounds; request and success counts add up (SPEC section 7)."""
    out: dict[str, Any] = {
        "rounds": len(rows),
        "rounds_passed": sum(1 for r in rows if r["failures"] == 0),
        "requests": sum(r["requests"] for r in rows),
        "success": sum(r["success"] for r in rows),
        "failures": sum(r["failures"] for r in rows),
    }
    for key in _MEDIAN_KEYS:
        out[key] = median(r.get(key) for r in rows)
    return out
