"""What the proxy's handlers share: config, metrics, record writers, scenarios, the upstream pool."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry
from yarl import URL

from .config import Config
from .drain import ScrapeLog
from .finish import Finisher, Observer
from .looplag import LoopLag
from .metrics import ProxyMetrics
from .records import JsonlWriter
from .scenarios import ScenarioBoard
from .sessions import SessionTurns
from .shown import Pair, ShownSeries
from .trace import Tracer
from .wire.upstream import Pool

__all__ = ["ProxyState", "MEASURED", "Observer", "CONFIG", "STATE", "METRICS_SESSION", "Worker", "new_run_id", "InFlight"]

MEASURED = {"completions": "v1/completions", "chat": "v1/chat/completions", "responses": "v1/responses",
            "messages": "v1/messages", "embeddings": "v1/embeddings", "rerank": "v1/rerank"}

T = TypeVar("T")


def new_run_id() -> str:
    """A run's id: its UTC start time (sortable) and a short random suffix (unique)."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


class InFlight:
    """The handler tasks of the measured requests in flight; :meth:`wait_empty` returns as the
    last one leaves (an event, not a look every few milliseconds)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._empty = asyncio.Event()
        self._empty.set()

    def add(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        self._empty.clear()

    def discard(self, task: asyncio.Task[Any] | None) -> None:
        if task is not None:
            self._tasks.discard(task)
        if not self._tasks:
            self._empty.set()

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(list(self._tasks))

    async def wait_empty(self, timeout_s: float | None = None) -> bool:
        """True once none is in flight; False when ``timeout_s`` passed first."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._empty.wait()
        except TimeoutError:
            return False
        return True


class Worker:
    """This process's place among ``serve --workers N``: its label (None when it is the only
    one), whether metric values go to prometheus_client's multiprocess files, where the
    supervisor renders /metrics, the shared scenario state, and the run this ``serve`` start is
    (one ``run_id`` for all its workers)."""

    def __init__(self, label: str | None = None, metrics_socket: Path | None = None,
                 shared_scenarios: Any = None, run_id: str | None = None) -> None:
        self.run_id = run_id or new_run_id()
        self.label = label
        self.metrics_socket = metrics_socket
        self.shared_scenarios = shared_scenarios

    @property
    def multiprocess(self) -> bool:
        return self.metrics_socket is not None


class ProxyState:
    """Everything the handlers share; built at start-up, closed at shutdown."""

    def __init__(self, config: Config, registry: CollectorRegistry, worker: Worker | None = None) -> None:
        self.config = config
        self.registry = registry
        self.worker = worker = worker if worker is not None else Worker()
        self.metrics = ProxyMetrics(registry, config, worker=worker.label, multiprocess=worker.multiprocess)
        records = config.records_dir
        records.mkdir(parents=True, exist_ok=True)
        self.requests_log = JsonlWriter(records / "requests.jsonl")
        self.scenario_log = JsonlWriter(records / "scenarios.jsonl")
        self.captures_dir = records / "captures"
        self.scenarios: Any = ScenarioBoard(
            config.scenarios, [e.name for e in config.engines], self.metrics, self.scenario_log, worker.run_id
        )
        if worker.shared_scenarios is not None:  # all workers see one scenario state
            self.scenarios = worker.shared_scenarios.wrap(self.scenarios)
        self.sessions = SessionTurns(config.sessions.idle_s, config.sessions.max)  # records' turn numbers
        self.pool: Pool | None = None  # the proxy's own client to the engines (made at start-up)
        # upstream URLs parsed once, not per request
        self.urls = {(e.name, p): URL(f"{e.base_url}/{p}") for e in config.engines for p in MEASURED.values()}
        self.observers: list[Observer] = []  # filled at start-up (app.create_app)
        self.finisher = Finisher(config, self.metrics, self.requests_log, self.captures_dir, self.observers,
                                 self.spawn)
        self.loop_lag = LoopLag(self.metrics.loop_lag.observe)
        #: tokenizes and hashes each prompt off the loop (config ``trace``; None when off)
        self.tracer = Tracer(config.trace, worker.run_id) if config.trace is not None else None
        self.stopping = False  # set at shutdown: cancellation then is ours, not the client's
        self.draining = False  # SIGTERM: /-/ready fails, new engine requests are refused (:mod:`.drain`)
        self.scrapes = ScrapeLog()  # complete scrapes by scraper, for the drain's last reads
        #: what the in-process /metrics answers (under ``serve`` the supervisor's renderer does this)
        self.shown = ShownSeries(registry, self._active_pairs, self.scrapes.answered)
        self.shutdown_grace_s = 5.0  # requests in flight at shutdown get this long to finish
        self.exchanges = InFlight()  # handler tasks of measured requests
        self._tasks: set[asyncio.Task[Any]] = set()
        for e in config.engines:
            self.metrics.initialise(e.name, [*config.scenarios, "none", "other"],
                                    timed=frozenset([*config.scenarios, "none"]))

    def _active_pairs(self) -> list[Pair]:
        return [(engine, act.scenario) for engine, act in self.scenarios.actives().items()]

    @property
    def in_flight(self) -> int:
        """Measured requests in flight, all engines together (the simulated GPUs follow it)."""
        return len(self.exchanges)

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``coro`` to its end even if the handler that started it is cancelled."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def stop_exchanges(self) -> None:
        """Shutdown: let requests in flight finish within the grace period, then end them
        (each is recorded as ``proxy_error``: the proxy, not the client, cut it)."""
        self.stopping = True
        if not await self.exchanges.wait_empty(self.shutdown_grace_s):
            for task in self.exchanges:
                task.cancel()
            await self.exchanges.wait_empty()

    async def drain_requests(self) -> None:
        """SIGTERM: refuse new engine requests from now, let those in flight finish within ``drain_timeout_s``
        (then end the rest, as at shutdown), and wait for their records: every count is then final."""
        self.draining = True
        self.shutdown_grace_s = self.config.drain_timeout_s
        await self.stop_exchanges()
        await self.drain()

    async def drain(self) -> None:
        """Wait for the records still being finished."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def close(self) -> None:
        if self.tracer is not None:
            self.tracer.close()
        self.requests_log.close()
        for observer in self.observers:
            observer.close()
        self.scenario_log.close()


CONFIG = web.AppKey("config", Config)
STATE = web.AppKey("state", ProxyState)
#: under ``serve``, a worker's client to its supervisor's unix socket
METRICS_SESSION = web.AppKey("metrics_session", aiohttp.ClientSession)
