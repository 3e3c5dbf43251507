"""The scenario label: bounded to the configured names, with the active round per engine.

Each round also leaves two gauges, so that a round shorter than a scrape
interval can still be found from Prometheus alone:

* ``llmbench_scenario_round_start_timestamp_seconds{engine, scenario, round}``: unix time it was set;
* ``llmbench_scenario_round_end_timestamp_seconds{engine, scenario, round}``: unix time it was
  cleared or replaced (absent while it runs).

Only the last :data:`MAX_ROUNDS` rounds (``(scenario, round)`` pairs) keep their series; older
ones are removed.  Under ``serve`` (any ``--workers``) the rounds travel in the shared
scenario state and the supervisor renders these gauges from it
(:class:`exporter.proxy.shared.ScenarioInfoCollector`): prometheus_client's multiprocess
mode cannot remove a series.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from prometheus_client import Gauge

from exporter.core.timefmt import iso
from exporter.proxy.metrics import ProxyMetrics
from exporter.proxy.records import JsonlWriter

__all__ = ["ScenarioBoard", "Active", "RoundTimes", "MAX_ROUND", "MAX_NAME", "MAX_ROUNDS", "CLEAR",
           "START_NAME", "START_HELP", "END_NAME", "END_HELP"]

MAX_ROUND = 1_000_000
#: the longest scenario name accepted (as the config's ``scenarios`` entries)
MAX_NAME = 128
#: rounds whose start/end timestamp series are kept
MAX_ROUNDS = 256
#: ``POST /-/scenario`` names that clear the active scenario, as ``null`` does
CLEAR = frozenset({"none"})

_ROUND_LABELS = ("engine", "scenario", "round")

log = logging.getLogger("llmbench.proxy")


def _multiprocess() -> bool:
    return "PROMETHEUS_MULTIPROC_DIR" in os.environ or "prometheus_multiproc_dir" in os.environ


@dataclass(frozen=True, slots=True)
class Active:
    scenario: str
    round: int


START_NAME = "llmbench_scenario_round_start_timestamp_seconds"
START_HELP = "Unix time a scenario round was set (last 256 rounds)."
END_NAME = "llmbench_scenario_round_end_timestamp_seconds"
END_HELP = "Unix time a scenario round was cleared or replaced (last 256 rounds)."
#: one kept round as :meth:`RoundTimes.export` gives it: scenario, round, {engine: [start, end or None]}
RoundRow = tuple[str, str, dict[str, list[float | None]]]


class RoundTimes:
    """Start and end times of the last ``limit`` rounds, and their gauges.

    Under ``serve`` (:meth:`share`) the gauges are not this process's: the rounds travel in
    the shared scenario state (:meth:`export`, :meth:`load`) and the supervisor renders them
    from there, so that old rounds go whatever the number of workers."""

    def __init__(self, metrics: ProxyMetrics, limit: int = MAX_ROUNDS) -> None:
        registry = metrics.registry
        self._registry = registry
        self.start: Gauge | None = Gauge(START_NAME, START_HELP, _ROUND_LABELS, registry=registry,
                                         multiprocess_mode="max")
        self.end: Gauge | None = Gauge(END_NAME, END_HELP, _ROUND_LABELS, registry=registry,
                                       multiprocess_mode="max")
        self.limit = limit
        self.removable = not _multiprocess()  # multiprocess mode cannot remove a series
        # (scenario, round) -> {engine: [start, end or None]}, oldest first
        self._rounds: OrderedDict[tuple[str, str], dict[str, list[float | None]]] = OrderedDict()

    def share(self) -> None:
        """From now on keep the times only; the gauges are rendered elsewhere."""
        for gauge in (self.start, self.end):
            if gauge is not None:
                self._registry.unregister(gauge)
        self.start = self.end = None

    def started(self, engine: str, act: Active, now: float) -> None:
        key = (act.scenario, str(act.round))
        engines = self._rounds.pop(key, {})
        self._rounds[key] = engines  # now the most recent
        old = engines.get(engine)
        if old is not None and old[1] is not None and self.end is not None and self.removable:
            self.end.remove(engine, *key)  # a round run again has no end until it ends again
        engines[engine] = [now, None]
        if self.start is not None:
            self.start.labels(engine, *key).set(now)
        self._evict()

    def ended(self, engine: str, act: Active, now: float) -> None:
        key = (act.scenario, str(act.round))
        engines = self._rounds.get(key)
        if engines is None:  # started by another worker of ``serve --workers N``
            engines = self._rounds[key] = {}
            self._evict()
        times = engines.setdefault(engine, [None, None])
        times[1] = now
        if self.end is not None:
            self.end.labels(engine, *key).set(now)

    def _evict(self) -> None:
        while len(self._rounds) > self.limit:
            old, old_engines = self._rounds.popitem(last=False)
            if self.removable and self.start is not None and self.end is not None:
                for e, (_, end) in old_engines.items():
                    self.start.remove(e, *old)  # a no-op where this process never set it
                    if end is not None:
                        self.end.remove(e, *old)

    def export(self) -> list[RoundRow]:
        """The kept rounds, oldest first."""
        return [(scenario, rnd, engines) for (scenario, rnd), engines in self._rounds.items()]

    def load(self, rows: list[Any]) -> None:
        """Replace the kept rounds with ``rows`` (as :meth:`export` gave them)."""
        self._rounds = OrderedDict(((str(sc), str(rnd)), {e: list(t) for e, t in engines.items()})
                                   for sc, rnd, engines in rows[-self.limit:])

    def __len__(self) -> int:
        return len(self._rounds)


class ScenarioBoard:
    """Resolves a request's scenario label and tracks the scenario set by ``POST /-/scenario``.

    A name outside the configured list becomes ``other`` so that a flood of names adds
    at most one label value; no scenario is ``none``.
    """

    def __init__(self, names: list[str], engines: list[str], metrics: ProxyMetrics, log: JsonlWriter,
                 run_id: str = "") -> None:
        self._names = frozenset(names)
        self.names = tuple(names)
        self.run_id = run_id
        self._unknown_logged: set[str] = set()
        self._engines = list(engines)
        self._active: dict[str, Active] = {}
        self._metrics = metrics
        self._log = log
        self.rounds = RoundTimes(metrics)

    def label(self, name: str | None) -> str:
        if name is None:
            return "none"
        if name in self._names:
            return name
        self._note_unknown(name)
        return "other"

    def _note_unknown(self, name: str) -> None:
        """Say once per name (the first 1000 names) that it is recorded as ``other``."""
        if name in self._unknown_logged or len(self._unknown_logged) >= 1000:
            return
        self._unknown_logged.add(name)
        log.warning("scenario %r is not in the config's scenarios: its requests are recorded as 'other' "
                    "(add it to scenarios: in the config)", name[:MAX_NAME])

    def active(self, engine: str) -> Active | None:
        return self._active.get(engine)

    def announced(self) -> dict[str, dict[str, Any] | None]:
        """Per configured engine, the scenario and round announced now (``POST /-/scenario``), or None."""
        out: dict[str, dict[str, Any] | None] = {}
        for engine in self._engines:
            act = self._active.get(engine)
            out[engine] = None if act is None else {"scenario": act.scenario, "round": act.round}
        return out

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
        """Activate (or with None or ``"none"`` clear) a scenario round for one engine or all of them."""
        if scenario in CLEAR:
            scenario = None
        engines = [engine] if engine is not None else self._engines
        label = None if scenario is None else self.label(scenario)
        now = time.time()
        for e in engines:
            old = self._active.pop(e, None)
            if old is not None:
                self._metrics.scenario_info.remove(e, old.scenario, str(old.round))
                self.rounds.ended(e, old, now)
            if label is not None:
                self._active[e] = act = Active(label, round_)
                self._metrics.scenario_info.labels(e, label, str(round_)).set(1)
                self.rounds.started(e, act, now)
        self._log.write({
            "run_id": self.run_id,
            "time": iso(now, ms=True),
            "unix": round(now, 3),
            "engines": engines,
            "scenario": label,
            "requested": None if scenario is None else scenario[:MAX_NAME],
            "round": round_ if label is not None else None,
        })
        return engines
