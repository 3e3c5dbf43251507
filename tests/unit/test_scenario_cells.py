"""SPEC 28: ``POST /-/scenario`` takes the round's cell (input and output tokens, concurrency or
rate, stage), writes it beside the announcement in ``scenarios.jsonl`` and ``evidence report``
reads it back; a bad cell is refused without echoing it; the announcements' spans are the same
as without it.  And the report's plan reader and frontier."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from exporter.evidence.report.cells import announced_cells, cell_map, plan_cells, read_announced
from exporter.evidence.report.figures import pareto
from exporter.evidence.runs import read_announcements

CELL = {"input_tokens": 1024, "output_tokens": 128, "concurrency": 8, "stage": "core", "warmup": False}


async def test_a_cell_is_written_and_read_back(upstream: Any, proxy_factory: Any, tmp_path: Path) -> None:
    _, server = upstream
    client = await proxy_factory(server.port)
    resp = await client.post("/-/scenario", json={"scenario": "short-c1", "round": 1, "cell": CELL})
    assert resp.status == 200
    assert (await client.post("/-/scenario", json={"scenario": None})).status == 200
    log = tmp_path / "run" / "scenarios.jsonl"
    cells = read_announced([tmp_path / "run"])
    assert cells["short-c1"].shape == "1024/128" and cells["short-c1"].concurrency == 8
    assert cells["short-c1"].stage == "core" and cells["short-c1"].source == "announced"
    spans = read_announcements(log).spans
    # the cell's line opens no span: one span per engine, as without it
    assert {(a.scenario, a.round) for a in spans} == {("short-c1", "1")} and len(spans) == len({a.engine for a in spans})


async def test_a_bad_cell_is_refused_and_not_echoed(upstream: Any, proxy_factory: Any, tmp_path: Path) -> None:
    _, server = upstream
    client = await proxy_factory(server.port)
    for cell in ({"input_tokens": -1}, {"secret_prompt_text": 1}, {"rate": "fast"}, ["x"]):
        resp = await client.post("/-/scenario", json={"scenario": "short-c1", "round": 1, "cell": cell})
        body = await resp.text()
        assert resp.status == 400 and "cell" in body and "secret_prompt_text" not in body and "fast" not in body
    log = tmp_path / "run" / "scenarios.jsonl"
    assert not log.exists() or "cell" not in log.read_text()


def test_a_plan_gives_cells_and_the_announced_ones_win(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("defaults: {rounds: 3}\nstages:\n  - name: core\n    cells:\n"
                    "      - {scenario: a, input_tokens: 1024, output_tokens: 128, concurrency: 4, requests: 8}\n"
                    "  - name: sweep\n    sweep:\n      over: rate\n      levels: [0.5, 1]\n"
                    "      cell: {scenario: r, input_tokens: 512, output_tokens: 64, requests: 20}\n")
    cells = plan_cells(plan)
    assert cells["a"].concurrency == 4 and cells["a"].stage == "core"
    assert {k: (c.rate, c.shape) for k, c in cells.items() if c.rate} == {"r-r0.5": (0.5, "512/64"),
                                                                          "r-r1": (1.0, "512/64")}
    (tmp_path / "scenarios.jsonl").write_text(json.dumps(
        {"event": "cell", "unix": 1.0, "scenario": "a", "round": 1, "cell": {**CELL, "concurrency": 2}}) + "\n")
    assert cell_map([tmp_path], plan)["a"].concurrency == 2


def test_load_summary_json_is_a_plan_too(tmp_path: Path) -> None:
    doc = [{"engine": "sglang", "cells": [{"stage": "calibration", "cell": {"scenario": "p", "input_tokens": 8,
                                                                              "output_tokens": 8, "concurrency": 1}}],
            "stops": []}]
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(doc))
    assert plan_cells(path)["p"].calibration


def test_announced_cells_ignore_lines_without_one() -> None:
    assert announced_cells([{"scenario": "a", "round": 1}, {"scenario": "b", "cell": "x"}]) == {}


def test_the_frontier_keeps_the_points_nothing_beats() -> None:
    points = [(10.0, 100.0), (20.0, 90.0), (15.0, 80.0), (5.0, 100.0), (30.0, 10.0)]
    assert pareto(points) == [(10.0, 100.0), (20.0, 90.0), (30.0, 10.0)]
