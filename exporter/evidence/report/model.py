"""The report's numbers, read from what ``evidence summarize`` already computed (its ``medians``
and ``rounds``) and placed: the core matrix (shape × concurrency, engines side by side), the rate
sweep, the frontier points and the run's totals.  Nothing here recomputes a percentile.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..noise import LOADS_DIFFER, METRICS, judged_verdict
from .cells import WARMUP, CellInfo

__all__ = ["Report", "MatrixCell", "build", "engine_order", "COLORS", "color_of", "MATRIX_METRICS"]

#: SGLang blue, vLLM orange (the seed's and the boards' colours); others in turn
COLORS = {"sglang": "#1f77b4", "vllm": "#ff7f0e"}
_OTHER = ("#2ca02c", "#9467bd", "#8c564b", "#e377c2")
#: the matrix's medians of rounds: (summary key, label, unit scale, unit)
MATRIX_METRICS = (("ttft_p95_s", "TTFT P95", 1000.0, "ms"), ("tpot_p95_s", "TPOT P95", 1000.0, "ms"),
                  ("output_throughput_tok_s", "output throughput", 1.0, "tok/s"))


def color_of(engine: str, kind: str | None, order: Sequence[str]) -> str:
    for key in (kind or "", engine):
        if key in COLORS:
            return COLORS[key]
    others = [e for e in order if e not in COLORS]
    return _OTHER[others.index(engine) % len(_OTHER)] if engine in others else _OTHER[0]


def engine_order(engines: Sequence[str]) -> list[str]:
    """SGLang, then vLLM, then the others by name (the seed's order)."""
    rank = {"sglang": 0, "vllm": 1}
    return sorted(dict.fromkeys(engines), key=lambda e: (rank.get(e, 2), e))


@dataclass(frozen=True)
class MatrixCell:
    """One engine's median-of-rounds row for one (shape, concurrency) cell."""

    engine: str
    scenario: str
    median: Mapping[str, Any]
    loads_differ: bool = False

    @property
    def success(self) -> tuple[int, int]:
        return int(self.median.get("success") or 0), int(self.median.get("requests") or 0)

    @property
    def passed(self) -> tuple[int, int]:
        return int(self.median.get("rounds_passed") or 0), int(self.median.get("rounds") or 0)

    def value(self, key: str) -> tuple[float | None, list[float] | None]:
        return self.median.get(key), (self.median.get("spread") or {}).get(key)


@dataclass
class Report:
    """Everything the sections show, for one run."""

    run_id: str
    engines: list[str]
    summary: Mapping[str, Any]
    cells: Mapping[str, CellInfo]
    kinds: dict[str, str | None] = field(default_factory=dict)
    #: (shape, concurrency) -> engine -> cell
    matrix: dict[tuple[str, int], dict[str, MatrixCell]] = field(default_factory=dict)
    #: rate -> engine -> median row
    sweep: dict[float, dict[str, Mapping[str, Any]]] = field(default_factory=dict)
    #: medians of scenarios without a known closed-loop or rate cell
    unpivoted: list[Mapping[str, Any]] = field(default_factory=list)
    calibration: list[str] = field(default_factory=list)
    totals: dict[str, Any] = field(default_factory=dict)

    def color(self, engine: str) -> str:
        return color_of(engine, self.kinds.get(engine), self.engines)

    @property
    def shapes(self) -> list[str]:
        return sorted({s for s, _ in self.matrix}, key=_shape_key)

    def concurrencies(self, shape: str | None = None) -> list[int]:
        return sorted({c for s, c in self.matrix if shape is None or s == shape})


def _shape_key(shape: str) -> tuple[int, int]:
    i, _, o = shape.partition("/")
    return int(i), int(o)


def _loads_differ(row: Mapping[str, MatrixCell]) -> set[str]:
    """Engines whose load differs from the first engine's in this cell, as compare judges it."""
    cells = list(row.values())
    differ: set[str] = set()
    for other in cells[1:]:
        verdict, _ = judged_verdict(cells[0].median, other.median, METRICS[0])
        if verdict == LOADS_DIFFER:
            differ |= {cells[0].engine, other.engine}
    return differ


def _place(report: Report, medians: Sequence[Mapping[str, Any]]) -> None:
    for m in medians:
        info = report.cells.get(m["scenario"])
        if info is not None and info.calibration:
            continue
        if info is not None and info.shape and info.concurrency:
            cell = MatrixCell(m["engine"], m["scenario"], m)
            report.matrix.setdefault((info.shape, info.concurrency), {})[m["engine"]] = cell
        elif info is not None and info.rate:
            report.sweep.setdefault(info.rate, {})[m["engine"]] = m
        else:
            report.unpivoted.append(m)
    for key, row in report.matrix.items():
        differ = _loads_differ(row)
        report.matrix[key] = {e: MatrixCell(c.engine, c.scenario, c.median, c.engine in differ)
                              for e, c in sorted(row.items(), key=lambda kv: report.engines.index(kv[0]))}


def _totals(report: Report, records: Sequence[Mapping[str, Any]], rounds: Sequence[Mapping[str, Any]]) -> None:
    calib = set(report.calibration)
    counted = [r for r in rounds if r["scenario"] not in calib]
    warm = [r for r in records if r.get("scenario") == WARMUP]
    calib_recs = [r for r in records if r.get("scenario") in calib]
    per_engine: dict[str, dict[str, int]] = defaultdict(lambda: {"rounds": 0, "requests": 0, "failures": 0})
    for r in counted:
        t = per_engine[r["engine"]]
        t["rounds"] += 1
        t["requests"] += int(r["requests"])
        t["failures"] += int(r["failures"])
    report.totals = {
        "rounds": len(counted), "requests": sum(int(r["requests"]) for r in counted),
        "failures": sum(int(r["failures"]) for r in counted), "per_engine": dict(per_engine),
        "warmup_requests": len(warm), "calibration_requests": len(calib_recs),
        "captures_kept": sum(1 for r in records if r.get("capture_sha256") and r.get("scenario") != WARMUP),
    }


def build(summary: Mapping[str, Any], records: Sequence[Mapping[str, Any]], cells: Mapping[str, CellInfo]) -> Report:
    """The report of the one run ``summary`` holds (``records``: that run's records)."""
    runs = [r["run_id"] for r in summary.get("runs") or []]
    kinds = {e["name"]: e.get("kind") for e in summary.get("engines") or [] if isinstance(e, Mapping)}
    engines = engine_order([m["engine"] for m in summary.get("medians") or []])
    report = Report(runs[0] if runs else "-", engines, summary, cells, kinds)
    seen = {m["scenario"] for m in summary.get("medians") or []}
    report.calibration = sorted(s for s in seen if (c := cells.get(s)) is not None and c.calibration)
    _place(report, summary.get("medians") or [])
    _totals(report, records, summary.get("rounds") or [])
    return report
