"""Exact statistics over finished requests: percentiles, medians, round tables, noise.

Shared by the load driver and ``evidence summarize`` so both report the same numbers.
Percentiles interpolate linearly between closest ranks (NumPy's default, "type 7").

Noise beside each median of rounds (:func:`median_of_rounds`):

* ``spread``: the rounds' own min and max of each figure;
* ``ci95``: a bootstrap 95% interval of the median of rounds, when the rounds' records are
  given and there are at least :data:`MIN_BOOTSTRAP_REQUESTS` requests: the requests of
  each round are resampled with replacement (the round's duration kept), each round's
  figure recomputed, and the median over rounds taken, :data:`BOOTSTRAP_RESAMPLES` times
  with a fixed seed (so a table is reproducible); the interval is the 2.5th to 97.5th
  percentile of those medians.  An interval of zero width (resampling cannot move the figure,
  e.g. fixed-length outputs without failures) is None: it is no interval.

Judging: by default every record is judged by the ``slo`` given; with ``own_slo=True`` a record
that carries its own ``slo`` (``{"ttft_s", "tpot_s"}``, as the proxy writes it) is judged by that.
"""

from __future__ import annotations

import math
import random
import statistics
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from itertools import accumulate
from typing import Any, Protocol

from .slo import slo_result

__all__ = ["percentile", "sorted_percentile", "weighted_percentile", "median", "round_row", "median_of_rounds",
           "nonzero_interval", "SloLike", "MEDIAN_KEYS", "BOOTSTRAP_RESAMPLES", "MIN_BOOTSTRAP_REQUESTS"]

#: Resamples per bootstrap interval, and the fewest requests (all rounds) that get one.
BOOTSTRAP_RESAMPLES = 400
MIN_BOOTSTRAP_REQUESTS = 30
_SEED = 20261130


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


