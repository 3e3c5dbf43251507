"""A graceful stop that loses no count: SIGTERM, drain, the last scrapes, exit 0.

On SIGTERM ``serve`` fails ``/-/ready`` at once and refuses new engine requests with 503 and
``Connection: close`` (counted in ``llmbench_requests_refused_total{engine, reason="draining"}``,
not in ``llmbench_requests_total``); requests in flight get ``drain_timeout_s`` to finish (those
left are ended and recorded as the proxy's doing).  Then ``/metrics`` keeps answering until the
counts of every finished request have been read: two complete scrapes, begun after the last
request finished, by each scraper seen in the last minute (a scrape that timed out on the
scraper's side looks served from here: hence two), at most ``drain_scrape_timeout_s``.

Under ``serve`` the supervisor runs this: it signals the workers, each drains its own requests
and says so on the supervisor's socket (``POST /-/drained``), and the supervisor, which renders
every scrape, waits for the scrapes before it tells the workers to exit (SIGUSR1).  A scraper is
told apart by its address and its User-Agent (a worker forwards them in :data:`SCRAPER_HEADER`).
Nothing here polls: each complete scrape wakes the waiter, and so does the moment the oldest
scraper still owed a scrape leaves the last minute.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web

__all__ = ["SCRAPER_HEADER", "SEEN_S", "READS", "OVERDUE_S", "ScrapeLog", "scraper_of", "tracked", "Drained", "drained_handler",
           "refuse", "stop_gracefully", "drain_workers"]

log = logging.getLogger("llmbench")
#: how much longer than ``drain_timeout_s`` the supervisor waits for a worker's word (it ends its own drain)
WORKER_MARGIN_S = 10.0

#: the scraper (its address and User-Agent) of a scrape a worker forwards to the supervisor
SCRAPER_HEADER = "X-Llmbench-Scraper"
#: scrapers seen this long before now are waited for
SEEN_S = 60.0
#: complete scrapes each of them must make after the last request finished
READS = 2
#: a scraper whose next scrape is this late (past its last interval) is no longer waited for by an announcement
OVERDUE_S = 2.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def scraper_of(request: web.Request) -> str:
    """Who scrapes: the forwarded scraper (from a worker), else the peer's address and User-Agent."""
    return request.headers.get(SCRAPER_HEADER) or f"{request.remote or '?'} {request.headers.get('User-Agent', '')}"


class ScrapeLog:
    """Complete scrapes of /metrics by scraper: when each was last seen, and how many complete scrapes
    each made that began after :meth:`final` (all on ``clock``, monotonic)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.seen: dict[str, float] = {}
        self.reads: dict[str, int] = {}
        #: per scraper, when its latest complete scrape began, and the time between its last two
        self.began: dict[str, float] = {}
        self.interval: dict[str, float] = {}
        self.since: float | None = None
        self._wakes: set[asyncio.Event] = set()

    def completed(self, scraper: str, began: float) -> None:
        """A scrape by ``scraper`` that began at ``began`` was written out whole."""
        now = self.clock()
        if scraper in self.seen:
            self.interval[scraper] = now - self.seen[scraper]
        self.seen[scraper] = now
        self.began[scraper] = max(began, self.began.get(scraper, began))
        if self.since is not None and began >= self.since:
            self.reads[scraper] = self.reads.get(scraper, 0) + 1
        for wake in self._wakes:
            wake.set()

    def answered(self) -> bool:
        """Whether a scrape was written out whole yet."""
        return bool(self.seen)

    def final(self, at: float | None = None) -> None:
        """The counts are final from ``at`` (default now): scrapes that begin later read them."""
        self.since = self.clock() if at is None else at
        self.reads = {}

    def owed(self, now: float) -> dict[str, float]:
        """Scrapers seen in the last minute that have not yet read the final counts :data:`READS` times, each
        with the time it leaves the last minute."""
        return {s: t + SEEN_S for s, t in self.seen.items() if t + SEEN_S > now and self.reads.get(s, 0) < READS}

    async def wait_read(self, timeout_s: float) -> bool:
        """Wait until every scraper seen in the last minute has read the final counts (:meth:`final` first);
        False when ``timeout_s`` ran out first."""
        assert self.since is not None, "final() first"
        return await self._wait(self.owed, timeout_s)

    def unread(self, after: float, now: float) -> dict[str, float]:
        """Scrapers that scrape at an interval (two complete scrapes or more), were seen in the last
        minute and whose latest complete scrape began before ``after``, each with the time it is no
        longer waited for: its next scrape :data:`OVERDUE_S` past due, or its leaving the last minute."""
        owed = {}
        for s, t in self.seen.items():
            interval = self.interval.get(s)
            if interval is None or self.began[s] >= after:
                continue
            until = min(t + SEEN_S, t + interval + OVERDUE_S)
            if until > now:
                owed[s] = until
        return owed

    async def wait_scraped(self, after: float, timeout_s: float) -> bool:
        """Wait until every scraper that :meth:`unread` names has made a complete scrape that began at or
        after ``after`` (on :attr:`clock`); True when each did.  A one-off reader (a ``curl``) is not
        waited for.  False, at once, where a scraper's next scrape is due after ``timeout_s`` (it is not
        waited for), and when one fell overdue or the time ran out before it read.  Waiters do not
        disturb each other, nor the drain's."""
        now = self.clock()
        owed = self.unread(after, now)
        due = {s: self.seen[s] + self.interval[s] for s in owed}
        if any(at > now + timeout_s for at in due.values()):
            return False
        await self._wait(lambda t: self.unread(after, t), timeout_s)
        return all(self.began[s] >= after for s in owed)

    async def _wait(self, owing: Callable[[float], dict[str, float]], timeout_s: float) -> bool:
        deadline = self.clock() + timeout_s
        wake = asyncio.Event()
        self._wakes.add(wake)
        try:
            while True:
                now = self.clock()
                owed = owing(now)
                if not owed:
                    return True
                if now >= deadline:
                    return False
                wake.clear()
                try:  # woken by a complete scrape, or when the first owed scraper ages out
                    await asyncio.wait_for(wake.wait(), min(deadline, min(owed.values())) - now)
                except TimeoutError:
                    pass
        finally:
            self._wakes.discard(wake)


