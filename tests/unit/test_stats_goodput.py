"""Round tables: goodput (SPEC section 11) and the noise beside each median of rounds."""

from __future__ import annotations

import random
from typing import Any

import pytest

from exporter.core.stats import MEDIAN_KEYS, MIN_BOOTSTRAP_REQUESTS, median_of_rounds, round_row
from exporter.proxy.config import Slo

SLO = Slo(ttft_s=1.0, tpot_s=0.05)


def _rec(outcome: str = "success", ttft: float | None = 0.5, tpot: float | None = 0.01, tokens: int = 10,
         start: float = 0.0, e2e: float = 1.0) -> dict[str, Any]:
    return {"outcome": outcome, "ttft_s": ttft, "tpot_s": tpot, "completion_tokens": tokens, "start_unix": start,
            "e2e_s": e2e, "reason": None if outcome == "success" else "x"}


def test_goodput_counts_failures_against_it_and_leaves_client_aborts_out() -> None:
    records = [
        _rec(tokens=10),                       # met
        _rec(ttft=1.0, tpot=0.05, tokens=20),  # met: a value equal to its threshold meets it
        _rec(ttft=1.5, tokens=30),             # ttft missed
        _rec(tpot=0.06, tokens=40),            # tpot missed
        _rec(tpot=None, tokens=1),             # one token, no TPOT: meets the TPOT part -> met
        _rec("failure", None, None, 0),        # judged, not met
        _rec("client_abort", None, None, 0),   # not judged
    ]
    row = round_row(records, 10.0, slo=SLO)
    assert (row["judged"], row["slo_met"]) == (6, 3)
    assert row["goodput_ratio"] == pytest.approx(3 / 6)
    assert row["goodput_output_tokens"] == 31 and row["goodput_tok_s"] == pytest.approx(3.1)
    assert row["success_ratio"] == pytest.approx(5 / 7)
    assert row["slo_attainment"] == pytest.approx(3 / 7)  # the older figure keeps every request
    only_aborts = round_row([_rec("client_abort", None, None, 0)], 1.0, slo=SLO)
    assert only_aborts["judged"] == 0 and only_aborts["goodput_ratio"] is None


def _round(rng: random.Random, n: int, ttft_mean: float) -> list[dict[str, Any]]:
    return [_rec(ttft=rng.gauss(ttft_mean, 0.05), start=i * 0.1) for i in range(n)]


def test_median_of_rounds_has_spread_and_a_bootstrap_interval() -> None:
    rng = random.Random(4)
    rounds = [_round(rng, 20, m) for m in (0.50, 0.60, 0.55)]
    rows = [round_row(r, slo=SLO) for r in rounds]
    m = median_of_rounds(rows, rounds, slo=SLO)
    p95s = sorted(r["ttft_p95_s"] for r in rows)
    assert m["ttft_p95_s"] == pytest.approx(p95s[1])
    assert m["spread"]["ttft_p95_s"] == pytest.approx([p95s[0], p95s[2]])
    lo, hi = m["ci95"]["ttft_p95_s"]
    assert lo < m["ttft_p95_s"] < hi and hi - lo < 0.5
    assert set(m["spread"]) == set(m["ci95"]) == set(MEDIAN_KEYS)
    assert m["ci95"]["duration_s"] is None
    assert median_of_rounds(rows, rounds, slo=SLO) == m  # a fixed seed: the same table twice
    # without the records, or with too few requests, there is no interval
    assert all(v is None for v in median_of_rounds(rows)["ci95"].values())
    few = [r[: MIN_BOOTSTRAP_REQUESTS // 3 - 1] for r in rounds]
    assert median_of_rounds([round_row(r, slo=SLO) for r in few], few, slo=SLO)["ci95"]["ttft_p95_s"] is None


def test_bootstrap_interval_narrows_with_more_requests() -> None:
    rng = random.Random(9)
    small = [_round(rng, 12, 0.5) for _ in range(3)]
    large = [_round(rng, 120, 0.5) for _ in range(3)]
    width = []
    for rounds in (small, large):
        ci = median_of_rounds([round_row(r, slo=SLO) for r in rounds], rounds, slo=SLO)["ci95"]["ttft_p50_s"]
        width.append(ci[1] - ci[0])
    assert width[1] < width[0] / 2
