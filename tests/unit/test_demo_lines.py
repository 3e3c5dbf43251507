"""The demo's prose fits 120 columns (wrapped at spaces, nothing lost); its table rows stay whole."""

from __future__ import annotations

from exporter.harness.demo import WIDTH, fit, table_row

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
