"""Where the evidence tool evaluates the catalogue's exact counts (:func:`dashboards.catalogue.exact_count`).

Counters are only known at scrapes, so an exact count from Prometheus counts the requests
between two scrapes.  :func:`covering` picks an evaluation time and a range whose count starts
at a scrape at or before a window's start and ends at a scrape at or after its end: every
request of the window is counted, and those between the window's edges and those two scrapes
too.  ``evidence summarize`` uses it for its histogram check, ``evidence export`` for the
exact-count panels of a window shorter than :data:`SHORT_WINDOW_SCRAPES` scrape intervals,
where counting inside the window would count no scrape pair at all (no series) or only a part
of the window.  The records (``evidence summarize --records``) count a window itself.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from dashboards.catalogue import COUNT_STEP

from .promapi import parse_duration
from .windows import Window, iso

__all__ = ["CountSpan", "ExactCounts", "covering", "exact_counts", "is_short", "SHORT_WINDOW_SCRAPES", "RECORDS_HINT"]

RECORDS_HINT = "the records count the window itself, request by request: `evidence summarize --records DIR`"
#: A window shorter than this many scrape intervals gets its exact counts from :func:`covering`.
SHORT_WINDOW_SCRAPES = 2


@dataclass(frozen=True)
class CountSpan:
    """Evaluate ``exact_count(selector, f"{range_s}s")`` at ``at`` to count ``start``..``end`` whole:
    the requests after the last scrape at or before ``baseline`` up to the last one at or before ``at``."""

    start: float
    end: float
    scrape_s: float
    at: float
    range_s: int
    baseline: float

    def describe(self) -> str:
        return (f"evaluated once at {iso(self.at)} (unix {self.at:.0f}) over {self.range_s} s: the requests from "
                f"the last scrape at or before {iso(self.baseline)} to the last scrape at or before {iso(self.at)}, "
                f"at least one scrape interval ({self.scrape_s:g} s) after the window's end")


def covering(start: float, end: float, scrape_s: float) -> CountSpan:
    """The evaluation time and range (whole seconds) of exact counts that include every request
    from ``start`` to ``end``.

    ``at`` is a subquery step of ``COUNT_STEP`` at least ``scrape_s`` after ``end``: a scrape lies
    in ``[end, end + scrape_s]``, and exact_count's last sample is the newest at or before ``at``.
    Its first baseline is the last sample at or before its first step minus ``COUNT_STEP``: with
    the range starting just after a step ``baseline <= start`` (not on one, so Prometheus 2's
    left-closed and Prometheus 3's left-open subqueries agree), that is ``baseline``."""
    if not scrape_s > 0:
        raise ValueError(f"scrape interval must be positive, not {scrape_s!r}")
    step = parse_duration(COUNT_STEP)
    at = math.ceil((end + scrape_s) / step - 1e-9) * step
    baseline = math.floor(start / step + 1e-9) * step
    # one second short: the range starts between two steps.  A COUNT_STEP under 2 s leaves no room: the
    # range starts on a step, and Prometheus 3's baseline is up to one step later than the one stated.
    range_s = round(at - baseline) - (1 if step >= 2 else 0)
    return CountSpan(start, end, scrape_s, float(at), range_s, float(baseline if step >= 2 else baseline - step))


def is_short(window_s: float, scrape_s: float) -> bool:
    """Too short for counts inside the window: below one scrape interval the range holds no
    baseline sample (no series), below two a scrape-to-scrape count can miss most of it."""
    return window_s < SHORT_WINDOW_SCRAPES * scrape_s


@dataclass(frozen=True)
class ExactCounts:
    """How an export evaluates its exact-count panels, and the line ``EVIDENCE.md`` says it in."""

    window_s: float
    scrape_s: float
    span: CountSpan | None  # None: over the window's own grid
    complete: bool = True  # False: the scrape after the window's end had not happened yet

    @property
    def note(self) -> str:
        if self.span is None:
            return (f"over the window (`$__range` = {self.window_s:.3f} s), restart-safe; the last point counts "
                    "the requests between each proxy's last scrape at or before the window's start and its last "
                    "one at or before the window's end: exactly the window's requests when its ends lie on "
                    f"scrapes (else to a scrape interval, {self.scrape_s:g} s); {RECORDS_HINT}")
        text = (f"widened: the window ({self.window_s:.1f} s) is shorter than {SHORT_WINDOW_SCRAPES} scrape "
                f"intervals ({SHORT_WINDOW_SCRAPES} × {self.scrape_s:g} s), so a count inside it would find no pair "
                f"of scrapes or only part of the window. Each exact-count panel is {self.span.describe()}. Requests "
                f"between those scrapes but outside the window are counted too; {RECORDS_HINT}")
        if not self.complete:
            text += (". Incomplete: that later scrape had not happened when this was exported; export again "
                     "a scrape interval later")
        return text

    def manifest(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"widened": self.span is not None, "scrape_s": self.scrape_s, "note": self.note}
        if self.span is not None:
            doc.update(at=self.span.at, range_s=self.span.range_s, baseline=self.span.baseline, complete=self.complete)
        return doc


def exact_counts(window: Window, scrape_s: float, now: float | None = None) -> ExactCounts:
    """Counted inside the window, or, when it is short (:func:`is_short`), from the scrapes
    around it (:func:`covering`)."""
    if not is_short(window.seconds, scrape_s):
        return ExactCounts(window.seconds, scrape_s, None)
    now = time.time() if now is None else now
    return ExactCounts(window.seconds, scrape_s, covering(window.start, window.end, scrape_s),
                       complete=now >= window.end + scrape_s)
