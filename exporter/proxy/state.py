"""What the proxy's handlers share: config, metrics, record writers, scenarios, the client session."""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry
from yarl import URL

from .config import Config
from .metrics import ProxyMetrics
from .records import JsonlWriter
from .scenarios import ScenarioBoard

__all__ = ["ProxyState", "MEASURED", "Observer", "CONFIG", "STATE"]

MEASURED = {"completions": "v1/completions", "chat": "v1/chat/completions"}


class Observer:
    """Something else that sees every finished request (e.g. the OTLP exporter).

    ``observe`` runs on the event loop once per request: keep it to a few microseconds."""

    def observe(self, record: dict[str, Any]) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        pass


class ProxyState:
    """Everything the handlers share; built at start-up, closed at shutdown."""

    def __init__(self, config: Config, registry: CollectorRegistry) -> None:
        self.config = config
        self.registry = registry
        self.metrics = ProxyMetrics(registry, config)
        records = config.records_dir
        records.mkdir(parents=True, exist_ok=True)
        self.requests_log = JsonlWriter(records / "requests.jsonl")
        self.scenario_log = JsonlWriter(records / "scenarios.jsonl")
        self.captures_dir = records / "captures"
        self.scenarios = ScenarioBoard(
            config.scenarios, [e.name for e in config.engines], self.metrics, self.scenario_log
        )
        self.session: aiohttp.ClientSession | None = None
        # upstream URLs parsed once, not per request
        self.urls = {(e.name, p): URL(f"{e.base_url}/{p}") for e in config.engines for p in MEASURED.values()}
        self.in_flight = 0  # all engines together; the simulated GPUs follow it
        self.observers: list[Observer] = []  # filled at start-up (app.create_app)
        for e in config.engines:
            self.metrics.initialise(e.name, [*config.scenarios, "none", "other"],
                                    timed=frozenset([*config.scenarios, "none"]))

    def close(self) -> None:
        self.requests_log.close()
        for observer in self.observers:
            observer.close()
        self.scenario_log.close()


CONFIG = web.AppKey("config", Config)
STATE = web.AppKey("state", ProxyState)
