"""Judging one successful request against an SLO: the one definition.

The proxy's counters, the round tables and the evidence all use :func:`slo_result`.
A value equal to its threshold meets it; a request with no TPOT (completion_tokens <= 1)
meets the TPOT part.  Only successful requests are judged here: a failure is neither met
nor missed, it counts against goodput through the judged-requests denominator.
"""

from __future__ import annotations

__all__ = ["SLO_RESULTS", "slo_result"]

#: The values of the ``result`` label of ``llmbench_slo_requests_total``.
SLO_RESULTS: tuple[str, ...] = ("met", "ttft_missed", "tpot_missed", "both_missed")


def slo_result(ttft_s: float | None, tpot_s: float | None, ttft_slo_s: float, tpot_slo_s: float) -> str:
    """``met``, ``ttft_missed``, ``tpot_missed`` or ``both_missed`` for a successful request."""
    ttft_ok = ttft_s is not None and ttft_s <= ttft_slo_s
    tpot_ok = tpot_s is None or tpot_s <= tpot_slo_s
    if ttft_ok:
        return "met" if tpot_ok else "tpot_missed"
    return "ttft_missed" if tpot_ok else "both_missed"
