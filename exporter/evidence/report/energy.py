"""Energy per output token per round (J/token), for the boards section, each round from its first
request's arrival to its last one's end, every GPU Prometheus scraped (the engines ran one after
the other on the same host):

1. where the GPUs' energy counter is scraped (``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``, mJ): its
   increase over the round, summed over the GPUs (read at the round's start and end: each the last
   scrape before, so each end may be off by a scrape interval's energy);
2. else from power (``DCGM_FI_DEV_POWER_USAGE``, W, the GPU board's query) where every GPU has at
   least :data:`MIN_POWER_SAMPLES` samples at the scrape interval inside the round: the sum over
   the GPUs of each one's mean power, times the round's duration;
3. else withheld, with the reason.

Divided by the round's output tokens of successful requests (``evidence summarize``'s
``success_output_tokens``).  GPUs whose model says ``(simulated)`` (the proxy's ``gpu: sim:N``)
are labelled so: their watts are a model of load, not a measurement.  Every query is the
catalogue's (``GPU_ENERGY_MJ``, ``GPU_MODELS``, the ``gpu_power`` panel's).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dashboards.catalogue import GPU_ENERGY_MJ, GPU_MODELS, PANELS, expand

from ..runs import group_rounds
from .doc import Para, Table
from .model import Report

__all__ = ["RoundEnergy", "round_energy", "energy_block", "MIN_POWER_SAMPLES", "SIMULATED"]

#: fewest power samples per GPU inside a round for an energy from power
MIN_POWER_SAMPLES = 5
#: what a simulated GPU's model name holds
SIMULATED = "(simulated)"


@dataclass(frozen=True)
class RoundEnergy:
    """One round's energy: ``joules`` None where withheld; ``source`` says how (or why not)."""

    engine: str
    scenario: str
    round: str
    tokens: int
    joules: float | None
    source: str
    gpus: int
    simulated: bool

    @property
    def per_token(self) -> float | None:
        return self.joules / self.tokens if self.joules is not None and self.tokens > 0 else None


def _by_gpu(result: Sequence[Mapping[str, Any]]) -> list[list[float]]:
    out = []
    for series in result:
        xs = [float(v) for _, v in series.get("values") or []]
        out.append([x for x in xs if not math.isnan(x)])
    return [xs for xs in out if xs]


def _from_counter(prom: Any, start: float, end: float) -> tuple[float, int] | None:
    """(joules, GPUs) from the energy counter's increase, or None where it is not scraped (or reset)."""
    gpus = _by_gpu(prom.query_range(expand(GPU_ENERGY_MJ), start, end, max(end - start, 1.0)))
    rises = [xs[-1] - xs[0] for xs in gpus if len(xs) >= 2]
    if not rises or len(rises) < len(gpus) or min(rises) <= 0:  # none, a reset, or no scrape inside the round
        return None
    return sum(rises) / 1000.0, len(rises)


def _from_power(prom: Any, start: float, end: float, scrape_s: float) -> tuple[float | None, int, str]:
    gpus = _by_gpu(prom.query_range(expand(PANELS["gpu_power"].queries[0].expr), start, end, scrape_s))
    if not gpus:
        return None, 0, "withheld: no GPU energy or power scraped"
    fewest = min(len(xs) for xs in gpus)
    if fewest < MIN_POWER_SAMPLES:
        return None, len(gpus), (f"withheld: {fewest} power sample{'' if fewest == 1 else 's'} in its "
                                 f"{end - start:.1f} s, fewer than {MIN_POWER_SAMPLES} (scrape interval {scrape_s:g} s)")
    watts = sum(sum(xs) / len(xs) for xs in gpus)
    return watts * (end - start), len(gpus), f"power ({fewest}+ samples a GPU)"


def round_energy(prom: Any, engine: str, scenario: str, rnd: str, tokens: int, start: float, end: float,
                 scrape_s: float) -> RoundEnergy:
    models = [s["metric"].get("modelName", "") for s in prom.query(expand(GPU_MODELS), end)]
    simulated = any(SIMULATED in m for m in models)
    counter = _from_counter(prom, start, end)
    if counter is not None:
        return RoundEnergy(engine, scenario, rnd, tokens, counter[0], "energy counter", counter[1], simulated)
    joules, gpus, source = _from_power(prom, start, end, scrape_s)
    return RoundEnergy(engine, scenario, rnd, tokens, joules, source, gpus, simulated)


def _spans(records: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str, str], tuple[float, float]]:
    """(engine, scenario, round) -> its records' first arrival and last end."""
    out = {}
    for (_, engine, scenario, rnd), recs in group_rounds(records).items():
        starts = [float(r["start_unix"]) for r in recs]
        ends = [float(r["start_unix"]) + float(r.get("e2e_s") or 0.0) for r in recs]
        out[(engine, scenario, str(rnd))] = (min(starts), max(ends))
    return out


def _scrape_s(prom: Any) -> float:
    intervals = prom.scrape_intervals()
    return min(intervals.values()) if intervals else 15.0


def energy_block(report: Report, records: Sequence[Mapping[str, Any]], prom: Any) -> list[Table | Para]:
    """The boards section's energy table (and a sentence on what it is), every counted round."""
    spans, scrape_s, rows = _spans(records), _scrape_s(prom), []
    for r in report.summary.get("rounds") or []:
        span = spans.get((r["engine"], r["scenario"], str(r["round"])))
        if span is None or r["scenario"] in report.calibration:
            continue
        rows.append(round_energy(prom, r["engine"], r["scenario"], str(r["round"]), int(r["success_output_tokens"]),
                                 *span, scrape_s))
    if not rows:
        return [Para("Energy per output token: no round to measure.")]
    table = Table(("engine", "scenario#round", "output tokens", "GPUs", "energy (J)", "J/token", "from"), tuple(
        (e.engine, f"{e.scenario}#{e.round}", str(e.tokens), f"{e.gpus}" + (" simulated" if e.simulated else ""),
         "-" if e.joules is None else f"{e.joules:.1f}", "-" if e.per_token is None else f"{e.per_token:.3g}",
         e.source) for e in rows), merge=(0,), caption=(
        "Energy per output token per round: every GPU scraped, over the round (first request's arrival to last "
        "one's end), over its successful requests' output tokens; from the energy counter's increase where scraped "
        f"(each end read at the last scrape before it), else from power with at least {MIN_POWER_SAMPLES} samples a "
        "GPU in the round (the sum of each GPU's mean power × the round's duration), else withheld."
        + (" Simulated GPUs (the proxy's gpu: sim:N) draw a model of the load, not a measurement: their joules "
           "are no energy figure." if any(e.simulated for e in rows) else "")))
    return [Para("Energy per output token, per round:"), table]
