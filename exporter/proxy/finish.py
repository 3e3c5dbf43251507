"""The end of one measured request, in one place and in one order: the metrics, the capture
(when kept), the record, the observers.

The metrics move first, in the callback in which the request ended, so that a scrape taken
after a request's end counts it: the boards' exact counts equal the records whose request
ended inside a window.  The record follows its capture (which it names by SHA-256).

The exchange hands over a frozen :class:`Measurement` (the core's result plus the request's
identity and timings) and knows nothing of what happens to it; the :class:`Finisher` knows
nothing of the exchange.  A capture is hashed and written in a thread, never on the loop, so
that the record can name its SHA-256; without one everything happens in the caller's callback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from exporter.core.analysis import Result
from exporter.core.slo import slo_result
from exporter.core.timefmt import iso

from .config import Config
from .metrics import ProxyMetrics
from .records import Capture, JsonlWriter, write_capture
from .trace import Traced

__all__ = ["Identity", "Measurement", "Finisher", "Observer", "FailureLog", "CLIENT_BOUND_SHARE"]

log = logging.getLogger("llmbench.proxy")

#: a request is ``client_bound`` when the client held up more than this share of its E2E
CLIENT_BOUND_SHARE = 0.10


class Observer(Protocol):
    """Something else that sees every finished request's record (e.g. the OTLP exporter).

    ``observe`` runs on the event loop once per request: keep it to a few microseconds."""

    def observe(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a request is: the proxy's id, the client's, and the labels it is counted under."""

    id: str
    client_request_id: str | None
    engine: str
    scenario: str
    round: int | None
    route: str
    stream: bool
    model: str | None
    session_id: str | None = None  # X-Session-ID, else X-Correlation-ID (a safe id, else None)
    turn: int | None = None  # 1, 2, ... within the session, in arrival order (exporter.proxy.sessions)

    def fields(self) -> dict[str, Any]:
        """The record's identity fields, in the record's order (``id`` first)."""
        return {"id": self.id, "client_request_id": self.client_request_id, "engine": self.engine,
                "scenario": self.scenario, "round": self.round, "route": self.route, "stream": self.stream,
                "model": self.model, "session_id": self.session_id, "turn": self.turn}


@dataclass(frozen=True, slots=True)
class Measurement:
    """One finished request as the proxy measured it."""

    identity: Identity
    run_id: str
    result: Result
    start_unix: float  # unix seconds at t0, on the stamps' clock
    usage_injected: bool
    timing_uncertainty_s: float  # how late any loop-taken stamp of it can be
    kernel_stamps: bool  # every upstream read was stamped by the kernel
    client_backpressure_s: float  # time the client left upstream bytes untaken
    capture: Capture | None  # the upstream bytes, when kept
    capture_meta: Mapping[str, Any]  # what the capture's .json says beside the reads
    #: the prompt's block hashes, still being computed in the trace thread (config ``trace``; None: off)
    trace: asyncio.Future[Traced] | None = None
    t0_source: str = "loop"  # "kernel": t0 is the request's transmit stamp; "loop": just before its send(2)
    proxy_added_s: float | None = None  # the request's hold before t0 plus the first text's hold

    @property
    def id(self) -> str:
        return self.identity.id

    @property
    def engine(self) -> str:
        return self.identity.engine

    @property
    def scenario(self) -> str:
        return self.identity.scenario

    @property
    def client_bound(self) -> bool:
        e2e = self.result.e2e_s
        return e2e is not None and e2e > 0 and self.client_backpressure_s > CLIENT_BOUND_SHARE * e2e

    def record(self, slo: Any) -> dict[str, Any]:
        """The requests.jsonl line (capture fields still empty), judged against ``slo``."""
        result = self.result
        verdict = slo_result(result.ttft_s, result.tpot_s, slo.ttft_s, slo.tpot_s) \
            if result.ok and not result.pooling else None  # embeddings and rerank: never judged by the SLO
        fields = self.identity.fields()
        return {
            "id": fields.pop("id"),
            "run_id": self.run_id,
            **fields,
            "start": iso(self.start_unix, ms=True),
            "start_unix": round(self.start_unix, 6),
            **result.as_dict(),
            "usage_injected": self.usage_injected,
            "timing_uncertainty_s": round(self.timing_uncertainty_s, 6),
            "stamps": "kernel" if self.kernel_stamps else "loop",
            "t0_source": self.t0_source,
            "proxy_added_s": None if self.proxy_added_s is None else round(self.proxy_added_s, 6),
            "client_backpressure_s": round(self.client_backpressure_s, 6),
            "client_bound": self.client_bound,
            "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
            "slo_result": verdict,
            "capture": None,
            "capture_sha256": None,
        }


