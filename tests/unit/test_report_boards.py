"""The report's per-engine board: only that engine's series from the export's panel data, and a
marker per round it ran (from ``scenarios.jsonl``), warm-ups apart; without --prometheus the Boards
section says they were not fetched."""

from __future__ import annotations

import json
from pathlib import Path

from exporter.evidence.report.engine_board import PANELS, engine_board, round_marks

from tests.report_records import CELLS, RUN, T0, write_records


def _panel_data(d: Path, engines: list[str]) -> Path:
    d.mkdir(parents=True)
    for panel, *_ in PANELS:
        series = [{"name": e, "labels": {"engine": e}, "values": [[T0 + i * 5, float(i)] for i in range(20)]}
                  for e in engines]
        (d / f"{panel}.json").write_text(json.dumps({"queries": [{"ref": "A", "series": series}]}))
    return d


def test_each_round_of_the_engine_is_marked(tmp_path: Path) -> None:
    records = write_records(tmp_path / "records")
    marks = round_marks(records, RUN, "sglang", T0 - 1, T0 + 10_000)
    assert len(marks) == sum(c[5] for c in CELLS.values())
    assert {m.engine for m in marks} == {"sglang"} and all(m.scenario != "warmup" for m in marks)
    assert round_marks(records, "another-run", "sglang", T0 - 1, T0 + 10_000) == []


def test_the_board_draws_only_its_engine(tmp_path: Path) -> None:
    both = _panel_data(tmp_path / "both", ["sglang", "vllm"])
    only_vllm = _panel_data(tmp_path / "vllm", ["vllm"])
    fig = engine_board(both, "sglang", "#1f77b4", (T0, T0 + 100), [])
    assert fig is not None and fig.png[:8] == b"\x89PNG\r\n\x1a\n"
    assert engine_board(only_vllm, "sglang", "#1f77b4", (T0, T0 + 100), []) is None


def test_without_prometheus_the_boards_are_not_fetched(tmp_path: Path) -> None:
    from exporter.evidence.cli import main

    records = write_records(tmp_path / "records")
    assert main(["report", "--format", "md", "--records", str(records), "--out", str(tmp_path / "o")]) == 0
    md = (tmp_path / "o" / "report.md").read_text()
    boards = md[md.index("## Boards"):md.index("## Caveats")]
    assert "Not fetched: no --prometheus given" in boards and "![" not in boards
