"""Benchmark plans: cells, stages and sweeps, read from YAML and validated by pydantic.

A plan file::

    defaults: {warmup: 2, rounds: 3}        # any cell key; each cell may override it
    model: my-model                          # optional; default: the first of /v1/models
    slo: {ttft_s: 3.0, tpot_s: 0.050}        # optional; default: the config's DEFAULT_SLO
    stages:
      - name: core
        stop_after_failed_rounds: 3          # optional
        cells:
          - {scenario: short-c32, input_tokens: 1024, output_tokens: 128, concurrency: 32, requests: 64}
      - name: capacity                       # a sweep: load levels upwards until the SLO breaks
        sweep:
          over: rate                         # rate (req/s) | concurrency
          levels: [0.3, 0.48, 0.66]          # or start, max and one of step / factor
          goodput_target: 0.9                # a level meets the SLO when its goodput ratio >= this
          cell: {scenario: rate, input_tokens: 1024, output_tokens: 128, requests: 200}
      - name: agents                         # session cells: multi-turn chat, the history growing
        cells:
          - {scenario: chat-s8, input_tokens: 256, output_tokens: 64, sessions: 8, turns: 4,
             think_time_s: 1.0, tools: true}  # requests (32) and concurrency (8) follow
      - name: replay                         # a trace cell: a Mooncake trace at its own arrivals
        cells:
          - {scenario: replay, trace: last-week.jsonl, speedup: 2.0, block_size: 512, rounds: 3}

Unknown keys are refused with their path, types are checked strictly (``1k`` is not a
number, ``2.5`` is not a count), and ``nan``/``inf`` are refused.  Every mistake surfaces as
one :class:`PlanError` line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.dataclasses import dataclass

from exporter.proxy.config import Slo

from .replay import TraceFileError, trace_shape

__all__ = ["Cell", "Stage", "Sweep", "Plan", "PlanError", "load_plan", "cell_from_options", "sweep_cells",
           "MAX_SWEEP_LEVELS", "WARMUP", "scenario_names", "session_shape"]

_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
PosInt = Annotated[int, Field(ge=1)]
PosFloat = Annotated[float, Field(gt=0)]
MAX_SWEEP_LEVELS = 64
#: the scenario label of every warm-up request (``evidence summarize`` leaves it out of its tables)
WARMUP = "warmup"


class PlanError(ValueError):
    """A plan that cannot run: one line naming the key path and the reason."""


@dataclass(frozen=True, config=_STRICT)
class Cell:
    """One scenario: a request shape and a load level, run as warm-up then rounds."""

    scenario: Annotated[str, Field(min_length=1, max_length=128)]
    input_tokens: PosInt
    output_tokens: PosInt
    requests: PosInt  # per round
    concurrency: PosInt | None = None
    rate: PosFloat | None = None  # requests per second, Poisson arrivals
    rounds: PosInt = 1
    warmup: Annotated[int, Field(ge=0)] = 0
    chat: bool = False
    #: a session cell (:mod:`exporter.harness.sessions`): this many sessions at once, each of ``turns``
    #: chat turns carrying the whole history; ``requests`` is sessions × turns, ``concurrency`` sessions
    sessions: PosInt | None = None
    turns: PosInt = 1
    think_time_s: Annotated[float, Field(ge=0)] = 0.0  # seconds between an answer and the next turn
    tools: bool = False  # offer a tool; answer each tool call with a tool message
    #: a trace cell (:mod:`exporter.harness.replay`): a Mooncake trace's lines replayed open loop at its
    #: timestamps divided by ``speedup``; ``requests`` is its first lines (default: all), ``input_tokens``
    #: and ``output_tokens`` its longest (the tables' shape); ``block_size``: tokens per hash id
    trace: Annotated[str, Field(min_length=1)] | None = None
    speedup: PosFloat = 1.0
    block_size: PosInt = 512

    @model_validator(mode="after")
    def _one_load_level(self) -> Cell:
        if self.trace is not None:
            if self.concurrency is not None or self.rate is not None or self.sessions is not None:
                raise ValueError("a trace cell replays the trace's own arrivals: leave concurrency, rate and "
                                 "sessions out")
            return self
        if self.speedup != 1.0 or self.block_size != 512:
            raise ValueError("speedup and block_size need trace")
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of concurrency and rate")
        if self.sessions is None:
            if self.turns != 1 or self.think_time_s or self.tools:
                raise ValueError("turns, think_time_s and tools need sessions")
            return self
        if self.rate is not None or self.concurrency != self.sessions or not self.chat:
            raise ValueError("a session cell runs its sessions at once, in chat: leave rate, concurrency and "
                             "chat out (or set concurrency to sessions and chat true)")
        if self.requests != self.sessions * self.turns:
            raise ValueError(f"a session cell sends sessions × turns = {self.sessions * self.turns} requests a "
                             f"round: leave requests out (got {self.requests})")
        return self


@dataclass(frozen=True, config=_STRICT)
class Sweep:
    """A stage that raises the load level until the SLO (or the failed-rounds rule) breaks."""

    over: Literal["rate", "concurrency"]
    goodput_target: Annotated[float, Field(gt=0, le=1)] = 0.9


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    cells: list[Cell]
    stop_after_failed_rounds: int | None = None  # stop after K consecutive rounds with a failure
    sweep: Sweep | None = None  # its cells are the levels, lowest first


@dataclasses.dataclass(frozen=True)
class Plan:
    stages: list[Stage]
    model: str | None = None
    slo: Slo | None = None  # None: the config's DEFAULT_SLO
    source: str = ""  # the plan file, for messages


class _Model(BaseModel):
    model_config = _STRICT


class _SweepFile(_Model):
    over: Literal["rate", "concurrency"]
    levels: list[PosFloat] | None = Field(default=None, min_length=1, max_length=MAX_SWEEP_LEVELS)
    start: PosFloat | None = None
    max: PosFloat | None = None
    step: PosFloat | None = None
    factor: Annotated[float, Field(gt=1)] | None = None
    goodput_target: Annotated[float, Field(gt=0, le=1)] = 0.9
    cell: dict[str, Any]

    @model_validator(mode="after")
    def _levels_given_once(self) -> _SweepFile:
        ranged = self.start is not None and self.max is not None and (self.step is None) != (self.factor is None)
        if (self.levels is None) == (not ranged):
            raise ValueError("give either levels: [...] or start, max and exactly one of step and factor")
        return self


class _StageFile(_Model):
    name: Annotated[str, Field(min_length=1)] | None = None
    stop_after_failed_rounds: PosInt | None = None
    cells: list[dict[str, Any]] | None = Field(default=None, min_length=1)
    sweep: _SweepFile | None = None

    @model_validator(mode="after")
    def _cells_or_sweep(self) -> _StageFile:
        if (self.cells is None) == (self.sweep is None):
            raise ValueError("give exactly one of cells and sweep")
        return self


class _PlanFile(_Model):
    defaults: dict[str, Any] = {}
    model: str | None = None
    slo: Slo | None = None
    stages: list[_StageFile] = Field(min_length=1)


def _describe(exc: ValidationError, prefix: str, from_defaults: Mapping[str, Any] = {},
              own: Mapping[str, Any] = {}) -> str:
    """The first errors of ``exc`` as ``path: reason (got VALUE)``; a key a cell took from
    ``defaults`` is named there."""
    parts = []
    for err in exc.errors()[:3]:
        loc = [str(p) for p in err["loc"]]
        path_prefix = prefix
        if loc and loc[0] in from_defaults and loc[0] not in own:
            path_prefix = "defaults"
        path = ".".join(p for p in (path_prefix, *loc) if p)
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
            msg = "unknown key"
        elif err["type"] in ("missing", "missing_argument"):
            msg = "required key missing"
        elif loc and not isinstance(err["input"], dict):
            msg += f" (got {err['input']!r})"
        parts.append(f"{path}: {msg}" if path else msg)
    more = len(exc.errors()) - 3
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def session_shape(options: Mapping[str, Any]) -> dict[str, Any]:
    """A session cell's options with what ``sessions`` and ``turns`` imply filled in: ``requests``
    (sessions × turns), ``concurrency`` (sessions) and ``chat``; other options as they are."""
    out = dict(options)
    sessions = out.get("sessions")
    if type(sessions) is int and sessions > 0:
        turns = out.get("turns", 1)
        if out.get("requests") is None and type(turns) is int:
            out["requests"] = sessions * turns
        if out.get("concurrency") is None and out.get("rate") is None:
            out["concurrency"] = sessions
        out["chat"] = True
    return out


def _shape(options: Mapping[str, Any]) -> dict[str, Any]:
    """A cell's options with what its sessions or its trace imply filled in (a bad trace: PlanError)."""
    try:
        return trace_shape(session_shape(options))
    except TraceFileError as exc:
        raise PlanError(f"trace: {exc}") from None


