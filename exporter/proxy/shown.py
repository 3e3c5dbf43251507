"""Which series ``/metrics`` shows: a scenario's series once it is used, not from start-up.

Every series of a configured engine and scenario is made at zero at start-up
(:meth:`~exporter.proxy.metrics.ProxyMetrics.initialise`) and counts in the process from then on;
``/metrics`` leaves off the counters and histograms of an (engine, scenario) pair that has counted
nothing yet and that no active round names.  With 2 engines x 10 scenarios configured that keeps a
proxy's page, once its first minute is over, at about a tenth of its whole size (73 KB of 704 KB).

A pair is shown from the first of:

* a round announced for it (``POST /-/scenario``).  Before the round is set, the pair is shown
  and the announcement waits until every scraper that scrapes at an interval, seen in the last
  minute, has read its zeros (:meth:`~exporter.proxy.drain.ScrapeLog.wait_scraped`, at most
  :data:`ANNOUNCE_WAIT_S`), so that each scraper holds a sample of them before the round's first
  request: windowed rates and exact counts see the whole round, however short, and the round's
  announced span (its start time) begins after the wait;
* the first count of a request labelled with it (``X-Bench-Scenario`` without an announced round,
  or a restart whose snapshot holds counts).  The series then appear with that count: an exact
  count (:func:`dashboards.promql.exact_count`) takes a series first seen inside its window as
  started at zero and counts it whole; a rate misses what came before the series' first scrape.

For its first :data:`SHOW_ALL_S` seconds, and until a scrape of it was answered whole, a proxy
shows every series, at zero where nothing counted:
each scraper then holds a zero sample of every pair after a start, which is how an exact count sees
a restart that lost the counts (a series below its last sample before the restart), and how a
round announced before a new scraper's second scrape still starts from a zero sample.

Scenario ``none`` is always shown, and a pair once used, announced or asked for stays shown for the
life of the process, so a series never goes stale between two rounds.  Only families of type
counter or histogram whose samples carry both ``engine`` and ``scenario`` are filtered: gauges
(the round times, the scenario info) have their own bounds.  The values themselves are untouched:
the snapshot a restart continues from, and every later count, include what was left off.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import web
from prometheus_client.metrics_core import Metric

from .drain import ScrapeLog
from .merge import MergedFamily

__all__ = ["ShownSeries", "ANNOUNCE_WAIT_S", "SHOW_ALL_S", "Pair", "read_by_scrapers", "shown_handler"]

Pair = tuple[str, str]
#: the longest an announcement waits for the scrapers to read a newly shown pair's zeros
ANNOUNCE_WAIT_S = 20.0
#: a proxy shows every series for this long after it starts (a scraper's zero samples after a restart)
SHOW_ALL_S = 60.0
_FILTERED = frozenset({"counter", "histogram"})
_COUNTS = ("_total", "_count")  # monotone samples: one above zero means the pair has counted something
_ALWAYS = "none"


def _pair(labels: dict[str, str]) -> Pair | None:
    engine, scenario = labels.get("engine"), labels.get("scenario")
    return None if engine is None or scenario is None else (engine, scenario)


class ShownSeries:
    """A collector that yields ``inner``'s families with the series of unused pairs left off.

    ``active``: the (engine, scenario) pairs of the rounds active now; ``scraped``: whether a scrape
    was answered whole since the start (until then, and for :data:`SHOW_ALL_S`, every series is
    shown).  :attr:`shown` is the set of pairs the last answer showed (the announcement's wait asks
    it)."""

    def __init__(self, inner: Any, active: Callable[[], Iterable[Pair]], scraped: Callable[[], bool],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._inner = inner
        self._active = active
        self._scraped = scraped
        self._clock = clock
        #: until then (on ``clock``), and until a scrape was answered whole, every series is shown
        self.all_until = clock() + SHOW_ALL_S
        self.used: set[Pair] = set()
        self.requested: set[Pair] = set()  # by an announcement, before its round is set
        self.shown: frozenset[Pair] = frozenset()
        self._lock = threading.Lock()  # renders run in threads; two scrapes may overlap
        #: per family name: (the family it was made from, the shown pairs, what it gave)
        self._last: dict[str, tuple[Any, frozenset[Pair], Any]] = {}

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> list[Any]:
        return self.filter(self._inner.collect())

    def filter(self, families: Iterable[Any]) -> list[Any]:
        families = list(families)
        with self._lock:
            for family in families:
                if family.type in _FILTERED:
                    self._note_used(family)
            self.requested.update(self._active())  # a round's pairs stay shown after it ends
            show = frozenset(self.used.union(self.requested))
            self.shown = show
            if self._all():
                return families
            return [self._shown(family, show) for family in families]

    def _all(self) -> bool:
        return self._clock() < self.all_until or not self._scraped()

    def request(self, pairs: Iterable[Pair]) -> None:
        """Show ``pairs`` from the next answer on (an announcement about to set their round)."""
        with self._lock:
            self.requested.update(pairs)

    def is_shown(self, pair: Pair) -> bool:
        """Whether ``pair``'s series are on the answers now (scenario ``none``'s always are)."""
        return pair[1] == _ALWAYS or pair in self.shown or self._all()

    def _note_used(self, family: Any) -> None:
        used = self.used
        for sample in family.samples:
            if sample.value > 0 and sample.name.endswith(_COUNTS):
                pair = _pair(sample.labels)
                if pair is not None and pair not in used:
                    used.add(pair)

    def _shown(self, family: Any, show: frozenset[Pair]) -> Any:
        if family.type not in _FILTERED:
            return family
        last = self._last.get(family.name)
        if last is not None and last[0] is family and last[1] == show:
            return last[2]  # the same object: its encoded bytes are kept (exposition)

        def keep(labels: dict[str, str]) -> bool:
            pair = _pair(labels)
            return pair is None or pair[1] == _ALWAYS or pair in show

        out: Any
        series = getattr(family, "series", None)
        if series is not None:
            kept = [(key, one) for key, one in series if not one.samples or keep(one.samples[0].labels)]
            out = MergedFamily(family.name, family.documentation, family.type, family.unit)
            out.series = kept
            out.samples = [s for _, one in kept for s in one.samples]
        else:
            out = Metric(family.name, family.documentation, family.type, family.unit)
            out.samples = [s for s in family.samples if keep(s.labels)]
        self._last[family.name] = (family, show, out)
        return out


async def read_by_scrapers(shown: ShownSeries, scrapes: ScrapeLog, pairs: Iterable[Pair],
                           timeout_s: float = ANNOUNCE_WAIT_S) -> tuple[float, bool]:
    """(seconds waited, whether every scraper read them): where the last answer did not show one of
    ``pairs``, show them and wait until every scraper that :meth:`ScrapeLog.unread` names has made a
    complete scrape that began from now on.  No wait where all were shown or no scraper is owed."""
    pairs = list(pairs)
    if all(shown.is_shown(p) for p in pairs):
        return 0.0, True
    shown.request(pairs)
    began = scrapes.clock()
    read = await scrapes.wait_scraped(began, timeout_s)
    return scrapes.clock() - began, read


def shown_handler(shown: ShownSeries, scrapes: ScrapeLog) -> Callable[[web.Request], Any]:
    """``POST /-/shown`` on the supervisor's socket, ``{"pairs": [[engine, scenario], ...]}``: a worker's
    announcement waits here, where every scrape is rendered, for :func:`read_by_scrapers`."""

    async def handler(request: web.Request) -> web.Response:
        try:
            pairs = [(str(e), str(s)) for e, s in (await request.json())["pairs"]]
        except (ValueError, KeyError, TypeError):
            return web.Response(status=400, text='{"pairs": [[engine, scenario], ...]} expected\n')
        waited, read = await read_by_scrapers(shown, scrapes, pairs)
        return web.json_response({"waited_s": waited, "read": read})
    return handler
