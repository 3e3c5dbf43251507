"""Running a plan: stages of cells in order, the failed-rounds stop rule, and sweeps.

A stage stops after K consecutive rounds that contain a failed request
(``stop_after_failed_rounds``).  A sweep stage runs its levels lowest first and also stops at
the first level whose goodput ratio (requests that met the SLO over judged
requests, the median over the level's rounds) is below the sweep's ``goodput_target``.  Its
result names the highest level that met the SLO, with its goodput, and the failures of the
level that ended it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from exporter.core.slo import slo_result
from exporter.core.stats import SloLike, median, median_of_rounds, percentile, round_row
from exporter.proxy.config import DEFAULT_SLO

from .plan import WARMUP, Cell, Plan, Stage
from .tables import counted_prompts, prompt_counts

__all__ = ["run_plan", "first_error", "slo_breakdown", "schedule_figures", "SCHEDULE_KEYS"]

Record = dict[str, Any]

#: the load driver's own schedule, per round (seconds): lag = actual minus intended send time;
#: the E2E from the intended send time is open loop's only (None for a closed loop)
SCHEDULE_KEYS = ("schedule_lag_p50_s", "schedule_lag_p99_s", "e2e_from_intended_p95_s")


class Driver(Protocol):
    """What running a plan needs of a load driver (:class:`exporter.harness.load.Driver` is one)."""

    label: str
    base_url: str
    model: str | None

    async def announce(self, scenario: str | None, round_: int, cell: dict[str, Any] | None = None) -> None: ...

    async def run_round(self, cell: Cell, scenario: str, round_: int, n: int) -> tuple[list[Record], float]: ...

    def showing(self, label: str, planned: int, warmup: int = 0) -> AbstractAsyncContextManager[Any]: ...


def schedule_figures(records: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Schedule-lag P50/P99 over every request, and the P95 of successes' E2E counted from
    their intended send time (open loop)."""
    lags = [r["schedule_lag_s"] for r in records if r.get("schedule_lag_s") is not None]
    late = [r["e2e_from_intended_s"] for r in records
            if r.get("outcome") == "success" and r.get("e2e_from_intended_s") is not None]
    return {"schedule_lag_p50_s": percentile(lags, 50), "schedule_lag_p99_s": percentile(lags, 99),
            "e2e_from_intended_p95_s": percentile(late, 95)}


#: one name per figure, as in ``evidence summarize``: ``slo_attainment`` (met / all) is
#: ``goodput_ratio`` (met / judged) but for client aborts
DROPPED = ("slo_attainment",)


def _figures(records: Sequence[Record], duration: float, slo: SloLike) -> dict[str, Any]:
    row = {**round_row(records, duration, slo=slo), **schedule_figures(records),
           "prompt_tokens_p50": median(prompt_counts(records))}
    proxy: dict[str, int] = {}
    for r in records:  # HTTP 502/504 from the proxy: the reason its own record gives
        if r.get("proxy_reason"):
            proxy[r["proxy_reason"]] = proxy.get(r["proxy_reason"], 0) + 1
    if proxy:
        row["proxy_reasons"] = proxy
    return {k: v for k, v in row.items() if k not in DROPPED}


