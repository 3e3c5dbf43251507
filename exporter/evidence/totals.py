"""A round's exact figures from the proxies' counters, for an evidence window of one round.

A board's throughput panel is a 1-minute rate: over a round of 8 s it averages the minute before
each point, most of it outside the round, and shows 40 tok/s where the round ran at 1,167.  So an
export whose window is one round (``scenario:NAME#ROUND``) also counts the round itself, per
engine, from the counters (the catalogue's restart-safe :func:`~dashboards.promql.exact_count`,
never ``increase()``'s extrapolation):

``round_totals`` = ``{ENGINE: {"requests", "successes", "output_tokens" (of successful requests),
"output_tokens_per_s" (those tokens over the round's announced span), ...}}``

Counters are only known at scrapes, so each engine's round is counted from the last scrape at or
before its announced start to the first scrape at least one scrape interval after its announced
end (:func:`.counts.covering`): every request of the round is counted, and so is a request of the
same scenario that ended between those scrapes but outside the round (the rounds of one scenario
run back to back).  The records count the round itself: ``evidence summarize --records DIR``.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

from dashboards.catalogue import MIXIN, exact_count
from dashboards.promql import job_selector

from .counts import covering
from .promapi import Prometheus
from .windows import Window, iso

__all__ = ["one_round", "round_totals", "totals_lines", "rate_note", "FIGURES"]

#: the figures of each engine, in the order EVIDENCE.md shows them
FIGURES = ("requests", "successes", "output_tokens", "output_tokens_per_s")
_ROUND = re.compile(r"^scenario:(?P<name>[^#]+)#(?P<round>\d+)$")


def one_round(window: Window) -> tuple[str, str] | None:
    """(scenario, round) of a window that is one whole round (``scenario:NAME#ROUND``), else None."""
    m = _ROUND.match(window.spec)
    return (m.group("name"), m.group("round")) if m else None


def _counts(prom: Prometheus, metric: str, matchers: list[str], at: float, range_s: int) -> dict[str, float]:
    """Per engine, the exact count of a counter's events in ``(at - range_s, at]``."""
    expr = f"sum by ({MIXIN.engine_label}) ({exact_count(metric + '{' + ', '.join(matchers) + '}', f'{range_s}s')})"
    return {s["metric"].get(MIXIN.engine_label, ""): float(s["value"][1]) for s in prom.query(expr, at)}


def _whole(v: float | None) -> int | None:
    return None if v is None or math.isnan(v) else int(round(v))


def round_totals(prom: Prometheus, window: Window, scrape_s: float, job: str | None = None,
                 now: float | None = None) -> dict[str, dict[str, Any]] | None:
    """The round's figures per engine (see the module), or None when the window is not one round.

    Each engine's span is its announced one where the window's source tells engines apart (the
    records' ``scenarios.jsonl``, or the round gauges), else the window's; an engine with no
    counter of that scenario is left out."""
    which = one_round(window)
    if which is None:
        return None
    name, _ = which
    now = time.time() if now is None else now
    spans = list(window.engines) or [("", window.start, window.end)]
    out: dict[str, dict[str, Any]] = {}
    for engine, start, end in spans:
        span = covering(start, end, scrape_s)
        base = [job_selector(job), f'scenario="{name}"'] + ([f'{MIXIN.engine_label}="{engine}"'] if engine else [])
        requests = _counts(prom, "llmbench_requests_total", base, span.at, span.range_s)
        ok = _counts(prom, "llmbench_requests_total", [*base, 'outcome="success"'], span.at, span.range_s)
        tokens = _counts(prom, "llmbench_output_tokens_total", [*base, 'outcome="success"'], span.at, span.range_s)
        for eng in sorted(requests):
            seconds = end - start
            n_tokens = _whole(tokens.get(eng, 0.0))
            out[eng] = {
                "requests": _whole(requests[eng]), "successes": _whole(ok.get(eng, 0.0)), "output_tokens": n_tokens,
                "output_tokens_per_s": n_tokens / seconds if n_tokens is not None and seconds > 0 else None,
                "announced_start": start, "announced_end": end, "announced_s": seconds,
                "counted_from": span.baseline, "counted_to": span.at, "complete": now >= span.at,
            }
    return out


def totals_lines(totals: dict[str, dict[str, Any]], spec: str) -> list[str]:
    """The ``Round totals`` section of EVIDENCE.md."""
    lines = ["## Round totals (exact, from the proxies' counters)", "",
             f"The round `{spec}` counted per engine over its announced span, from the proxies' counters "
             "(restart-safe exact counts, no rate). Counters are known at scrapes only: each engine's count runs "
             "from the last scrape at or before its announced start to the first scrape at least a scrape "
             "interval after its announced end, so a request of the same scenario that ended between those "
             "scrapes but outside the round is counted too; the records count the round itself "
             "(`evidence summarize --records DIR`). Throughput = output tokens of successful requests / the "
             "announced span.", ""]
    if not totals:
        return lines + ["**No counters of this scenario in the window**: nothing to count.", ""]
    lines += ["| engine | requests | successes | output tokens | output tok/s | announced span | counted from | "
              "counted to |", "|---|---|---|---|---|---|---|---|"]
    for engine, t in totals.items():
        rate = t["output_tokens_per_s"]
        lines.append(f"| {engine} | {t['requests']} | {t['successes']} | {t['output_tokens']} | "
                     f"{'-' if rate is None else f'{rate:.1f}'} | {t['announced_s']:.3f} s from "
                     f"{iso(t['announced_start'])} | {iso(t['counted_from'])} | {iso(t['counted_to'])}"
                     f"{'' if t['complete'] else ' (not yet scraped: export again later)'} |")
    return lines + [""]


def rate_note(window_s: float, rate_window_s: float, rate_window: str) -> str | None:
    """What a rate panel says when its rate window is longer than the evidence window."""
    if window_s >= rate_window_s:
        return None
    return (f"Drawn from {rate_window} rates over a {window_s:.1f} s window: each point averages the "
            f"{rate_window} before it, most of it outside the window, so it is not this window's figure "
            "(a short round's throughput shows far below its own); read the round totals, or the records "
            "(`evidence summarize`).")
