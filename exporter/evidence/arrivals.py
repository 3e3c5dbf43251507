"""Statistics of a round's load from its request records: arrivals and requests in flight.

Pure functions over numbers (no records layout beyond ``start_unix`` and ``e2e_s``):

* :func:`exponential_fit`: the Anderson-Darling test of an exponential distribution whose rate is
  estimated from the same data (Stephens 1974: the statistic ``A² (1 + 0.6 / n)`` against the
  critical value 1.957 at the 1% level; ``scipy.stats.anderson(x, "expon")`` uses the same table).
* :func:`inflight_steps`: the number of requests in flight as a step function of time.
* :func:`closed_steady` and :func:`open_steady`: the steady window of a closed or an open loop.
* :func:`slot_lags`: how long after the completion that freed a slot each later request arrived,
  the mark of a closed loop whatever its clients' turnaround.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ExpFit", "exponential_fit", "cv", "inflight_steps", "Steps", "time_at", "plateau", "closed_steady",
           "open_steady", "near", "slot_lags", "peak", "BLIP_S", "AD_CRITICAL_1PCT", "MIN_FIT_GAPS", "TOLERANCE",
           "BIN_ARRIVALS", "POISSON_Z99"]

#: Stephens' critical value of the modified A² for an exponential with estimated rate, at 1%.
AD_CRITICAL_1PCT = 1.957
#: Fewest inter-arrival gaps the fit is tried on.
MIN_FIT_GAPS = 9
#: "within 10%" of the plateau (closed loop) or of the median arrival rate (open loop).
TOLERANCE = 0.10
#: Expected arrivals per bin of the open-loop rate (at least; at most 10 bins).
BIN_ARRIVALS = 20
#: Two-sided 99% normal quantile: a bin's Poisson counting noise allowance.
POISSON_Z99 = 2.576

#: (time, requests in flight from that time on), in time order.
Steps = list[tuple[float, int]]


@dataclass(frozen=True)
class ExpFit:
    n: int
    a2: float  # the modified statistic A² (1 + 0.6 / n)
    rejected: bool  # at the 1% level


def exponential_fit(gaps: Sequence[float]) -> ExpFit | None:
    """Anderson-Darling test that ``gaps`` are exponential (rate estimated); None with too few."""
    xs = sorted(max(0.0, g) for g in gaps)
    n = len(xs)
    mean = sum(xs) / n if n else 0.0
    if n < MIN_FIT_GAPS or mean <= 0:
        return None
    tiny = 1e-300
    cdf = [min(max(1.0 - math.exp(-x / mean), tiny), 1.0 - 1e-16) for x in xs]
    total = sum((2 * i + 1) * (math.log(cdf[i]) + math.log(1.0 - cdf[n - 1 - i])) for i in range(n))
    a2 = (-n - total / n) * (1.0 + 0.6 / n)
    return ExpFit(n, a2, a2 > AD_CRITICAL_1PCT)


def cv(gaps: Sequence[float]) -> float | None:
    """Coefficient of variation (sample standard deviation / mean); None below two gaps."""
    if len(gaps) < 2:
        return None
    mean = statistics.fmean(gaps)
    return statistics.stdev(gaps) / mean if mean > 0 else None


def inflight_steps(spans: Sequence[tuple[float, float]]) -> Steps:
    """Requests in flight over time from (start, end) pairs; at one instant ends count first."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda ev: (ev[0], ev[1]))
    steps: Steps = []
    level = 0
    for t, delta in events:
        level += delta
        if steps and steps[-1][0] == t:
            steps[-1] = (t, level)
        else:
            steps.append((t, level))
    return steps


def time_at(steps: Steps, lo: float = -math.inf, hi: float = math.inf) -> dict[int, float]:
    """Seconds spent at each in-flight level between ``lo`` and ``hi``."""
    out: dict[int, float] = {}
    for (t0, level), (t1, _) in zip(steps, steps[1:]):
        a, b = max(t0, lo), min(t1, hi)
        if b > a:
            out[level] = out.get(level, 0.0) + (b - a)
    return out


def plateau(steps: Steps) -> int:
    """The level held longest (ties: the higher), zero left out: a closed loop's concurrency."""
    held = {lvl: s for lvl, s in time_at(steps).items() if lvl > 0}
    return max(held, key=lambda lvl: (held[lvl], lvl)) if held else 0


#: A level held for less than this in all is a blip of the stamps' rounding, not a load (seconds).
BLIP_S = 0.001


def peak(steps: Steps) -> int:
    """The highest in-flight level held for :data:`BLIP_S` or more in all (0 for none): two stamps
    rounded apart can put a request's end a microsecond after the next one's arrival."""
    held = [lvl for lvl, s in time_at(steps).items() if s >= BLIP_S]
    return max(held, default=max((lvl for _, lvl in steps[:1]), default=0))


def near(level: int, target: float) -> bool:
    """Within 10% of ``target`` (exactly it below 10)."""
    return abs(level - target) <= TOLERANCE * target


def closed_steady(steps: Steps, level: int) -> tuple[float, float] | None:
    """From the first moment the in-flight count comes within 10% of ``level`` to the end of the
    last moment it is there: ramp-up before, drain after."""
    inside = [(t0, t1) for (t0, lvl), (t1, _) in zip(steps, steps[1:]) if near(lvl, level) and t1 > t0]
    return (inside[0][0], inside[-1][1]) if inside else None


def open_steady(arrivals: Sequence[float]) -> tuple[float, float] | None:
    """The span of the arrival-rate bins within 10% of the median bin rate, or within the bin's
    99% Poisson counting noise where that is wider; leading and trailing bins outside are the
    ramp-up and the drain.  Bins hold :data:`BIN_ARRIVALS` expected arrivals or more, at most 10;
    with fewer than two bins the whole span from the first to the last arrival."""
    xs = sorted(arrivals)
    if len(xs) < 2 or xs[-1] <= xs[0]:
        return None
    first, span = xs[0], xs[-1] - xs[0]
    bins = min(10, (len(xs) - 1) // BIN_ARRIVALS)
    if bins < 2:
        return first, xs[-1]
    width = span / bins
    counts = [0] * bins
    for x in xs:
        counts[min(bins - 1, int((x - first) / width))] += 1
    mid = statistics.median(counts)
    allowed = max(TOLERANCE * mid, POISSON_Z99 * math.sqrt(mid))
    steady = [i for i, c in enumerate(counts) if abs(c - mid) <= allowed]
    return first + steady[0] * width, first + (steady[-1] + 1) * width


def slot_lags(spans: Sequence[tuple[float, float]], level: int) -> list[float]:
    """For each arrival after the first ``level``, the seconds since the completion that freed its
    slot: the k-th completion (in time order) frees the slot of the (level + k)-th arrival.

    A closed loop of ``level`` clients sends each request when one of its earlier requests has
    ended, so these are its clients' turnaround (reading the end, sending the next): short against
    a request's E2E, whether the completions come one by one or all at once (a batch that ends
    together).  An open loop's arrivals do not wait for completions: its lags are as long as the
    time its in-flight count takes to climb back to its peak.  Never negative while the in-flight
    count stays at or below ``level``."""
    starts = sorted(s for s, _ in spans)
    ends = sorted(e for _, e in spans)
    return [starts[level + k] - ends[k] for k in range(max(0, len(starts) - level))]