def _finish_medians(out: dict[str, Any], rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    for key in DROPPED:
        for part in (out, out["spread"], out["ci95"]):
            part.pop(key, None)
    for key in SCHEDULE_KEYS:
        values = [r[key] for r in rows if r.get(key) is not None]
        out[key] = median(values)
        out["spread"][key] = [min(values), max(values)] if values else None
    return out


def first_error(records: Sequence[Mapping[str, Any]]) -> str | None:
    """``reason: detail`` of the first failed request, by start time."""
    failed = sorted((r for r in records if r.get("outcome") != "success"), key=lambda r: r.get("start_unix") or 0)
    if not failed:
        return None
    r = failed[0]
    if r.get("proxy_reason"):  # the proxy answered for the engine: its record's reason, not "HTTP 502"
        return f"{r['proxy_reason']}: {r.get('detail')}"
    return f"{r.get('reason')}: {r.get('detail')}" if r.get("detail") else str(r.get("reason"))


def slo_breakdown(records: Sequence[Mapping[str, Any]], slo: SloLike) -> dict[str, int]:
    """How the requests fared against the SLO: met, each kind of miss, failed (judged, not met)."""
    out = {"met": 0, "ttft_missed": 0, "tpot_missed": 0, "both_missed": 0, "failed": 0}
    for r in records:
        if r.get("outcome") == "success":
            out[slo_result(r.get("ttft_s"), r.get("tpot_s"), slo.ttft_s, slo.tpot_s)] += 1
        elif r.get("outcome") != "client_abort":
            out["failed"] += 1
    return out


@dataclasses.dataclass
class _StageRun:
    """One stage's progress: its cells so far, the failed-rounds streak, why it stopped."""

    stage: Stage
    slo: SloLike
    streak: int = 0
    cells: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    stop: dict[str, Any] | None = None
    levels: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def skipped_after(self, cell: Cell) -> list[str]:
        return [c.scenario for c in self.stage.cells[self.stage.cells.index(cell) + 1:]]


def announced_cell(cell: Cell, stage: str, warmup: bool = False) -> dict[str, Any]:
    """What a round measures, as the proxy keeps it beside the round (``/-/scenario``'s ``cell``):
    the request shape, the load level (sessions at once for a session cell) and the stage."""
    return {"input_tokens": cell.input_tokens, "output_tokens": cell.output_tokens,
            "concurrency": cell.sessions if cell.sessions is not None else cell.concurrency, "rate": cell.rate,
            "stage": stage, "warmup": warmup}


async def _run_rounds(driver: Driver, run: _StageRun, cell: Cell) -> tuple[list[dict[str, Any]], list[list[Record]]]:
    """Warm-up, then the cell's rounds until the stop rule fires: (rows, each round's records)."""
    stage, k = run.stage, run.stage.stop_after_failed_rounds
    rows: list[dict[str, Any]] = []
    per_round: list[list[Record]] = []
    if cell.warmup:
        await driver.announce(WARMUP, 0, announced_cell(cell, stage.name, warmup=True))
        await driver.run_round(cell, WARMUP, 0, cell.warmup)
    for r in range(1, cell.rounds + 1):
        await driver.announce(cell.scenario, r, announced_cell(cell, stage.name))
        records, duration = await driver.run_round(cell, cell.scenario, r, cell.requests)
        row = {"engine": driver.label, "stage": stage.name, "scenario": cell.scenario, "round": r,
               **_figures(records, duration, run.slo)}
        rows.append(row)
        per_round.append(records)
        run.streak = run.streak + 1 if row["failures"] else 0
        if k and run.streak >= k:
            run.stop = {"stage": stage.name, "after": f"{cell.scenario}#{r}",
                        "reason": f"{k} consecutive rounds with a failed request",
                        "skipped": run.skipped_after(cell), "first_error": first_error(records)}
            break
    return rows, per_round


async def _run_cell(driver: Driver, run: _StageRun, cell: Cell) -> list[Record]:
    """One cell with its progress shown; returns the rounds' records."""
    async with driver.showing(cell.scenario, cell.rounds * cell.requests, warmup=cell.warmup):
        rows, per_round = await _run_rounds(driver, run, cell)
    await driver.announce(None, 0)
    # the bootstrap interval takes a while: off the event loop
    medians = await asyncio.to_thread(median_of_rounds, rows, per_round, slo=run.slo)
    records = [rec for round_records in per_round for rec in round_records]
    run.cells.append({"stage": run.stage.name, "cell": dataclasses.asdict(cell), "rounds": rows,
                      "median": _finish_medians(medians, rows), "prompt_tokens": counted_prompts(records)})
    return records


def _judge_level(run: _StageRun, cell: Cell, records: Sequence[Record]) -> None:
    """Note one sweep level; stop the stage when its goodput ratio is below the target."""
    sweep = run.stage.sweep
    assert sweep is not None
    median = run.cells[-1]["median"]
    ratio = median.get("goodput_ratio")
    level = cell.concurrency if sweep.over == "concurrency" else cell.rate
    met = ratio is not None and ratio >= sweep.goodput_target and run.stop is None
    run.levels.append({"level": level, "scenario": cell.scenario, "goodput_ratio": ratio,
                       "goodput_tok_s": median.get("goodput_tok_s"), "met": met})
    if run.stop is None and not met:
        shown = "none (no request judged)" if ratio is None else f"{ratio:.3f}"
        run.stop = {"stage": run.stage.name, "after": f"{cell.scenario}#{len(run.cells[-1]['rounds'])}",
                    "reason": f"goodput ratio {shown} below the target {sweep.goodput_target}",
                    "skipped": run.skipped_after(cell), "first_error": first_error(records)}
    if run.stop is not None:
        run.stop.update(level=level, failure_reasons=median_reasons(run.cells[-1]["rounds"]),
                        slo_results=slo_breakdown(records, run.slo))


def median_reasons(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Failure reasons of a cell's rounds, added up."""
    out: dict[str, int] = {}
    for row in rows:
        for reason, n in (row.get("failure_reasons") or {}).items():
            out[reason] = out.get(reason, 0) + n
    return out


def _sweep_result(run: _StageRun) -> dict[str, Any]:
    assert run.stage.sweep is not None
    met = [lv for lv in run.levels if lv["met"]]
    best = met[-1] if met else None
    ended = run.stop or {"reason": "every level met the SLO (raise the sweep's max to find the limit)"}
    return {"stage": run.stage.name, "over": run.stage.sweep.over, "goodput_target": run.stage.sweep.goodput_target,
            "best": best, "ended_by": ended, "levels": run.levels}


async def _run_stage(driver: Driver, stage: Stage, slo: SloLike) -> _StageRun:
    run = _StageRun(stage, slo)
    for cell in stage.cells:
        records = await _run_cell(driver, run, cell)
        if stage.sweep is not None:
            _judge_level(run, cell, records)
        if run.stop is not None:
            break
    return run


async def run_plan(driver: Driver, plan: Plan) -> dict[str, Any]:
    """Every stage in order; returns the summary (cells with rounds and medians, stops, sweeps)."""
    slo = plan.slo or DEFAULT_SLO
    cells, stops, sweeps = [], [], []
    for stage in plan.stages:
        run = await _run_stage(driver, stage, slo)
        cells.extend(run.cells)
        if run.stop is not None:
            stops.append(run.stop)
        if stage.sweep is not None:
            sweeps.append(_sweep_result(run))
    return {"engine": driver.label, "base_url": driver.base_url, "model": driver.model,
            "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s}, "cells": cells, "stops": stops,
            "sweeps": sweeps}
