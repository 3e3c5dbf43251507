"""Energy per output token per round in the report's boards section: from the GPUs' energy counter's
increase where it is scraped, else from power with at least five samples per GPU in the round,
else withheld (with the reason); simulated GPUs labelled so.  Each figure recomputed here from the
records and the stand-in Prometheus' own numbers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from exporter.evidence.merge import load_records
from exporter.evidence.report.doc import Table
from exporter.evidence.report.energy import MIN_POWER_SAMPLES, energy_block
from exporter.evidence.report.model import build
from exporter.evidence.summarize import summarize

from tests.report_records import write_records

SCRAPE_S = 1.0
WATTS = (300.0, 500.0)  # two GPUs, each drawing a steady power


class Prom:
    """A stand-in query API: two GPUs' power (and, with ``mj_per_s``, their energy counters rising
    at that many mJ a second), ``model`` their model name."""

    def __init__(self, mj_per_s: float | None, model: str = "NVIDIA H20") -> None:
        self.mj_per_s, self.model = mj_per_s, model

    def scrape_intervals(self) -> dict[str, float]:
        return {"dcgm": SCRAPE_S}

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        assert "modelName" in expr
        return [{"metric": {"modelName": self.model}, "value": [at, "2"]}]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        grid = [start + i * step for i in range(int((end - start) / step + 1e-9) + 1)]
        if "TOTAL_ENERGY_CONSUMPTION" in expr:
            if self.mj_per_s is None:
                return []
            return [{"metric": {"gpu": str(g)}, "values": [[t, str(1e9 * (g + 1) + self.mj_per_s * (g + 1) * t)]
                                                           for t in grid]} for g in range(2)]
        assert "DCGM_FI_DEV_POWER_USAGE" in expr
        return [{"metric": {"gpu": str(g)}, "values": [[t, str(w)] for t in grid]} for g, w in enumerate(WATTS)]


def _rounds(d: Path) -> tuple[Any, list[dict[str, Any]], dict[tuple[str, str, str], Mapping[str, Any]]]:
    records = load_records(d)
    report = build(summarize(records, records_dirs=[d]), records, {})
    by_round: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in records:
        if r["scenario"] != "warmup":
            by_round.setdefault((r["engine"], r["scenario"], str(r["round"])), []).append(r)
    spans = {k: {"start": min(r["start_unix"] for r in rs), "end": max(r["start_unix"] + r["e2e_s"] for r in rs),
                 "tokens": sum(r["completion_tokens"] or 0 for r in rs if r["outcome"] == "success")}
             for k, rs in by_round.items()}
    return report, records, spans


def _table(blocks: Sequence[Any], simulated: bool = False) -> dict[tuple[str, str], tuple[str, ...]]:
    table = next(b for b in blocks if isinstance(b, Table))
    assert table.head == ("engine", "scenario#round", "output tokens", "GPUs", "energy (J)", "J/token", "from")
    assert ("Simulated GPUs" in table.caption) == simulated
    return {(row[0], row[1]): row for row in table.rows}


def test_from_the_energy_counter_where_it_is_scraped(tmp_path: Path) -> None:
    report, records, spans = _rounds(write_records(tmp_path / "run"))
    rows = _table(energy_block(report, records, Prom(mj_per_s=250_000.0)))
    assert len(rows) == len(spans)
    for (engine, scenario, rnd), s in spans.items():
        row = rows[(engine, f"{scenario}#{rnd}")]
        joules = sum(250_000.0 * (g + 1) * (s["end"] - s["start"]) for g in range(2)) / 1000.0
        assert row[2] == str(s["tokens"]) and row[3] == "2" and row[6] == "energy counter"
        assert float(row[4]) == pytest.approx(joules, abs=0.05)
        assert row[5] == f"{joules / s['tokens']:.3g}"


def test_from_power_with_enough_samples_else_withheld(tmp_path: Path) -> None:
    report, records, spans = _rounds(write_records(tmp_path / "run"))
    rows = _table(energy_block(report, records, Prom(mj_per_s=None, model="NVIDIA H20-3e (simulated)")), True)
    measured = withheld = 0
    for (engine, scenario, rnd), s in spans.items():
        row = rows[(engine, f"{scenario}#{rnd}")]
        duration = s["end"] - s["start"]
        samples = int(duration / SCRAPE_S + 1e-9) + 1  # the grid's points at the scrape interval
        assert row[3] == "2 simulated"
        if samples >= MIN_POWER_SAMPLES:
            measured += 1
            assert float(row[4]) == pytest.approx(sum(WATTS) * duration, abs=0.05)
            assert row[5] == f"{sum(WATTS) * duration / s['tokens']:.3g}"
            assert row[6] == f"power ({samples}+ samples a GPU)"
        else:
            withheld += 1
            assert (row[4], row[5]) == ("-", "-")
            plural = "" if samples == 1 else "s"
            assert row[6] == (f"withheld: {samples} power sample{plural} in its {duration:.1f} s, fewer than "
                              f"{MIN_POWER_SAMPLES} (scrape interval {SCRAPE_S:g} s)")
    assert measured and withheld  # both kinds of round are in the records


def test_withheld_where_no_gpu_is_scraped(tmp_path: Path) -> None:
    class Nothing(Prom):
        def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
            return []

        def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
            return []

    report, records, spans = _rounds(write_records(tmp_path / "run"))
    rows = _table(energy_block(report, records, Nothing(None)))
    assert {row[6] for row in rows.values()} == {"withheld: no GPU energy or power scraped"}
    assert all((row[3], row[4], row[5]) == ("0", "-", "-") for row in rows.values())