class FailureLog:
    """One log line per engine and failure reason every ``every_s`` seconds at most, naming the
    engine and the cause, with how many more there were since the last line."""

    #: reasons that are not the upstream's: the client left, or the proxy logged its own fault
    QUIET = frozenset({None, "client_abort", "proxy_error"})

    def __init__(self, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.clock = clock
        self._last: dict[tuple[str, str], float] = {}
        self._held: dict[tuple[str, str], int] = {}

    def note(self, engine: str, reason: str | None, detail: str | None) -> None:
        if reason in self.QUIET:
            return
        key = (engine, str(reason))
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.every_s:
            self._held[key] = self._held.get(key, 0) + 1
            return
        self._last[key] = now
        more = self._held.pop(key, 0)
        log.warning("engine %s: %s: %s%s", engine, reason, detail or "(no detail)",
                    f" (and {more} more in the last {now - last:.0f} s)" if more and last is not None else "")


class Finisher:
    """Writes, counts and tells of each finished request; one per proxy process."""

    def __init__(self, config: Config, metrics: ProxyMetrics, requests_log: JsonlWriter, captures_dir: Path,
                 observers: Sequence[Observer],
                 spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]]) -> None:
        self.config = config
        self.metrics = metrics
        self.requests_log = requests_log
        self.captures_dir = captures_dir
        self.observers = observers
        self.spawn = spawn
        self.failures = FailureLog()

    def finish(self, m: Measurement) -> asyncio.Task[None] | None:
        """Finish ``m`` now, or, with a capture to write first or its prompt's hashes still being
        computed, in a task (returned); the metrics move now either way."""
        record = m.record(self.config.slo_for(m.scenario))
        self.metrics.observe_request(m.engine, m.scenario, m.result, record["slo_result"],
                                     m.timing_uncertainty_s, m.client_backpressure_s, m.identity.route)
        if m.proxy_added_s is not None:
            self.metrics.child(self.metrics.proxy_added, m.engine, m.scenario).observe(m.proxy_added_s)
        self.failures.note(m.engine, m.result.reason, m.result.detail)
        keep = m.capture is not None and (self.config.capture_raw_sse == "all" or not m.result.ok)
        if not keep and (m.trace is None or m.trace.done()):
            self._after_capture(m, record)
            return None
        return self.spawn(self._with_capture(m, record, keep))

    async def _with_capture(self, m: Measurement, record: dict[str, Any], keep: bool = True) -> None:
        if keep:
            assert m.capture is not None
            try:
                record["capture"], record["capture_sha256"] = await asyncio.get_running_loop().run_in_executor(
                    None, write_capture, self.captures_dir, m.id, m.capture, dict(m.capture_meta))
            except Exception as exc:  # whatever went wrong, the record still goes
                log.error("capture %s not written: %s: %s", m.id, type(exc).__name__, exc)
        if m.trace is not None:
            await asyncio.wait([m.trace])  # never raises
        self._after_capture(m, record)

    def _after_capture(self, m: Measurement, record: dict[str, Any]) -> None:
        if m.trace is not None:
            record.update(_trace_fields(m.trace))
        try:
            self.requests_log.write(record)
        except (OSError, ValueError) as exc:
            log.error("record %s not written: %s", m.id, exc)
        for observer in self.observers:
            try:
                observer.observe(record)
            except Exception:  # an observer's bug must not cost the request
                log.exception("observer %s failed on %s", type(observer).__name__, m.id)


def _trace_fields(done: asyncio.Future[Traced]) -> dict[str, Any]:
    """The record's ``prefix_hashes`` and ``prefix_tokens`` from a finished trace future."""
    if done.cancelled() or done.exception() is not None:  # the proxy shut down under it
        return Traced().fields()
    return done.result().fields()
