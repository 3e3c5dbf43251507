"""The scenario label: bounded to the configured names, with the active round per engine."""

from __future__ import annotations

import time
from dataclasses import dataclass

from exporter.proxy.metrics import ProxyMetrics
from exporter.core.timefmt import iso
from exporter.proxy.records import JsonlWriter

__all__ = ["ScenarioBoard", "Active", "MAX_ROUND"]

MAX_ROUND = 1_000_000


@dataclass(frozen=True, slots=True)
class Active:
    scenario: str
    round: int


class ScenarioBoard:
    """Resolves a request's scenario label and tracks the scenario set by ``POST /-/scenario``.

    A name outside the configured list becomes ``other`` so that a flood of names adds
    at most one label value; no scenario is ``none``.
    """

    def __init__(self, names: list[str], engines: list[str], metrics: ProxyMetrics, log: JsonlWriter) -> None:
        self._names = frozenset(names)
        self._engines = list(engines)
        self._active: dict[str, Active] = {}
        self._metrics = metrics
        self._log = log

    def label(self, name: str | None) -> str:
        if name is None:
            return "none"
        return name if name in self._names else "other"

    def active(self, engine: str) -> Active | None:
        return self._active.get(engine)

    def resolve(self, engine: str, header: str | None) -> tuple[str, int | None]:
        """The (scenario label, round) for a request: the header wins over the active one."""
        act = self._active.get(engine)
        if header is not None:
            label = self.label(header)
            return label, act.round if act is not None and act.scenario == label else None
        if act is not None:
            return act.scenario, act.round
        return "none", None

    def set(self, scenario: str | None, round_: int, engine: str | None = None) -> list[str]:
        """Activate (or with None clear) a scenario round for one engine or all of them."""
        engines = [engine] if engine is not None else self._engines
        label = None if scenario is None else self.label(scenario)
        for e in engines:
            old = self._active.pop(e, None)
            if old is not None:
                self._metrics.scenario_info.remove(e, old.scenario, str(old.round))
            if label is not None:
                self._active[e] = Active(label, round_)
                self._metrics.scenario_info.labels(e, label, str(round_)).set(1)
        now = time.time()
        self._log.write({
            "time": iso(now, ms=True),
            "unix": round(now, 3),
            "engines": engines,
            "scenario": label,
            "requested": scenario,
            "round": round_ if label is not None else None,
        })
        return engines
