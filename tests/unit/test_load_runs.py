"""The load driver's runs: known scenarios only, progress, its own schedule, and tables that
say where their numbers come from (issue 22; issue 21 item 4; issue 19 items 6 and 7)."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from exporter.core.stats import percentile
from exporter.harness.cliutil import UserError
from exporter.harness.load import Cell, Driver, Plan, Stage, load_plan
from exporter.harness.plan import WARMUP, scenario_names
from exporter.harness.progress import Progress
from exporter.harness.sim import build_params, create_sim_app
from exporter.harness.tables import TITLE, round_table
from exporter.proxy.config import validate

from tests.helpers import read_records
from tests.virtual_clock import run_plan

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


class Clock:
    """A clock that moves ``step`` seconds each time it is read."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def _config_of(plan_file: Path) -> Path:
    """The proxy config a plan file names in its comments (``serve --config examples/X.yaml``)."""
    found = re.findall(r"serve --config (examples/[\w.-]+\.yaml)", plan_file.read_text())
    assert found, f"{plan_file.name} names no `serve --config examples/...` for its proxy"
    return ROOT / found[0]


@pytest.mark.parametrize("plan_file", sorted((EXAMPLES / "plans").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_plan_runs_against_its_example_config(plan_file: Path) -> None:
    config = validate(yaml.safe_load(_config_of(plan_file).read_text()))
    missing = [n for n in scenario_names(load_plan(plan_file)) if n not in config.scenarios]
    assert missing == [], f"{_config_of(plan_file).name} lacks {missing} of {plan_file.name}"


@pytest.mark.parametrize("config_file", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_config_is_valid_and_serves_a_plan(config_file: Path) -> None:
    config = validate(yaml.safe_load(config_file.read_text()))
    assert WARMUP in config.scenarios and "adhoc" in config.scenarios  # warm-ups and load's default name
    plans = [p.name for p in (EXAMPLES / "plans").glob("*.yaml") if _config_of(p) == config_file]
    assert plans, f"no example plan names {config_file.name}"


def test_the_seed_plan_is_served_by_the_stack_config() -> None:
    assert _config_of(EXAMPLES / "plans" / "seed.yaml") == EXAMPLES / "stack.yaml"
    names = scenario_names(load_plan(EXAMPLES / "plans" / "seed.yaml"))
    assert len(names) == 16 and names[-1] == WARMUP  # 12 core cells, 3 rates, the warm-ups' label
    assert {"warmup", "adhoc"} <= set(validate(yaml.safe_load((EXAMPLES / "stack.yaml").read_text())).scenarios)


def test_warmups_carry_a_name_that_is_checked() -> None:
    cells = [Cell("b", 4, 2, 2, concurrency=1), Cell("a", 4, 2, 2, rate=1.0)]
    assert scenario_names(Plan([Stage("s", cells)])) == ["b", "a"]
    cells.append(Cell("b", 4, 2, 2, concurrency=2, warmup=1))
    assert scenario_names(Plan([Stage("s", cells)])) == ["b", "a", WARMUP]


async def test_unknown_scenarios_are_refused_before_any_request(aiohttp_server: Any, proxy_factory: Any,
                                                                tmp_path: Path) -> None:
    sim = await aiohttp_server(create_sim_app(build_params("vllm", speed=50.0)))
    proxy = await proxy_factory(sim.port)  # knows short-c1 and short-c32
    async with Driver(str(proxy.make_url("/vllm")), check_url=True) as driver:
        await driver.check_scenarios(["short-c1", "short-c32"])
        with pytest.raises(UserError) as refused:
            await driver.check_scenarios(["short-c1", "in8k-c8", WARMUP])
    message = str(refused.value)
    assert "does not know the scenarios in8k-c8, warmup" in message and "'other'" in message
    assert "scenarios: in its config" in message and "it knows: short-c1, short-c32" in message
    assert "\n" not in message
    assert read_records(tmp_path) == []  # nothing was sent


async def test_a_base_url_that_is_no_proxy_needs_no_proxy(aiohttp_server: Any) -> None:
    sim = await aiohttp_server(create_sim_app(build_params("vllm", speed=50.0)))
    for path, cause in (("", "names no engine"), ("/vllm", "/-/scenarios: HTTP 404")):
        async with Driver(f"http://127.0.0.1:{sim.port}{path}", model="m") as driver:
            with pytest.raises(UserError, match=cause) as refused:
                await driver.check_scenarios(["a"])
        assert "add --no-proxy" in str(refused.value)


def test_progress_lines_off_a_terminal_come_every_ten_seconds() -> None:
    out, clock = io.StringIO(), Clock(0.0)
    progress = Progress("vllm short-c8", 6, stream=out, tty=False, clock=clock)
    for at in (3.0, 6.0, 9.9):
        clock.now = at
        progress.tick(True)
    assert out.getvalue() == ""  # under 10 s since the start
    clock.now = 10.0
    progress.tick(False)
    clock.now = 15.0
    progress.heartbeat()  # 5 s since the last line: none
    clock.now = 20.0
    progress.heartbeat()  # no request finished, yet a line is due
    progress.stage = "round 2/3"
    progress.close()
    progress.close()
    assert out.getvalue().splitlines() == [
        "vllm short-c8: 4/6 requests, 1 failed, 10 s",
        "vllm short-c8: 4/6 requests, 1 failed, 20 s",
        "vllm short-c8: 4/6 requests, round 2/3, 1 failed, 20 s",
    ]


def test_progress_on_a_terminal_is_one_bar_redrawn() -> None:
    out = io.StringIO()
    progress = Progress("sglang in8k-c1", 2, stream=out, tty=True, clock=Clock(0.0))
    progress.tick(True)
    progress.tick(True)
    progress.close()
    text = out.getvalue()
    assert text.count("\r") == 3 and text.endswith("\n") and text.count("\n") == 1
    assert "[" + "#" * 30 + "] 2/2" in text


async def test_load_shows_requests_done_of_planned_per_cell(aiohttp_server: Any) -> None:
    sim = await aiohttp_server(create_sim_app(build_params("sglang", speed=50.0)))
    out = io.StringIO()
    plan = Plan([Stage("core", [Cell("c2", 4, 2, 3, concurrency=2, rounds=2, warmup=1),
                                Cell("r", 4, 2, 2, rate=50.0)])])
    # every read of this clock is 10 s later: each finished request is due a line
    async with Driver(f"http://127.0.0.1:{sim.port}", model="m", label="sglang", progress_stream=out,
                      progress_clock=Clock(10.0)) as driver:
        summary = await driver.run_plan(plan)
    lines = out.getvalue().splitlines()
    # the warm-up is counted openly and apart: the table's 6 requests are the progress line's 6
    assert any(x.startswith("sglang c2: 0/6 requests, warm-up 1/1, 0 failed") for x in lines), lines
    for k in range(1, 7):
        assert any(x.startswith(f"sglang c2: {k}/6 requests (+1 warm-up),") for x in lines), (k, lines)
    assert not any("/7 requests" in x for x in lines)
    assert any(x.startswith("sglang c2: 6/6 requests (+1 warm-up), round 2/2, 0 failed") for x in lines)
    assert any(x.startswith("sglang r: 2/2 requests, round 1/1, 0 failed") for x in lines)
    table = round_table([summary])
    assert re.search(r"sglang +c2 +6/6 ", table), table  # the same 6 requests as the progress line
    assert "warm-up requests, sent before each cell's rounds and left out of this table" in table
    assert "sglang c2 1" in table


STALL_S = 0.1


def test_the_drivers_own_schedule_is_in_every_record(tmp_path: Path) -> None:
    """On a virtual clock (tests/virtual_clock.py) each request goes out exactly when it is due:
    its schedule lag is 0.  The loop stalls STALL_S as the first open-loop request arrives at the
    engine: the requests due meanwhile go out when the stall ends, each exactly as late as that,
    and their E2E counted from when they were due adds that lag."""
    app = create_sim_app(build_params("vllm", speed=50.0))
    stalls: list[float] = []

    @web.middleware
    async def stall_once(request: web.Request, handler: Any) -> web.StreamResponse:
        if not stalls and request.headers.get("X-Bench-Scenario") == "open":
            loop = asyncio.get_running_loop()
            stalls.append(loop.time())
            loop.advance(STALL_S)  # type: ignore[attr-defined] - the loop is busy this long
        return await handler(request)

    app.middlewares.append(stall_once)
    plan = Plan([Stage("core", [Cell("open", 4, 2, 6, rate=40.0), Cell("closed", 4, 2, 4, concurrency=2)])])
    summary = run_plan(app, plan, tmp_path / "sim.sock", tmp_path, model="m", seed=5)
    records = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    open_loop = sorted((r for r in records if r["scenario"] == "open"), key=lambda r: r["intended_start_unix"])
    closed = [r for r in records if r["scenario"] == "closed"]
    assert len(open_loop) == 6 and len(closed) == 4 and len(stalls) == 1
    # open loop: the intended starts are the seeded Poisson schedule, whatever the sends' delays
    arrivals = random.Random("arrivals-5")
    gaps = [arrivals.expovariate(40.0) for _ in range(5)]
    got = [b["intended_start_unix"] - a["intended_start_unix"] for a, b in zip(open_loop, open_loop[1:])]
    assert got == pytest.approx(gaps, abs=2e-6)  # the records' rounding to 1 us
    due = [sum(gaps[:i]) for i in range(1, 6)]  # after the first request's, which went out on time
    lags = [0.0] + [max(0.0, STALL_S - d) for d in due]  # the stall began as the first one arrived
    assert sum(lag > 0 for lag in lags) >= 2  # the seeded schedule puts requests inside the stall
    assert [r["schedule_lag_s"] for r in open_loop] == pytest.approx(lags, abs=2e-6)
    for r in open_loop:
        assert r["e2e_from_intended_s"] == pytest.approx(r["e2e_s"] + r["schedule_lag_s"], abs=2e-6)
    assert [r["schedule_lag_s"] for r in closed] == [0.0] * 4  # each sent the moment its worker was free
    assert all(r["e2e_from_intended_s"] is None for r in closed)  # a closed loop has no schedule to miss
    first = sorted(r["intended_start_unix"] for r in closed)[:2]
    assert first[0] == first[1]  # both workers are free at the round's start
    open_cell, closed_cell = summary["cells"]
    row = open_cell["rounds"][0]
    assert row["schedule_lag_p50_s"] == pytest.approx(percentile(lags, 50), abs=2e-6)
    assert row["schedule_lag_p99_s"] == pytest.approx(percentile(lags, 99), abs=2e-6)
    from_intended = [r["e2e_from_intended_s"] for r in open_loop if r["outcome"] == "success"]
    assert row["e2e_from_intended_p95_s"] == pytest.approx(percentile(from_intended, 95), abs=1e-6)
    assert closed_cell["median"]["e2e_from_intended_p95_s"] is None
    assert open_cell["median"]["schedule_lag_p99_s"] == row["schedule_lag_p99_s"]
    with open(tmp_path / "rounds.csv", newline="") as fh:
        header = next(csv.reader(fh))
    assert {"schedule_lag_p50_s", "schedule_lag_p99_s", "e2e_from_intended_p95_s"} <= set(header)
    # one name per figure: slo_attainment is goodput_ratio but for client aborts
    assert "slo_attainment" not in header and "slo_attainment" not in row and "goodput_ratio" in row
    assert "slo_attainment" not in open_cell["median"] and "slo_attainment" not in open_cell["median"]["ci95"]
    table = round_table([summary])
    assert "lag P50/P99 ms" in table and "sched E2E P95 ms" in table


def _summary(**median: Any) -> dict[str, Any]:
    base = {"rounds": 1, "requests": 64, "success": 64, "output_throughput_tok_s": 3639.71,
            "goodput_ratio": 0.25, "ttft_p95_s": 2.941, "tpot_p95_s": 0.0123, "e2e_p95_s": 3.118,
            "schedule_lag_p50_s": 0.0004, "schedule_lag_p99_s": 0.0021, "spread": {}, "ci95": {}}
    return {"engine": "sglang", "cells": [{"cell": {"scenario": "in24k-c32"}, "median": {**base, **median}}],
            "slo": {"ttft_s": 3.0, "tpot_s": 0.05}}


def test_the_round_table_says_client_side_and_shows_ms_and_percent() -> None:
    table = round_table([_summary()])
    assert table.splitlines()[0] == TITLE and "client-side" in TITLE
    head = table.splitlines()[1]
    for title in ("goodput %", "TTFT P95 ms", "TPOT P95 ms", "E2E P95 ms", "lag P50/P99 ms"):
        assert title in head
    assert " s " not in head + " "
    row = table.splitlines()[3]
    assert "2941.0" in row and "3118.0" in row and "25.0" in row and "0.40/2.10" in row


def test_no_confidence_interval_of_zero_width() -> None:
    ci = {"output_throughput_tok_s": [3639.71, 3639.74], "ttft_p95_s": [2.8, 3.1]}
    table = round_table([_summary(ci95=ci, spread={"output_throughput_tok_s": [2652.0, 4391.0]})])
    assert "3639.7-3639.7" not in table
    assert "TTFT P95 ms 2800.0-3100.0" in table and "one round: no round-to-round noise" in table
    only_flat = round_table([_summary(ci95={"output_throughput_tok_s": [3639.7, 3639.7]})])
    assert "95% CI" not in only_flat


async def test_a_round_run_twice_in_one_proxy_run_is_said_at_once(aiohttp_server: Any, proxy_factory: Any) -> None:
    """load numbers its rounds from 1: run twice against one proxy run, its second run announces
    rounds the proxy has seen, and the proxy's warning reaches the user on the driver's stream."""
    sim = await aiohttp_server(create_sim_app(build_params("vllm", speed=50.0)))
    proxy = await proxy_factory(sim.port)  # knows short-c1 and short-c32
    plan = Plan([Stage("core", [Cell("short-c1", 4, 2, 2, concurrency=1, warmup=0)])])
    streams = []
    for _ in range(2):
        out = io.StringIO()
        async with Driver(str(proxy.make_url("/vllm")), model="m", progress_stream=out) as driver:
            await driver.run_plan(plan)
        streams.append(out.getvalue())
    assert "warning:" not in streams[0]
    warned = [x for x in streams[1].splitlines() if x.startswith("warning: the proxy says: ")]
    assert len(warned) == 1 and "short-c1#1 was announced before in this run" in warned[0], streams[1]
