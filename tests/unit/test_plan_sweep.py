"""The sweep stage: load levels upwards until the SLO or the failed-rounds rule breaks
(issue 11 item 6), against a simulated engine of known capacity.

The sim and the load driver run on a virtual clock (tests/virtual_clock.py): every decode
step takes exactly the model's time and every stamp is the loop's, so a level's TPOT is the
model's whatever the machine is doing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from exporter.harness.plan import load_plan
from exporter.harness.sim import build_params, create_sim_app
from exporter.harness.tables import round_table

from tests.virtual_clock import run_plan

# A sim whose decode step takes 10 ms + 5 ms per running request: TPOT is 20, 30, 50 and 90 ms
# at concurrency 2, 4, 8 and 16 (8 requests a level: the level's requests run together).  With a TPOT
# SLO of 40 ms the highest level that meets it is 4, and 8 breaks it.
KNOWN_CAPACITY = dict(decode_base_s=0.010, decode_per_running_s=0.005, prefill_base_s=0.001,
                      prefill_per_token_s=0.0, max_running=64, speed=1.0)

CONCURRENCY_SWEEP = """
slo: {ttft_s: 1.0, tpot_s: 0.040}
stages:
  - name: capacity
    sweep:
      over: concurrency
      start: 2
      factor: 2
      max: 16
      goodput_target: 0.75
      cell: {scenario: cap, input_tokens: 4, output_tokens: 8, requests: 8}
"""


def _run(tmp_path: Path, plan_text: str, **sim: Any) -> dict[str, Any]:
    """The plan against a sim with ``sim``'s parameters, both on one virtual clock."""
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(plan_text)
    return run_plan(create_sim_app(build_params("vllm", **sim)), load_plan(plan_file), tmp_path / "sim.sock",
                    tmp_path / "out", model="m", label="vllm")


def test_concurrency_sweep_stops_where_the_slo_breaks(tmp_path: Path) -> None:
    summary = _run(tmp_path, CONCURRENCY_SWEEP, **KNOWN_CAPACITY)
    (sweep,) = summary["sweeps"]
    assert [lv["level"] for lv in sweep["levels"]] == [2, 4, 8]  # 16 never ran
    assert [lv["met"] for lv in sweep["levels"]] == [True, True, False]
    assert [lv["goodput_ratio"] for lv in sweep["levels"]] == [1.0, 1.0, 0.0]
    # on the virtual clock each level's TPOT is the model's (the first request of a level to end
    # decodes its last step with one neighbour fewer)
    records = [json.loads(line) for line in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()]
    for level, model_s in ((2, 0.020), (4, 0.030), (8, 0.050)):
        tpots = [r["tpot_s"] for r in records if r["scenario"] == f"cap-c{level}"]
        assert len(tpots) == 8 and max(tpots) == pytest.approx(model_s, abs=1e-6), (level, tpots)
        assert min(tpots) >= model_s - 0.005 / 7 - 1e-9, (level, tpots)
    assert sweep["best"]["level"] == 4 and sweep["best"]["scenario"] == "cap-c4"
    assert sweep["best"]["goodput_tok_s"] > 0
    ended = sweep["ended_by"]
    assert ended["level"] == 8 and ended["reason"] == "goodput ratio 0.000 below the target 0.75"
    assert ended["skipped"] == ["cap-c16"]
    assert ended["slo_results"] == {"met": 0, "ttft_missed": 0, "tpot_missed": 8, "both_missed": 0, "failed": 0}
    assert [c["cell"]["concurrency"] for c in summary["cells"]] == [2, 4, 8]
    on_disk = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert on_disk["sweeps"][0]["best"]["level"] == 4
    table = round_table([summary])
    assert "highest level that met the SLO: 4 concurrent (cap-c4)" in table
    assert "ended at 8 concurrent: goodput ratio" in table and "tpot_missed" in table


def test_sweep_ended_by_failed_rounds_shows_the_failures(tmp_path: Path) -> None:
    plan = """
stages:
  - name: rates
    stop_after_failed_rounds: 2
    sweep:
      over: rate
      levels: [20, 40]
      goodput_target: 0.1
      cell: {scenario: r, input_tokens: 4, output_tokens: 2, requests: 4, rounds: 3}
"""
    summary = _run(tmp_path, plan, speed=50.0, fault_http_500=1.0)
    (sweep,) = summary["sweeps"]
    assert sweep["best"] is None
    ended = sweep["ended_by"]
    assert ended["level"] == 20 and ended["after"] == "r-r20#2"
    assert ended["reason"] == "2 consecutive rounds with a failed request"
    assert ended["failure_reasons"] == {"http_status": 8} and ended["first_error"] == "http_status: HTTP 500"
    assert ended["skipped"] == ["r-r40"]
    table = round_table([summary])
    assert "no level met the SLO" in table and "http_status 8" in table
    assert "first error: http_status: HTTP 500" in table


def test_sweep_whose_every_level_meets_the_slo_says_so(tmp_path: Path) -> None:
    plan = """
stages:
  - name: easy
    sweep: {over: concurrency, levels: [1, 2], cell: {scenario: e, input_tokens: 4, output_tokens: 2, requests: 2}}
"""
    summary = _run(tmp_path, plan, speed=50.0)
    (sweep,) = summary["sweeps"]
    assert sweep["best"]["level"] == 2 and summary["stops"] == []
    assert sweep["ended_by"]["reason"].startswith("every level met the SLO")
