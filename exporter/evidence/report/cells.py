"""What each scenario's cell was: its shape (input and output tokens), its load (concurrency or
rate) and its stage, as the load driver announced it or a plan says.

Sources, first that knows a scenario wins: the ``cell`` object of the ``scenarios.jsonl`` lines
beside the records (``load`` announces it with each round); ``--plan FILE``: a load plan
(YAML: ``stages`` of ``cells``, or a sweep with its ``levels``) or the ``summary.json`` that
``load --out DIR`` writes (its ``cells``).  A scenario no source knows is shown unpivoted.
Scenario names are never parsed for numbers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["CellInfo", "CellsError", "announced_cells", "plan_cells", "cell_map", "plan_stops", "CALIBRATION", "WARMUP"]

#: the stage name that marks calibration rounds (out of every denominator)
CALIBRATION = "calibration"
#: the scenario label of warm-up requests
WARMUP = "warmup"


class CellsError(ValueError):
    """A plan file that cannot be read: one line."""


@dataclass(frozen=True)
class CellInfo:
    scenario: str
    input_tokens: int | None = None
    output_tokens: int | None = None
    concurrency: int | None = None
    rate: float | None = None
    stage: str | None = None
    source: str = "plan"

    @property
    def shape(self) -> str | None:
        if self.input_tokens is None or self.output_tokens is None:
            return None
        return f"{self.input_tokens}/{self.output_tokens}"

    @property
    def calibration(self) -> bool:
        return self.stage == CALIBRATION


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _float(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None


def _info(doc: Mapping[str, Any], stage: str | None, source: str) -> CellInfo | None:
    name = doc.get("scenario")
    if not isinstance(name, str) or not name:
        return None
    st = doc.get("stage", stage)
    conc = doc.get("concurrency") if doc.get("concurrency") is not None else doc.get("sessions")  # sessions at once
    return CellInfo(name, _int(doc.get("input_tokens")), _int(doc.get("output_tokens")), _int(conc),
                    _float(doc.get("rate")), st if isinstance(st, str) else None, source)


def announced_cells(lines: Iterable[Mapping[str, Any]]) -> dict[str, CellInfo]:
    """Cells from ``scenarios.jsonl`` lines that carry a ``cell`` object (the latest wins)."""
    out: dict[str, CellInfo] = {}
    for line in lines:
        cell = line.get("cell")
        if isinstance(cell, Mapping) and isinstance(line.get("scenario"), str):
            info = _info({**cell, "scenario": line["scenario"]}, None, "announced")
            if info is not None:
                out[info.scenario] = info
    return out


def read_announced(records_dirs: Iterable[Path]) -> dict[str, CellInfo]:
    """:func:`announced_cells` of the ``scenarios.jsonl`` beside each records directory."""
    lines: list[dict[str, Any]] = []
    for d in records_dirs:
        path = d / "scenarios.jsonl" if d.is_dir() else d.parent / "scenarios.jsonl"
        if not path.is_file():
            continue
        for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                doc = json.loads(raw)
            except ValueError:
                continue
            if isinstance(doc, dict):
                lines.append(doc)
    return announced_cells(lines)


def _sweep(stage: Mapping[str, Any], name: str | None, defaults: Mapping[str, Any]) -> list[CellInfo]:
    sweep = stage.get("sweep")
    if not isinstance(sweep, Mapping) or not isinstance(sweep.get("levels"), list):
        return []  # start/max/step sweeps: their scenarios are shown unpivoted
    template = {**defaults, **(sweep.get("cell") or {})}
    base, over = template.get("scenario"), sweep.get("over")
    out = []
    for level in sweep["levels"]:
        if over == "concurrency" and _int(level):
            doc = {**template, "concurrency": int(level), "rate": None, "scenario": f"{base}-c{int(level)}"}
        elif over == "rate" and _float(level):
            doc = {**template, "rate": float(level), "concurrency": None, "scenario": f"{base}-r{float(level):g}"}
        else:
            continue
        info = _info(doc, name, "plan")
        if info is not None:
            out.append(info)
    return out


def _plan_doc(doc: Mapping[str, Any]) -> list[CellInfo]:
    if isinstance(doc.get("cells"), list) and not isinstance(doc.get("stages"), list):  # load's summary.json
        return [i for c in doc["cells"] if isinstance(c, Mapping)
                for i in [_info({**(c.get("cell") or {}), "stage": c.get("stage")}, None, "plan")] if i]
    raw = doc.get("defaults")
    defaults: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    out: list[CellInfo] = []
    for stage in doc.get("stages") or []:
        if not isinstance(stage, Mapping):
            continue
        name = stage.get("name") if isinstance(stage.get("name"), str) else None
        for c in stage.get("cells") or []:
            info = _info({**defaults, **c}, name, "plan") if isinstance(c, Mapping) else None
            if info is not None:
                out.append(info)
        out += _sweep(stage, name, defaults)
    return out


def plan_cells(path: Path) -> dict[str, CellInfo]:
    """The cells of a plan file (YAML) or of a ``load --out`` summary.json; CellsError when unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CellsError(f"--plan {path}: cannot read: {exc.strerror or exc}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        raise CellsError(f"--plan {path}: neither YAML nor JSON") from None
    docs = doc if isinstance(doc, list) else [doc]  # the demo's summary.json: one per engine
    cells = [c for d in docs if isinstance(d, Mapping) for c in _plan_doc(d)]
    if not cells:
        raise CellsError(f"--plan {path}: no cells (a load plan with stages of cells, or load's summary.json)")
    return {c.scenario: c for c in cells}


def plan_stops(path: Path | None) -> list[dict[str, Any]]:
    """The stop rule's events of a ``load --out`` summary.json (one per engine, or the demo's list of
    them), each with its engine; none from a plan YAML (it holds no events)."""
    if path is None:
        return []
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return []
    docs = doc if isinstance(doc, list) else [doc]
    return [{**stop, "engine": d.get("engine")} for d in docs if isinstance(d, Mapping)
            for stop in d.get("stops") or [] if isinstance(stop, Mapping)]


def cell_map(records_dirs: Iterable[Path], plan: Path | None = None,
             given: Mapping[str, CellInfo] | None = None) -> dict[str, CellInfo]:
    """Every known cell: the announced ones win over the plan's, the plan's over ``given``."""
    out = dict(given or {})
    if plan is not None:
        out.update(plan_cells(plan))
    out.update(read_announced(records_dirs))
    return out