def sorted_percentile(values: Sequence[float], q: float, cum: Sequence[int] | None = None) -> float | None:
    """:func:`percentile` of ``values`` sorted ascending, each repeated as often as ``cum`` says
    (``cum[i]``: how many repeats the values up to ``values[i]`` make; None: once each), without
    building that list: the two closest ranks are found by bisection."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0..100")
    total = len(values) if cum is None else (cum[-1] if cum else 0)
    if total == 0:
        return None
    pos = (total - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    if cum is None:
        x_lo, x_hi = values[lo], values[hi]
    else:
        x_lo, x_hi = values[bisect_right(cum, lo)], values[bisect_right(cum, hi)]
    return x_lo + (x_hi - x_lo) * (pos - lo)


def weighted_percentile(pairs: Iterable[tuple[float, int]], q: float) -> float | None:
    """:func:`percentile` of the values each repeated its weight (a non-negative integer) times."""
    ordered = sorted(p for p in pairs if p[1] > 0)
    return sorted_percentile([v for v, _ in ordered], q, list(accumulate(w for _, w in ordered)))


def median(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.median(xs) if xs else None


def _duration(records: Sequence[Mapping[str, Any]]) -> float:
    starts = [r["start_unix"] for r in records if r.get("start_unix") is not None]
    ends = [r["start_unix"] + (r.get("e2e_s") or 0.0) for r in records if r.get("start_unix") is not None]
    return (max(ends) - min(starts)) if starts else 0.0


def _reasons(records: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    reasons: dict[str, int] = {}
    for r in records:
        if r.get("outcome") != "success":
            key = r.get("reason") or "unknown"
            reasons[key] = reasons.get(key, 0) + 1
    return reasons


def _thresholds(record: Mapping[str, Any], slo: SloLike, own_slo: bool) -> tuple[float, float]:
    """(TTFT, TPOT) thresholds that judge a record: its own ``slo`` when asked and present."""
    own = record.get("slo") if own_slo else None
    if isinstance(own, Mapping) and own.get("ttft_s") is not None and own.get("tpot_s") is not None:
        return float(own["ttft_s"]), float(own["tpot_s"])
    return slo.ttft_s, slo.tpot_s


def _slo_figures(records: Sequence[Mapping[str, Any]], ok: Sequence[Mapping[str, Any]],
                 duration_s: float, slo: SloLike, own_slo: bool = False) -> dict[str, Any]:
    """SLO attainment and goodput: met / judged, judged = all but client_abort."""
    total = len(records)
    results = [slo_result(r.get("ttft_s"), r.get("tpot_s"), *_thresholds(r, slo, own_slo)) for r in ok]
    ttft_met = sum(1 for x in results if x in ("met", "tpot_missed"))
    tpot_met = sum(1 for x in results if x in ("met", "ttft_missed"))
    met = [r for r, x in zip(ok, results) if x == "met"]
    judged = sum(1 for r in records if r.get("outcome") != "client_abort")
    goodput_tokens = sum(r.get("completion_tokens") or 0 for r in met)
    return {
        "slo_ttft_attainment": ttft_met / total if total else None,
        "slo_tpot_attainment": tpot_met / total if total else None,
        "slo_attainment": len(met) / total if total else None,
        "judged": judged,
        "slo_met": len(met),
        "goodput_ratio": len(met) / judged if judged else None,
        "goodput_output_tokens": goodput_tokens,
        "goodput_tok_s": goodput_tokens / duration_s if duration_s > 0 else None,
    }


def round_row(records: Sequence[Mapping[str, Any]], duration_s: float | None = None, *,
              slo: SloLike, own_slo: bool = False) -> dict[str, Any]:
    """One round's table row from its request records.

    Throughput is success output tokens over the round's duration; failed requests stay
    in the denominator of the success rate and in the duration.  SLO attainment counts a
    failed request as a miss; TPOT attainment of a 1-token success counts as met.  Goodput
    ratio = requests that met the SLO / judged requests (every outcome but client_abort).
    ``own_slo``: judge a record that carries its own ``slo`` by it (see the module doc).
    """
    ok = [r for r in records if r.get("outcome") == "success"]
    total = len(records)
    if duration_s is None:
        duration_s = _duration(records)
    tokens = sum(r.get("completion_tokens") or 0 for r in ok)
    ttft = [r["ttft_s"] for r in ok if r.get("ttft_s") is not None]
    tpot = [r["tpot_s"] for r in ok if r.get("tpot_s") is not None]
    e2e = [r["e2e_s"] for r in ok if r.get("e2e_s") is not None]
    return {
        "requests": total,
        "success": len(ok),
        "failures": total - len(ok),
        "failure_reasons": _reasons(records),
        "success_ratio": len(ok) / total if total else None,
        "duration_s": duration_s,
        "success_output_tokens": tokens,
        "output_throughput_tok_s": tokens / duration_s if duration_s > 0 else None,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p95_s": percentile(ttft, 95),
        "tpot_p50_s": percentile(tpot, 50),
        "tpot_p95_s": percentile(tpot, 95),
        "e2e_p95_s": percentile(e2e, 95),
        **_slo_figures(records, ok, duration_s, slo, own_slo),
    }


#: The figures whose median over rounds the tables show (with spread and ci95 beside each).
MEDIAN_KEYS = (
    "duration_s", "success_ratio", "output_throughput_tok_s", "ttft_p50_s", "ttft_p95_s", "tpot_p50_s",
    "tpot_p95_s", "e2e_p95_s", "slo_ttft_attainment", "slo_tpot_attainment", "slo_attainment",
    "goodput_ratio", "goodput_tok_s",
)
_NO_CI = ("duration_s",)  # fixed per round: resampling requests does not move it


def _spread(rows: Sequence[Mapping[str, Any]], key: str) -> list[float] | None:
    xs = [r[key] for r in rows if r.get(key) is not None]
    return [min(xs), max(xs)] if xs else None


def _bootstrap(rows: Sequence[Mapping[str, Any]], rounds_records: Sequence[Sequence[Mapping[str, Any]]],
               slo: SloLike, own_slo: bool = False) -> dict[str, list[float] | None]:
    """Bootstrap 95% interval of the median over rounds of each key (see the module doc)."""
    rng = random.Random(_SEED)
    keys = [k for k in MEDIAN_KEYS if k not in _NO_CI]
    medians: dict[str, list[float]] = {k: [] for k in keys}
    for _ in range(BOOTSTRAP_RESAMPLES):
        resampled = [round_row(rng.choices(recs, k=len(recs)), row["duration_s"], slo=slo, own_slo=own_slo)
                     for row, recs in zip(rows, rounds_records) if recs]
        for k in keys:
            m = median(r.get(k) for r in resampled)
            if m is not None:
                medians[k].append(m)
    out: dict[str, list[float] | None] = {k: None for k in MEDIAN_KEYS}
    for k, ms in medians.items():
        if len(ms) >= BOOTSTRAP_RESAMPLES // 2:
            lo, hi = percentile(ms, 2.5), percentile(ms, 97.5)
            out[k] = nonzero_interval(lo, hi)
    return out


def nonzero_interval(lo: float | None, hi: float | None) -> list[float] | None:
    """``[lo, hi]``, or None when a bound is missing or the interval has zero width (no interval)."""
    if lo is None or hi is None or not hi > lo:
        return None
    return [lo, hi]


def median_of_rounds(rows: Sequence[Mapping[str, Any]],
                     rounds_records: Sequence[Sequence[Mapping[str, Any]]] | None = None, *,
                     slo: SloLike | None = None, own_slo: bool = False) -> dict[str, Any]:
    """Median of each figure over rounds; request and success counts add up.

    Beside the medians: ``spread`` {key: [min, max] over rounds} and ``ci95`` {key: [lo, hi]
    or None}; the interval needs ``rounds_records`` (each row's records, in order), ``slo``
    and at least :data:`MIN_BOOTSTRAP_REQUESTS` requests in all; ``own_slo`` as for :func:`round_row`.
    """
    out: dict[str, Any] = {
        "rounds": len(rows),
        "rounds_passed": sum(1 for r in rows if r["failures"] == 0),
        "requests": sum(r["requests"] for r in rows),
        "success": sum(r["success"] for r in rows),
        "failures": sum(r["failures"] for r in rows),
        "judged": sum(r.get("judged", r["requests"]) for r in rows),
        "slo_met": sum(r.get("slo_met", 0) for r in rows),
    }
    for key in MEDIAN_KEYS:
        out[key] = median(r.get(key) for r in rows)
    out["spread"] = {key: _spread(rows, key) for key in MEDIAN_KEYS}
    enough = rounds_records is not None and slo is not None and len(rounds_records) == len(rows) \
        and sum(len(x) for x in rounds_records) >= MIN_BOOTSTRAP_REQUESTS
    if enough and rounds_records is not None and slo is not None:
        out["ci95"] = _bootstrap(rows, rounds_records, slo, own_slo)
    else:
        out["ci95"] = {key: None for key in MEDIAN_KEYS}
    return out
