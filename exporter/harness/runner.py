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
from typing import Any, Protocol

from exporter.core.slo import slo_result
from exporter.core.stats import SloLike, median_of_rounds, round_row
from exporter.proxy.config import DEFAULT_SLO

from .plan import Cell, Plan, Stage

__all__ = ["run_plan", "first_error", "slo_breakdown"]

Record = dict[str, Any]


class Driver(Protocol):
    """What running a plan needs of a load driver (:class:`exporter.harness.load.Driver` is one)."""

    label: str

    async def announce(self, scenario: str | None, round_: int) -> None: ...

    async def run_round(self, cell: Cell, scenario: str, round_: int, n: int) -> tuple[list[Record], float]: ...


def first_error(records: Sequence[Mapping[str, Any]]) -> str | None:
    """``reason: detail`` of the first failed request, by start time."""
    failed = sorted((r for r in records if r.get("outcome") != "success"), key=lambda r: r.get("start_unix") or 0)
    if not failed:
        return None
    r = failed[0]
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


async def _run_cell(driver: Driver, run: _StageRun, cell: Cell) -> list[Record]:
    """Warm-up, then the cell's rounds until the stop rule fires; returns the rounds' records."""
    stage, k = run.stage, run.stage.stop_after_failed_rounds
    rows: list[dict[str, Any]] = []
    per_round: list[list[Record]] = []
    if cell.warmup:
        await driver.announce("warmup", 0)
        await driver.run_round(cell, "warmup", 0, cell.warmup)
    for r in range(1, cell.rounds + 1):
        await driver.announce(cell.scenario, r)
        records, duration = await driver.run_round(cell, cell.scenario, r, cell.requests)
        row = {"engine": driver.label, "stage": stage.name, "scenario": cell.scenario, "round": r,
               **round_row(records, duration, slo=run.slo)}
        rows.append(row)
        per_round.append(records)
        run.streak = run.streak + 1 if row["failures"] else 0
        if k and run.streak >= k:
            run.stop = {"stage": stage.name, "after": f"{cell.scenario}#{r}",
                        "reason": f"{k} consecutive rounds with a failed request",
                        "skipped": run.skipped_after(cell), "first_error": first_error(records)}
            break
    await driver.announce(None, 0)
    # the bootstrap interval takes a while: off the event loop
    median = await asyncio.to_thread(median_of_rounds, rows, per_round, slo=run.slo)
    run.cells.append({"stage": stage.name, "cell": dataclasses.asdict(cell), "rounds": rows, "median": median})
    return [rec for records in per_round for rec in records]


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