def tracked(handler: Handler, scrapes: ScrapeLog) -> Handler:
    """``handler`` (a /metrics handler) with each complete scrape entered in ``scrapes``: its answer is
    written out here, and entered once written.  A read of some names only (``name[]``) showed not
    every series: it is answered, and not entered."""

    async def scrape(request: web.Request) -> web.StreamResponse:
        began = scrapes.clock()
        resp = await handler(request)
        try:
            await resp.prepare(request)
            await resp.write_eof()
        except ConnectionResetError:  # the scraper left before it had the whole answer: not a complete scrape
            return resp
        if resp.status == 200 and "name[]" not in request.query:
            scrapes.completed(scraper_of(request), began)
        return resp

    return scrape


class Drained:
    """The supervisor's view of its workers' drains: each worker says when its requests are all finished
    (or it died); :attr:`done` is set once every one has."""

    def __init__(self, workers: Iterable[int]) -> None:
        self.pending = set(workers)
        self.done = asyncio.Event()
        if not self.pending:
            self.done.set()

    def drained(self, index: int) -> None:
        self.pending.discard(index)
        if not self.pending:
            self.done.set()


def drained_handler(drained: Drained) -> Handler:
    """``POST /-/drained?worker=I`` on the supervisor's socket: worker ``I`` has no request left."""

    async def handler(request: web.Request) -> web.Response:
        try:
            drained.drained(int(request.query["worker"]))
        except (KeyError, ValueError):
            return web.Response(status=400, text="worker=INDEX expected\n")
        return web.Response(text="ok\n")

    return handler


def refuse(metrics: Any, engine: str) -> web.Response:
    """A new engine request while draining: 503, ``Connection: close``, counted as refused."""
    metrics.refused.labels(engine, "draining").inc()
    resp = web.json_response({"error": {"message": "the proxy is shutting down (draining): retry on another",
                                        "type": "unavailable", "code": 503}}, status=503)
    resp.force_close()
    return resp


async def stop_gracefully(state: Any) -> bool:
    """The drain of a proxy that renders its own /metrics (an app made by ``create_app`` alone): its
    requests finished (:meth:`ProxyState.drain_requests`), then its scrapers' last reads; True when every
    scraper seen in the last minute read the final counts within ``drain_scrape_timeout_s``."""
    await state.drain_requests()
    scrapes: ScrapeLog = state.scrapes
    scrapes.final()
    return await scrapes.wait_read(state.config.drain_scrape_timeout_s)


async def drain_workers(config: Any, children: Any, scrapes: ScrapeLog, drained: Drained, stop: asyncio.Event) -> None:
    """The supervisor's graceful stop: SIGTERM to the workers, their drains, the scrapers' last reads, then
    ``stop`` (the workers are told to exit after it)."""
    begun = time.monotonic()
    log.info("stopping: ready fails, new requests are refused, requests in flight may finish")
    children.send(signal.SIGTERM)
    try:
        await asyncio.wait_for(drained.done.wait(), config.drain_timeout_s + WORKER_MARGIN_S)
    except TimeoutError:
        log.warning("workers %s did not finish draining within %.0f s", sorted(drained.pending),
                    config.drain_timeout_s + WORKER_MARGIN_S)
    scrapes.final()
    finished = time.monotonic()
    if await scrapes.wait_read(config.drain_scrape_timeout_s):
        log.info("drained in %.2f s; the final counts were read by every scraper in %.2f s", finished - begun,
                 time.monotonic() - finished)
    else:
        log.warning("drained in %.2f s; scrapers %s had not read the final counts twice within %.0f s "
                    "(drain_scrape_timeout_s)", finished - begun, sorted(scrapes.owed(time.monotonic())),
                    config.drain_scrape_timeout_s)
    stop.set()
