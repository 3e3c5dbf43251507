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
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Gauge

from exporter.core.timefmt import iso
from exporter.proxy.metrics import ProxyMetrics
from exporter.proxy.records import JsonlWriter

__all__ = ["ScenarioBoard", "Active", "Announced", "RoundTimes", "UNWARNED", "MAX_ROUND", "MAX_NAME", "MAX_ROUNDS",
           "CLEAR", "START_NAME", "START_HELP", "END_NAME", "END_HELP"]

MAX_ROUND = 1_000_000
#: the longest scenario name accepted (as the config's ``scenarios`` entries)
MAX_NAME = 128
#: rounds whose start/end timestamp series are kept
MAX_ROUNDS = 256
#: ``POST /-/scenario`` names that clear the active scenario, as ``null`` does
CLEAR = frozenset({"none"})
#: scenarios announced again and again by design (the load driver's warm-ups): never warned of
UNWARNED = frozenset({"warmup"})

_ROUND_LABELS = ("engine", "scenario", "round")

log = logging.getLogger("llmbench.proxy")


def _multiprocess() -> bool:
    return "PROMETHEUS_MULTIPROC_DIR" in os.environ or "prometheus_multiproc_dir" in os.environ


@dataclass(frozen=True, slots=True)
class Active:
    scenario: str
    round: int


@dataclass(frozen=True, slots=True)
class Announced:
    """What ``POST /-/scenario`` did: the engines it set, those whose round changed (set again
    unchanged, a round goes on), and a warning for a round announced before in this run."""
    engines: list[str]
    changed: list[str]
    warning: str | None = None
    #: engines left as they were: a later announcement came for them while this one waited
    superseded: list[str] = field(default_factory=list)


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

    def previous(self, engine: str, act: Active) -> tuple[float | None, float | None] | None:
        """(start, end) of ``engine``'s ``act`` among the kept rounds, either None where not known;
        None when it is not among them (O(1))."""
        engines = self._rounds.get((act.scenario, str(act.round)))
        times = None if engines is None else engines.get(engine)
        return None if times is None else (times[0], times[1])

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
        #: per engine, the ticket of the latest announcement that came for it (:meth:`ticket`)
        self.tickets: dict[str, int] = {}
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

    def actives(self) -> dict[str, Active]:
        """Every engine's announced round now (a copy)."""
        return dict(self._active)

    def restore(self, active: dict[str, Active]) -> None:
        """Take the announced rounds as the shared state holds them (:mod:`exporter.proxy.shared`)."""
        self._active = dict(active)

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
        return self.announce(scenario, round_, engine).engines

    def targets(self, engine: str | None) -> list[str]:
        """The engines an announcement for ``engine`` is for (None: every one)."""
        return [engine] if engine is not None else list(self._engines)

    def ticket(self, engine: str | None = None) -> int:
        """A place in line for an announcement that may wait before it is set: the latest one that
        came for an engine is the one whose round that engine gets (:meth:`announce`'s ``ticket``)."""
        number = max(self.tickets.values(), default=0) + 1
        for e in self.targets(engine):
            self.tickets[e] = number
        return number

    def announce(self, scenario: str | None, round_: int, engine: str | None = None,
                 ticket: int | None = None) -> Announced:
        """:meth:`set`, saying which engines' round changed and warning (one log line, and
        :attr:`Announced.warning`) when an engine's round was announced before in this run and
        cleared or replaced since: the evidence reports its records as a separate announcement.
        Set again unchanged, a round goes on (its start stays).  Only the kept rounds
        (:data:`MAX_ROUNDS`) are remembered; ``warmup`` and clearing never warn (round 0 does).
        With ``ticket``, only the engines for which no later announcement came are set (the others'
        are in :attr:`Announced.superseded`)."""
        if scenario in CLEAR:
            scenario = None
        engines = self.targets(engine)
        superseded = [e for e in engines if ticket is not None and self.tickets.get(e, ticket) != ticket]
        engines = [e for e in engines if e not in superseded]
        if not engines:
            return Announced([], [], None, superseded)
        label = None if scenario is None else self.label(scenario)
        now = time.time()
        changed: list[str] = []
        before: list[tuple[str, float | None]] = []
        for e in engines:
            act = None if label is None else Active(label, round_)
            old = self._active.get(e)
            if act is not None and act == old:
                continue  # announced again unchanged: the same round goes on
            changed.append(e)
            if old is not None:
                del self._active[e]
                self._metrics.scenario_info.remove(e, old.scenario, str(old.round))
                self.rounds.ended(e, old, now)
            if act is not None:
                if act.scenario not in UNWARNED:  # round 0 too: evidence splits it as it splits any round
                    seen = self.rounds.previous(e, act)
                    if seen is not None:
                        before.append((e, seen[0]))
                self._active[e] = act
                self._metrics.scenario_info.labels(e, act.scenario, str(round_)).set(1)
                self.rounds.started(e, act, now)
        warning = None if label is None or not before else self._repeat_warning(label, round_, before)
        if warning is not None:
            log.warning("POST /-/scenario: %s", warning)
        self._log.write({
            "run_id": self.run_id,
            "time": iso(now, ms=True),
            "unix": round(now, 3),
            "engines": engines,
            "scenario": label,
            "requested": None if scenario is None else scenario[:MAX_NAME],
            "round": round_ if label is not None else None,
        })
        return Announced(list(engines), changed, warning, superseded)

    def note_cell(self, label: str, round_: int, engines: list[str], cell: dict[str, Any]) -> None:
        """One ``scenarios.jsonl`` line with the announced round's cell parameters (its
        input and output tokens, concurrency or rate, stage), checked by the caller.  Its engines are
        under ``for_engines``, so that readers of the announcements' spans pass over it."""
        now = time.time()
        self._log.write({"event": "cell", "run_id": self.run_id, "time": iso(now, ms=True), "unix": round(now, 3),
                         "for_engines": list(engines), "scenario": label, "round": round_, "cell": dict(cell)})

    def _repeat_warning(self, label: str, round_: int, before: list[tuple[str, float | None]]) -> str:
        when = ", ".join(f"{e} at {'an earlier time' if t is None else iso(t)}" for e, t in before)
        return (f"{label}#{round_} was announced before in this run ({self.run_id or 'this serve start'}): "
                f"{when}, then cleared or replaced; its records from now on will be reported as a separate "
                f"announcement (evidence summarize shows it as a round of its own, evidence export --window "
                f"scenario:{label}#{round_} refuses the round): announce a new round number for a new round")
