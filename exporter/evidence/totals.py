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

The announced span runs from the ``POST /-/scenario`` that set the round to the one that cleared
it, so it holds a bench client's start-up (loading its tokenizer, sampling its dataset) before its
first request and its exit after its last: the announced span's throughput can be a third of what
the client reports.  With ``--records`` each engine also gets the round's figures over its
requests' own span (:data:`RECORDS_FIGURES`), as ``evidence summarize`` computes a round's
throughput (:func:`exporter.core.stats.round_row`: first arrival to last end of the round's records
of that engine, in the window's run), which is the span a bench client's duration measures:

``requests_span_s`` (first arrival to last end), ``requests_first_start`` / ``requests_last_end``
(unix), ``records_requests`` (records of the round, every outcome), ``records_output_tokens`` (of
its successful records), ``output_tokens_per_s_requests`` (those tokens over ``requests_span_s``:
``evidence summarize``'s whole-round ``output_throughput_tok_s``), ``spans_differ`` (the two
spans differ by more than :data:`SPAN_DIFFERS` of the requests' span) and ``counts_differ`` (the
counters' scrape-to-scrape span took in requests the round's records do not hold: a neighbouring
round of the same scenario); all None for an engine with no record of the round.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dashboards.catalogue import MIXIN, Panel, exact_count
from dashboards.promql import job_selector
from exporter.core.stats import round_row
from exporter.proxy.config import DEFAULT_SLO

from .counts import covering
from .evidence_md import panel_kind
from .merge import MergeError, load_records
from .promapi import Prometheus
from .runs import group_rounds
from .windows import Window, iso

__all__ = ["one_round", "round_totals", "totals_lines", "totals_line", "rate_note", "rate_mark", "requests_figures",
           "shortest_span",
           "FIGURES", "RECORDS_FIGURES", "SPAN_DIFFERS", "TOTALS_PANELS"]

#: the figures of each engine, in the order EVIDENCE.md shows them
FIGURES = ("requests", "successes", "output_tokens", "output_tokens_per_s")
#: the figures of each engine from the records (``--records``): the round over its requests' own span
RECORDS_FIGURES = ("requests_span_s", "requests_first_start", "requests_last_end", "records_requests",
                   "records_successes", "records_output_tokens", "output_tokens_per_s_requests", "spans_differ",
                   "counts_differ")
#: the announced span and the requests' span "differ" beyond this share of the requests' span
SPAN_DIFFERS = 0.20
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


def requests_figures(records: Sequence[Mapping[str, Any]], scenario: str, rnd: str,
                     run: str | None) -> dict[str, dict[str, Any]]:
    """Per engine, the round's figures over its requests' own span (:data:`RECORDS_FIGURES` but
    ``spans_differ``), from its records in ``run`` (None: the one run that holds the round, none
    where several do), grouped and computed as ``evidence summarize`` does
    (:func:`.runs.group_rounds`, :func:`exporter.core.stats.round_row`)."""
    groups = {key: recs for key, recs in group_rounds(records).items()
              if key[2] == scenario and str(key[3]) == rnd and (run is None or key[0] == run)}
    if run is None and len({key[0] for key in groups}) > 1:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for (_, engine, _, _), recs in groups.items():
        row = round_row(recs, slo=DEFAULT_SLO)  # summarize's whole-round figures: first arrival to last end
        first = min(float(r["start_unix"]) for r in recs)
        out[engine] = {"requests_span_s": row["duration_s"], "requests_first_start": first,
                       "requests_last_end": first + row["duration_s"], "records_requests": row["requests"],
                       "records_successes": row["success"], "records_output_tokens": row["success_output_tokens"],
                       "output_tokens_per_s_requests": row["output_throughput_tok_s"]}
    return out


def _spans_differ(announced_s: float, requests_s: float | None) -> bool | None:
    if requests_s is None:
        return None
    return abs(announced_s - requests_s) > SPAN_DIFFERS * requests_s


def _records_of(records: Path | None) -> list[dict[str, Any]]:
    """The records of ``records`` (none where it holds no readable ``requests.jsonl``)."""
    if records is None:
        return []
    try:
        return load_records(records)
    except MergeError:
        return []


def round_totals(prom: Prometheus, window: Window, scrape_s: float, job: str | None = None,
                 now: float | None = None, records: Path | None = None) -> dict[str, dict[str, Any]] | None:
    """The round's figures per engine (see the module), or None when the window is not one round.

    Each engine's span is its announced one where the window's source tells engines apart (the
    records' ``scenarios.jsonl``, or the round gauges), else the window's; an engine with no
    counter of that scenario is left out.  ``records``: the records directory, whose requests of
    the round (in the window's run) add :data:`RECORDS_FIGURES`."""
    which = one_round(window)
    if which is None:
        return None
    name, rnd = which
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
    if records is not None:
        by_engine = requests_figures(_records_of(records), name, rnd, window.run)
        for eng, t in out.items():
            fig = by_engine.get(eng) or {}
            t.update({key: fig.get(key) for key in RECORDS_FIGURES})
            t["spans_differ"] = _spans_differ(t["announced_s"], t["requests_span_s"])
            t["counts_differ"] = None if t["records_requests"] is None else t["records_requests"] != t["requests"]
    return out


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def totals_line(engine: str, t: Mapping[str, Any]) -> str:
    """The command's line of one engine's round totals (``evidence export`` prints one per engine).
    Each figure names the span it covers; where the counters' scrape-to-scrape span holds other
    requests than the round's (``counts_differ``), the line gives the round's own figures (the
    records') first and the counters' only as what they counted, with no rate of theirs to mistake
    for the round's."""
    if t.get("counts_differ") and t.get("requests_span_s") is not None:
        return _differing_line(engine, t)
    line = (f"round totals {engine}: {t['successes']}/{t['requests']} successful, {t['output_tokens']} output "
            f"tokens, {_num(t['output_tokens_per_s'], '.1f')} tok/s over the announced {t['announced_s']:.1f} s "
            "(exact, from the counters)")
    if "requests_span_s" not in t:  # no --records
        return line
    if t["requests_span_s"] is None:
        return line + "; no records of it in the round (records)"
    return (line + f"; {_num(t['output_tokens_per_s_requests'], '.1f')} tok/s over its requests' "
            f"{t['requests_span_s']:.1f} s (records, as evidence summarize and a bench client count it)")


def _differing_line(engine: str, t: Mapping[str, Any]) -> str:
    """The line of a round whose counters counted other requests than its records hold."""
    counted_s = float(t["counted_to"]) - float(t["counted_from"])
    return (f"round totals {engine}: the round itself (records, as evidence summarize and a bench client count "
            f"it): {_num(t.get('records_successes'), 'd')}/{t['records_requests']} successful, "
            f"{t['records_output_tokens']} output tokens, {_num(t['output_tokens_per_s_requests'], '.1f')} tok/s "
            f"over its requests' {t['requests_span_s']:.1f} s; the counters, known at scrapes only, counted "
            f"{t['requests']} requests ({t['successes']} successful, {t['output_tokens']} output tokens) over "
            f"{counted_s:.1f} s from {iso(t['counted_from'])} to {iso(t['counted_to'])} (from the counters, "
            f"scrape to scrape: {_count_cause(t)}), not the round's figures")


def _count_cause(t: Mapping[str, Any]) -> str:
    """Why the counters count more or fewer requests than the round's records."""
    if t["requests"] > t["records_requests"]:
        return ("the counters' span took in requests of a neighbouring round, or --records holds fewer proxies' "
                "records than the job")
    return "requests still running at the counters' last scrape" + ("" if t.get("complete") else
                                                                    ", not yet scraped: export again later")


def _why_counts_differ(engine: str, t: Mapping[str, Any]) -> str:
    """One sentence on why an engine's counters and its records count the round differently."""
    if t["requests"] < t["records_requests"]:
        return (f"For {engine} the counters count {t['requests']} requests and the records {t['records_requests']}: "
                "a request is counted when it ends, and some of the round's had not ended by the counters' last "
                "scrape (or it is not yet scraped); the records' figures are the round's own.")
    return (f"For {engine} the counters count {t['requests']} requests and the records {t['records_requests']}: "
            "counters are known at scrapes only, and requests of the same scenario that ended between the round's "
            "end and the next scrape (its next round, run back to back) or before its start are in the counters' "
            "span (and the job may hold more proxies than --records does); the records' figures are the round's "
            f"own ({_num(t.get('output_tokens_per_s_requests'), '.1f')} tok/s over its requests' span), not the "
            f"counters' {_num(t.get('output_tokens_per_s'), '.1f')} tok/s, which divides more requests' tokens by "
            "the round's announced span.")


def _why_spans_differ(engine: str, t: Mapping[str, Any]) -> str:
    """One sentence on why an engine's announced span and its requests' span differ by more than
    :data:`SPAN_DIFFERS`."""
    announced, own = t["announced_s"], t["requests_span_s"]
    if own <= 0:
        return f"For {engine} the round's records span no time (one request, or none with an E2E)."
    if announced > own:
        return (f"For {engine} the announced span ({announced:.1f} s) is {announced / own:.1f} times its requests' "
                f"span ({own:.1f} s): the bench client's start-up (loading its tokenizer, sampling its dataset) "
                "before its first request and its exit after its last lie inside the announcement, so the "
                "announced span's throughput is the lower figure and the requests' span's is the client's.")
    return (f"For {engine} its requests' span ({own:.1f} s) is longer than the announced span ({announced:.1f} s) "
            "by more than 20 %: requests of the round were still running when it was cleared (or started before "
            "it was announced), so the requests' span's throughput is the lower figure.")


def totals_lines(totals: dict[str, dict[str, Any]], spec: str) -> list[str]:
    """The ``Round totals`` section of EVIDENCE.md."""
    with_records = any("requests_span_s" in t for t in totals.values())
    mixed = any(t.get("counts_differ") for t in totals.values())
    lines = ["## Round totals " + ("(from the proxies' counters, scrape to scrape, and the records)" if mixed
                                   else "(exact, from the proxies' counters)"), "",
             f"The round `{spec}` counted per engine over its announced span, from the proxies' counters "
             "(restart-safe exact counts, no rate). Counters are known at scrapes only: each engine's count runs "
             "from the last scrape at or before its announced start to the first scrape at least a scrape "
             "interval after its announced end, so a request of the same scenario that ended between those "
             "scrapes but outside the round is counted too; the records count the round itself "
             "(`evidence summarize --records DIR`). Throughput = output tokens of successful requests / the "
             "announced span.", ""]
    if not totals:
        return lines + ["**No counters of this scenario in the window**: nothing to count.", ""]
    head = ["engine", "requests (counters)", "successes (counters)", "output tokens (counters)",
            "output tok/s over the announced span (counters)", "announced span"]
    head += ["requests' span (records)", "tok/s over the requests' span (records)", "requests (records)"] \
        if with_records else []
    head += ["counted from", "counted to"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for engine, t in totals.items():
        cells = [engine, str(t["requests"]), str(t["successes"]), str(t["output_tokens"]),
                 _num(t["output_tokens_per_s"], ".1f"), f"{t['announced_s']:.3f} s from {iso(t['announced_start'])}"]
        if with_records:
            own = t.get("requests_span_s")
            cells += ["no records" if own is None else f"{own:.3f} s",
                      _num(t.get("output_tokens_per_s_requests"), ".1f"), _num(t.get("records_requests"), "d")]
        cells += [iso(t["counted_from"]),
                  iso(t["counted_to"]) + ("" if t["complete"] else " (not yet scraped: export again later)")]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if not with_records:
        return lines + ["The announced span holds a bench client's start-up and exit; with `--records DIR` the "
                        "export also gives the round's throughput over its requests' own span, the figure a "
                        "bench client and `evidence summarize` report.", ""]
    lines += ["`output tok/s` is over the announced span (from the `POST /-/scenario` that set the round to the one "
              "that cleared it). `tok/s over the requests' span` is the successful output tokens of the round's "
              "records over its requests' own span (first arrival to last end, in the window's run): the figure "
              "`evidence summarize` gives for the whole round, and the one to compare with a bench client's "
              "(`vllm bench serve` divides by its own duration, from its first request to its last answer).", ""]
    why = [_why_spans_differ(engine, t) for engine, t in totals.items() if t.get("spans_differ")]
    why += [_why_counts_differ(engine, t) for engine, t in totals.items() if t.get("counts_differ")]
    return lines + ([" ".join(why), ""] if why else [])


#: The panels whose figure the round totals give (successful output tokens / s; successes / requests):
#: a marked title points there; the others' point at the records (``evidence summarize``).
TOTALS_PANELS = frozenset({"throughput", "success_ratio_1m"})


def shortest_span(window_s: float, totals: Mapping[str, Mapping[str, Any]] | None) -> tuple[float, str]:
    """(seconds, "window" or "round"): what a rate panel's rate window is held against: the
    window, or, for a window of one round, the shortest engine's announced span in it (two engines
    run one after the other make a window longer than either's round)."""
    spans = [float(t["announced_s"]) for t in (totals or {}).values() if t.get("announced_s")]
    return (min(spans), "round") if spans and min(spans) < window_s else (window_s, "window")


def rate_mark(panel: Panel, window_s: float, rate_window_s: float, rate_window: str, totals: bool,
              what: str = "window") -> str | None:
    """What a PNG board adds to the title of a panel drawn from rates over a window shorter than its
    rate window (None for any other): the rate window, the window's length and, after ``: ``,
    where the window's own figure is (the round totals, where the export has them and they give
    the panel's figure, :data:`TOTALS_PANELS`; else the records)."""
    if window_s >= rate_window_s or panel_kind(panel) != "rate":
        return None
    seconds = f"{window_s:.0f}" if window_s >= 10 else f"{window_s:.1f}"
    where = "see round totals" if totals and panel.key in TOTALS_PANELS else "see evidence summarize"
    return f"{rate_window} rate, {what} {seconds} s: {where}"


def rate_note(window_s: float, rate_window_s: float, rate_window: str, what: str = "window") -> str | None:
    """What a rate panel says when its rate window is longer than the evidence window (or the
    round in it: :func:`shortest_span`)."""
    if window_s >= rate_window_s:
        return None
    return (f"Drawn from {rate_window} rates over a {window_s:.1f} s {what}: each point averages the "
            f"{rate_window} before it, most of it outside the window, so it is not this window's figure "
            "(a short round's throughput shows far below its own); read the round totals, or the records "
            "(`evidence summarize`). The PNG boards say so in these panels' titles.")
