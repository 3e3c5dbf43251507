"""The demo's prose fits 120 columns (wrapped at spaces, nothing lost); its table rows stay whole, and its
tables (the proxy-side medians, the client-side grid) are split into tables of 120 columns, losing no cell."""

from __future__ import annotations

from pathlib import Path

from exporter.evidence.merge import load_records
from exporter.evidence.summarize import summarize
from exporter.evidence.summary_md import headline_markdown
from exporter.harness.demo import WIDTH, fit, table_row
from exporter.harness.tables import round_table

from tests.report_records import write_records

PROSE = ("SLO: TTFT <= 3.0 s and TPOT <= 50 ms; goodput % = requests that met it / judged requests (failures count "
         "against it); [min-max] = spread over rounds; /tmp/a-rather/long/path/that-is-one-word/" + "x" * 130)
ROW = "engine  scenario  success  in tok  prompt tok  tok/s  goodput %  good tok/s  TTFT P95 ms  TPOT P95 ms" + " " * 60
MD = "| vllm | short-c8 | 2 | 32 | 32 | 135 [126–143] (CI 94.7–150) |" * 3


def test_prose_is_wrapped_and_nothing_is_lost() -> None:
    lines = fit("    " + PROSE).split("\n")
    assert len(lines) > 1 and all(len(x) <= WIDTH for x in lines[:-1])  # the last holds the one long word
    assert lines[0].startswith("    SLO:") and all(x.startswith("      ") for x in lines[1:])
    assert " ".join(x.strip() for x in lines) == PROSE


def test_table_rows_are_whole() -> None:
    assert fit(ROW + "\n" + MD) == ROW + "\n" + MD


def test_an_aligned_label_is_prose_and_wraps_under_its_text() -> None:
    line = "compare:    /tmp/demo/compare/compare.md (vllm against sglang: better, worse or within noise per scenario " \
           "and metric; CSV and one PNG per metric beside it)"
    assert not table_row(line) and table_row(ROW)
    lines = fit(line).split("\n")
    assert len(lines) == 2 and all(len(x) <= WIDTH for x in lines)
    assert lines[1].startswith(" " * 12) and not lines[1].startswith(" " * 13)  # under the path
    assert " ".join(" ".join(lines).split()) == " ".join(line.split())


def _cells(lines: list[str]) -> dict[tuple[str, str], dict[str, str]]:
    """The Markdown tables among ``lines``: per (engine, scenario), each column's title -> value."""
    out: dict[tuple[str, str], dict[str, str]] = {}
    head: list[str] = []
    for line in lines:
        if not line.startswith("|") or line.startswith("|---"):
            head = [] if not line.startswith("|") else head
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if not head:
            head = cells
            continue
        out.setdefault((cells[0], cells[1]), {}).update(zip(head, cells))
    return out


def test_the_headline_tables_fit_and_lose_nothing(tmp_path: Path) -> None:
    """The proxy-side medians the demo prints: split into tables of engine, scenario and as many
    columns as fit 120, every cell of the whole table in one of them."""
    d = write_records(tmp_path / "run")
    summary = summarize(load_records(d), records_dirs=[d])
    whole, split = headline_markdown(summary).split("\n"), headline_markdown(summary, width=WIDTH).split("\n")
    assert max(len(x) for x in whole if x.startswith("|")) > WIDTH  # the case this is about
    assert all(len(x) <= WIDTH for x in split if x.startswith("|"))
    assert _cells(split) == _cells(whole) and len(_cells(whole)) == len(summary["medians"])
    assert any(x.startswith("(continued: ") for x in split)
    assert all(len(x) <= WIDTH for x in fit("\n".join(split)).split("\n"))


def test_the_client_side_grid_fits_and_loses_nothing() -> None:
    spread = {"output_throughput_tok_s": [3275.7, 4003.7], "goodput_ratio": [0.2, 0.3], "ttft_p95_s": [2.6, 3.2],
              "tpot_p95_s": [0.011, 0.0135], "e2e_p95_s": [2.79, 3.41]}
    median = {"rounds": 3, "requests": 64, "success": 64, "output_throughput_tok_s": 3639.71, "goodput_ratio": 0.25,
              "ttft_p95_s": 2.941, "tpot_p95_s": 0.0123, "e2e_p95_s": 3.118, "schedule_lag_p50_s": 0.0004,
              "schedule_lag_p99_s": 0.0021, "spread": spread, "ci95": {}}
    summary = {"engine": "sglang", "cells": [{"cell": {"scenario": s}, "median": median} for s in ("in24k-c32", "c8")],
               "slo": {"ttft_s": 3.0, "tpot_s": 0.05}}
    whole, split = round_table([summary]).split("\n"), round_table([summary], width=WIDTH).split("\n")
    rows = [x for x in whole if table_row(x)]
    assert max(len(x) for x in rows) > WIDTH
    assert all(len(x) <= WIDTH for x in split if table_row(x) or set(x) == {"-"})
    for scenario in ("in24k-c32", "c8"):  # each cell's figures, all of them, on its lines of the split grids
        words = [w for x in rows if x.split()[1:2] == [scenario] for w in x.split()]
        mine = [w for x in split if table_row(x) and x.split()[1:2] == [scenario] for w in x.split()]
        assert sorted(set(words)) == sorted(set(mine))
    assert all(len(x) <= WIDTH for x in fit("\n".join(split)).split("\n"))
