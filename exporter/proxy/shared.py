"""The scenario state that every worker of ``serve --workers N`` sees at once.

``POST /-/scenario`` reaches one worker.  That worker applies it to its own
:class:`~exporter.proxy.scenarios.ScenarioBoard` (which writes ``scenarios.jsonl`` once) and
publishes the result into a small memory-mapped file; every worker checks the file's version
(an 8-byte read, no system call) before it resolves a request's scenario, so the next request
on any worker carries the new label.  The supervisor renders ``llmbench_scenario_info`` and
the round start/end gauges from the same file (:class:`ScenarioInfoCollector`): one info
series per active round, none when cleared, and the last 256 rounds' times, however many
workers there are.

Layout: version (u64; odd while a writer is mid-way), length (u32), JSON
``{"active": {engine: [scenario, round, since_unix]}, "rounds": [[scenario, round,
{engine: [start_unix, end_unix or null]}], ...], "tickets": {engine: number}}`` (rounds oldest
first; tickets: the latest announcement's place in line per engine).  Writers hold ``flock`` on
the file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import mmap
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from .scenarios import END_HELP, END_NAME, START_HELP, START_NAME, Active, Announced

__all__ = ["SharedScenarios", "SharedBoard", "ScenarioInfoCollector"]

_SIZE = 4 << 20  # 256 rounds x dozens of engines, names of up to 128 characters (a sparse file)
_HEAD = struct.Struct("=QI")


class SharedScenarios:
    """A memory-mapped scenario state file shared by the workers and the supervisor."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, _SIZE)
        self._last: tuple[int, dict[str, Any]] = (-1, {})  # (version, state) last parsed by current()

    @classmethod
    def create(cls, path: Path) -> SharedScenarios:
        with open(path, "wb") as f:
            f.truncate(_SIZE)
        return cls(path)

    def version(self) -> int:
        return int(_HEAD.unpack_from(self._map, 0)[0])

    def read(self) -> tuple[int, dict[str, Any]]:
        """(version, state); retried while a writer is mid-way (seqlock)."""
        for _ in range(10_000):
            before, length = _HEAD.unpack_from(self._map, 0)
            if before % 2 == 0:
                payload = bytes(self._map[_HEAD.size:_HEAD.size + length])
                if _HEAD.unpack_from(self._map, 0)[0] == before:
                    return before, json.loads(payload) if length else {}
            time.sleep(0)
        raise RuntimeError(f"{self.path}: scenario state stays mid-write")

    def current(self) -> dict[str, Any]:
        """The state now, parsed once per version: a scrape's readers (the series shown, the round
        gauges) share one parse, and scrapes between two changes none.  Read it, never change it."""
        last = self._last
        if self.version() != last[0]:
            last = self._last = self.read()
        return last[1]

    def active_pairs(self) -> list[tuple[str, str]]:
        """The (engine, scenario) pairs of the rounds active now."""
        return [(engine, str(v[0])) for engine, v in self.current().get("active", {}).items()]

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def write_locked(self, state: dict[str, Any]) -> None:
        """Publish ``state``; the caller holds :meth:`locked`."""
        payload = json.dumps(state, separators=(",", ":")).encode()
        if _HEAD.size + len(payload) > _SIZE:
            raise ValueError("scenario state too large")
        version = self.version()
        _HEAD.pack_into(self._map, 0, version + 1, 0)
        self._map[_HEAD.size:_HEAD.size + len(payload)] = payload
        _HEAD.pack_into(self._map, 0, version + 2, len(payload))

    def wrap(self, board: Any) -> SharedBoard:
        return SharedBoard(board, self)

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)


class SharedBoard:
    """A worker's ScenarioBoard kept in step with the shared state (same interface)."""

    def __init__(self, board: Any, shared: SharedScenarios) -> None:
        self._board = board
        self._shared = shared
        self._seen = -1
        self._since: dict[str, float] = {}
        board.rounds.share()  # the supervisor renders the round gauges from the shared state

    def _pull(self) -> None:
        if self._shared.version() == self._seen:
            return
        self._seen, state = self._shared.read()
        active = state.get("active", {})
        self._board.restore({e: Active(v[0], int(v[1])) for e, v in active.items()})
        self._since = {e: float(v[2]) for e, v in active.items()}
        self._board.rounds.load(state.get("rounds", []))
        self._board.tickets = dict(state.get("tickets", {}))

    def resolve(self, engine: str, header: str | None) -> tuple[str, int | None]:
        self._pull()
        result: tuple[str, int | None] = self._board.resolve(engine, header)
        return result

    def set(self, scenario: str | None, round_: int, engine: str | None = None) -> list[str]:
        return self.announce(scenario, round_, engine).engines

    def ticket(self, engine: str | None = None) -> int:
        """:meth:`ScenarioBoard.ticket` under the lock, in the shared state: the workers' announcements
        take their places in one line."""
        with self._shared.locked():
            self._pull()
            number: int = self._board.ticket(engine)
            self._publish()
        return number

    def announce(self, scenario: str | None, round_: int, engine: str | None = None,
                 ticket: int | None = None) -> Announced:
        """:meth:`ScenarioBoard.announce` under the lock, from and into the shared state: a round
        announced before through any worker of this ``serve`` start is known (the kept rounds
        travel in the state), so the warning does not depend on the worker a POST reaches."""
        with self._shared.locked():
            self._pull()
            done: Announced = self._board.announce(scenario, round_, engine, ticket)
            now = time.time()
            for e in done.changed:
                self._since[e] = now
            self._publish(now)
        return done

    def _publish(self, now: float | None = None) -> None:
        """The board's state into the shared file (the caller holds the lock)."""
        now = time.time() if now is None else now
        active = {e: [a.scenario, a.round, self._since.get(e, now)] for e, a in self._board.actives().items()}
        self._shared.write_locked({"active": active, "rounds": self._board.rounds.export(),
                                   "tickets": self._board.tickets})
        self._seen = self._shared.version()

    def __getattr__(self, name: str) -> Any:
        self._pull()
        return getattr(self._board, name)


class ScenarioInfoCollector:
    """``llmbench_scenario_info`` and the round start/end gauges for the supervisor's
    /metrics, from the shared state."""

    def __init__(self, shared: SharedScenarios) -> None:
        self._shared = shared

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        state = self._shared.current()
        labels = ("engine", "scenario", "round")
        info = GaugeMetricFamily("llmbench_scenario_info", "1 while a scenario round is active.", labels=labels)
        for engine, (scenario, rnd, _since) in sorted(state.get("active", {}).items()):
            info.add_metric([engine, str(scenario), str(rnd)], 1.0)
        yield info
        start = GaugeMetricFamily(START_NAME, START_HELP, labels=labels)
        end = GaugeMetricFamily(END_NAME, END_HELP, labels=labels)
        for scenario, rnd, engines in state.get("rounds", []):
            for engine, (started, ended) in sorted(engines.items()):
                if started is not None:
                    start.add_metric([engine, str(scenario), str(rnd)], float(started))
                if ended is not None:
                    end.add_metric([engine, str(scenario), str(rnd)], float(ended))
        yield start
        yield end