def _cell(data: Mapping[str, Any], defaults: Mapping[str, Any], path: str) -> Cell:
    merged = _shape({**defaults, **data})
    try:
        return Cell(**merged)
    except ValidationError as exc:
        raise PlanError(_describe(exc, path, defaults, data)) from None
    except TypeError as exc:  # a key that is not a string
        raise PlanError(f"{path}: {exc}") from None


def sweep_levels(sw: _SweepFile) -> list[float]:
    """The sweep's levels, ascending: the list given, or start..max by step or factor."""
    if sw.levels is not None:
        levels = list(sw.levels)
    else:
        assert sw.start is not None and sw.max is not None
        levels, level = [], sw.start
        while level <= sw.max * (1 + 1e-9) and len(levels) <= MAX_SWEEP_LEVELS:
            levels.append(round(level, 9))
            level = level + sw.step if sw.step is not None else level * (sw.factor or 2)
        if len(levels) > MAX_SWEEP_LEVELS:
            raise ValueError(f"more than {MAX_SWEEP_LEVELS} levels from start to max")
    if any(b <= a for a, b in zip(levels, levels[1:])):
        raise ValueError(f"levels must rise: {levels}")
    if sw.over == "concurrency" and any(v != int(v) for v in levels):
        raise ValueError(f"concurrency levels must be whole numbers: {levels}")
    return levels


