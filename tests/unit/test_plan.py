"""Plan files validated by pydantic: every mistake is one line naming its key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.harness.plan import Cell, PlanError, cell_from_options, load_plan

CELL = "{scenario: a, input_tokens: 4, output_tokens: 2, requests: 2, concurrency: 1}"


@pytest.mark.parametrize("text, message", [
    ("stages: [{cells: [{scenario: a, input_tokens: 1k, output_tokens: 2, requests: 2, concurrency: 1}]}]",
     "stages.0.cells.0.input_tokens: Input should be a valid integer (got '1k')"),
    ("stages: [{cells: [{scenario: a, input_tokens: 4, output_tokens: 2, requests: 2.5, concurrency: 1}]}]",
     "stages.0.cells.0.requests: Input should be a valid integer (got 2.5)"),
    ("stages: [{cells: [{scenario: a, input_tokens: 4, output_tokens: 2, requests: 0, concurrency: 1}]}]",
     "stages.0.cells.0.requests: Input should be greater than or equal to 1 (got 0)"),
    ("stages: [{cells: [{scenario: a, input_tokens: 4, output_tokens: 2, requests: 2, rate: .nan}]}]",
     "stages.0.cells.0.rate: Input should be a finite number (got nan)"),
    ("stages: [{cells: [{scenario: a, input_tokens: 4, output_tokens: 2, requests: 2, rate: .inf}]}]",
     "stages.0.cells.0.rate: Input should be a finite number (got inf)"),
    ("stages: [{cells: [{scenario: a, input_tokens: 4, output_tokens: 2, requests: 2}]}]",
     "stages.0.cells.0: give exactly one of concurrency and rate"),
    ("stages: [{cells: [{scenario: a, input_tokens: 4, output_tokens: 2, requests: 2, rate: 1, bogus: 1}]}]",
     "stages.0.cells.0.bogus: unknown key"),
    (f"default: {{rounds: 2}}\nstages: [{{cells: [{CELL}]}}]", "default: unknown key"),
    (f"defaults: {{round: 2}}\nstages: [{{cells: [{CELL}]}}]", "defaults.round: unknown key"),
    ("defaults: {input_tokens: 1k}\nstages: [{cells: [{scenario: a, output_tokens: 2, requests: 2, concurrency: 1}]}]",
     "defaults.input_tokens: Input should be a valid integer (got '1k')"),
    (f"stages: [{{stop_after_failed_round: 3, cells: [{CELL}]}}]", "stages.0.stop_after_failed_round: unknown key"),
    (f"slo: {{ttft_s: .nan}}\nstages: [{{cells: [{CELL}]}}]", "slo.ttft_s: Input should be a finite number"),
    (f"slo: {{ttft: 3}}\nstages: [{{cells: [{CELL}]}}]", "slo.ttft: unknown key"),
    ("stages: []", "stages: List should have at least 1 item"),
    ("- 1", "expected a mapping with a 'stages' list, got list"),
    ("stages: [\n", "not valid YAML"),
    (f"stages: [{{cells: [{CELL}], sweep: {{over: rate, levels: [1], cell: {{}}}}}}]",
     "stages.0: give exactly one of cells and sweep"),
    ("stages: [{sweep: {over: rate, cell: {scenario: a}}}]",
     "stages.0.sweep: give either levels: [...] or start, max and exactly one of step and factor"),
    ("stages: [{sweep: {over: load, levels: [1], cell: {}}}]", "stages.0.sweep.over: Input should be 'rate' or"),
    ("stages: [{sweep: {over: concurrency, levels: [1, 1.5], cell: {scenario: a, input_tokens: 1, output_tokens: 1, "
     "requests: 1}}}]", "stages.0.sweep: concurrency levels must be whole numbers"),
    ("stages: [{sweep: {over: rate, levels: [2, 1], cell: {scenario: a, input_tokens: 1, output_tokens: 1, "
     "requests: 1}}}]", "stages.0.sweep: levels must rise"),
    ("stages: [{sweep: {over: rate, levels: [1], cell: {scenario: a, rate: 2, input_tokens: 1, output_tokens: 1, "
     "requests: 1}}}]", "stages.0.sweep.cell: rate: the sweep sets the level; leave it out"),
    ("stages: [{sweep: {over: rate, levels: [1], cell: {scenario: a, output_tokens: 1, requests: 1}}}]",
     "stages.0.sweep.cell.input_tokens: required key missing"),
    ("stages: [{sweep: {over: rate, start: 0.001, step: 0.001, max: 1, cell: {scenario: a}}}]",
     "stages.0.sweep: more than 64 levels"),
    ("stages: [{sweep: {over: rate, levels: [1], goodput_target: 1.5, cell: {scenario: a}}}]",
     "stages.0.sweep.goodput_target: Input should be less than or equal to 1 (got 1.5)"),
])
def test_plan_mistakes_name_their_path(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(text + "\n")
    with pytest.raises(PlanError) as err:
        load_plan(path)
    assert str(err.value).startswith(f"{path}: ")
    assert message in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_missing_or_unreadable_plan(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="no such file"):
        load_plan(tmp_path / "nope.yaml")
    with pytest.raises(PlanError, match="is a directory"):
        load_plan(tmp_path)


def test_sweep_levels_and_their_cells(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(
        "defaults: {rounds: 3, warmup: 1, input_tokens: 8, rate: 9}\n"
        "slo: {ttft_s: 2, tpot_s: 0.04}\n"
        "stages:\n"
        "  - name: c\n    stop_after_failed_rounds: 2\n"
        "    sweep: {over: concurrency, start: 1, factor: 2, max: 16, goodput_target: 0.95,\n"
        "            cell: {scenario: cap, output_tokens: 4, requests: 8}}\n"
        "  - name: r\n"
        "    sweep: {over: rate, start: 0.3, step: 0.18, max: 0.7, cell: {scenario: rate, output_tokens: 4, "
        "requests: 8}}\n")
    plan = load_plan(path)
    conc, rate = plan.stages
    assert [(c.scenario, c.concurrency, c.rate) for c in conc.cells] == [
        (f"cap-c{n}", n, None) for n in (1, 2, 4, 8, 16)]
    assert all(c.rounds == 3 and c.warmup == 1 and c.input_tokens == 8 for c in conc.cells)
    assert conc.sweep is not None and conc.sweep.goodput_target == 0.95 and conc.stop_after_failed_rounds == 2
    assert [c.scenario for c in rate.cells] == ["rate-r0.3", "rate-r0.48", "rate-r0.66"]
    assert rate.sweep is not None and rate.sweep.over == "rate" and rate.sweep.goodput_target == 0.9
    assert plan.slo is not None and (plan.slo.ttft_s, plan.slo.tpot_s) == (2.0, 0.04)


def test_cells_are_checked_however_they_are_made() -> None:
    assert Cell("a", 1, 1, 1, concurrency=2).concurrency == 2
    with pytest.raises(PlanError, match="^--rate: Input should be a finite number"):
        cell_from_options(scenario="a", input_tokens=1, output_tokens=1, requests=1, rate=float("nan"))
    with pytest.raises(PlanError, match="^give exactly one of concurrency and rate"):
        cell_from_options(scenario="a", input_tokens=1, output_tokens=1, requests=1, rate=1.0, concurrency=1)