def sweep_cells(template: Mapping[str, Any], over: str, levels: list[float],
                defaults: Mapping[str, Any], path: str) -> list[Cell]:
    """One cell per level; scenario ``NAME-cN`` (concurrency) or ``NAME-rR`` (rate)."""
    clash = {"rate", "concurrency"} & set(template)
    if clash:
        raise PlanError(f"{path}.cell: {sorted(clash)[0]}: the sweep sets the level; leave it out")
    inherited = {k: v for k, v in defaults.items() if k not in ("rate", "concurrency")}
    base = template.get("scenario", inherited.get("scenario"))
    cells = []
    for level in levels:
        if over == "concurrency":
            cell = {**template, "concurrency": int(level), "scenario": f"{base}-c{int(level)}"}
        else:
            cell = {**template, "rate": float(level), "scenario": f"{base}-r{level:g}"}
        cells.append(_cell(cell, inherited, f"{path}.cell"))
    return cells


def _stage(st: _StageFile, i: int, defaults: Mapping[str, Any]) -> Stage:
    path = f"stages.{i}"
    name = st.name or f"stage{i}"
    if st.cells is not None:
        cells = [_cell(c, defaults, f"{path}.cells.{j}") for j, c in enumerate(st.cells)]
        return Stage(name, cells, st.stop_after_failed_rounds)
    sw = st.sweep
    assert sw is not None
    try:
        levels = sweep_levels(sw)
    except ValueError as exc:
        raise PlanError(f"{path}.sweep: {exc}") from None
    cells = sweep_cells(sw.cell, sw.over, levels, defaults, f"{path}.sweep")
    return Stage(name, cells, st.stop_after_failed_rounds, Sweep(sw.over, sw.goodput_target))


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise PlanError(f"{path}: is a directory, not a plan file") from None
    except OSError as exc:
        raise PlanError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise PlanError(f"{path}: not a text file") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise PlanError(f"{path}: not valid YAML{at}: {getattr(exc, 'problem', None) or exc}") from None


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file; raises :class:`PlanError` (one line) when it cannot run."""
    path = Path(path)
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise PlanError(f"{path}: expected a mapping with a 'stages' list, got {type(data).__name__}")
    try:
        spec = _PlanFile.model_validate(data)
    except ValidationError as exc:
        raise PlanError(f"{path}: {_describe(exc, '')}") from None
    unknown = sorted(set(spec.defaults) - set(Cell.__dataclass_fields__))
    if unknown:
        raise PlanError(f"{path}: defaults.{unknown[0]}: unknown key")
    try:
        stages = [_stage(st, i, spec.defaults) for i, st in enumerate(spec.stages)]
    except PlanError as exc:
        raise PlanError(f"{path}: {exc}") from None
    return Plan(stages, spec.model, spec.slo, str(path))


def scenario_names(plan: Plan) -> list[str]:
    """Every scenario label the plan's requests carry, in plan order: the cells' names, and
    :data:`WARMUP` when a cell warms up."""
    names = [c.scenario for st in plan.stages for c in st.cells]
    if any(c.warmup for st in plan.stages for c in st.cells):
        names.append(WARMUP)
    return list(dict.fromkeys(names))


def cell_from_options(**options: Any) -> Cell:
    """A cell from command-line options; a bad value names its option."""
    try:
        return Cell(**_shape(options))
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err["loc"]]
        opt = f"--{loc[0].replace('_', '-')}: " if loc else ""
        raise PlanError(f"{opt}{str(err['msg']).removeprefix('Value error, ')}") from None
