"""Evidence windows: ``START,END``, ``last:30m``, ``scenario:NAME[#ROUND]`` or
``scenario:NAME#ROUND:steady[:ENGINE]``, made absolute.

A steady window (the round with its ramp-up and drain cut off, :mod:`.experiment`) comes from the
records only (``--records DIR``: its ``requests.jsonl``), request by request: Prometheus' arrival
and in-flight series are sampled once a scrape, too coarse for a round of a few seconds.  It is
the latest run's round; where several engines ran it, ``:ENGINE`` picks one, or their steady
windows must overlap and the window is where all of them were steady.

Records hold every ``serve`` start of their directory, each a run: a scenario window read from
them is one run's.  When the round (or, without ``#ROUND``, the scenario) ran in more than one run
there, the window is refused with the runs listed, unless ``run`` (``evidence export --run ID``)
picks one; a round that a proxy restart left announced ends at the next run's first event.  A
round announced more than once in the run (cleared or replaced, then set again: ``scenarios.jsonl``
has one span per announcement) is refused too, with each span as ``START,END`` for ``--window``:
one window over them would count every request sent in between (``evidence summarize`` shows each
announcement as a round of its own).  ``scenario:NAME`` (every round) still takes them all.

A scenario window comes, first that applies, from:

1. ``--records``: the proxy's ``scenarios.jsonl`` (exact: the times the scenario was set);
2. Prometheus's round timestamp gauges ``llmbench_scenario_round_start_timestamp_seconds`` /
   ``llmbench_scenario_round_end_timestamp_seconds`` (exact to the proxy's clock; a round
   shorter than a scrape interval is still found);
3. samples of ``llmbench_scenario_info`` (proxies without those gauges; to a scrape interval).

:attr:`Window.source` says which, and the export writes it down.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from exporter.core.timefmt import iso

from .promapi import Prometheus, parse_duration

if TYPE_CHECKING:
    from .runs import Announcement

__all__ = ["Window", "WindowError", "parse_window", "iso", "check_not_future", "START_GAUGE", "END_GAUGE",
           "EngineSpan", "reads_records", "scenario_of"]

START_GAUGE = "llmbench_scenario_round_start_timestamp_seconds"
END_GAUGE = "llmbench_scenario_round_end_timestamp_seconds"
#: How far into the future a window may end (clock skew between hosts), in seconds.
FUTURE_SLACK_S = 5.0


class WindowError(Exception):
    """A bad window spec, or a scenario that cannot be found."""


#: (engine, start, end): one engine's announced span of a round window
EngineSpan = tuple[str, float, float]


@dataclass(frozen=True)
class Window:
    start: float
    end: float
    spec: str
    source: str = "given"
    #: a scenario window's announced span per engine, where its source tells them apart
    engines: tuple[EngineSpan, ...] = ()
    #: the run a window read from the records belongs to (None: not from the records)
    run: str | None = None

    @property
    def seconds(self) -> float:
        return self.end - self.start


def _instant(text: str) -> float:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise WindowError(f"not a time: {text!r} (RFC 3339 like 2026-11-29T12:00:00Z, or unix seconds)") from None
    if dt.tzinfo is None:
        raise WindowError(f"{text!r} has no timezone: add Z or +hh:mm")
    return dt.timestamp()


def check_not_future(window: Window, now: float | None = None) -> None:
    """Refuse a window that starts or ends in the future: it can hold no samples."""
    now = time.time() if now is None else now
    if window.start >= now:
        raise WindowError(f"the window starts in the future ({iso(window.start)}, now {iso(now)}): no samples can be there")
    if window.end > now + FUTURE_SLACK_S:
        raise WindowError(f"the window ends in the future ({iso(window.end)}, now {iso(now)}): end it at now or earlier")


def reads_records(spec: str) -> bool:
    """Whether a window of this form is read from ``--records`` when given: the scenario forms."""
    return spec.startswith("scenario:")


def parse_window(spec: str, prom: Prometheus | None = None, records: Path | None = None,
                 now: float | None = None, lookback_s: float = 6 * 3600, run: str | None = None) -> Window:
    """Resolve a window spec to absolute unix times; ``run`` picks the run of a window read from
    ``records`` (WindowError when it is given for any other)."""
    now = time.time() if now is None else now
    if run is not None and (records is None or not reads_records(spec)):
        raise WindowError(f"--run {run} picks the run of a scenario window read from --records DIR: "
                          + ("add --records" if reads_records(spec) else f"{spec!r} reads no records"))
    if spec.startswith("last:"):
        try:
            span = parse_duration(spec[5:])
        except ValueError as exc:
            raise WindowError(str(exc)) from None
        if span <= 0:
            raise WindowError(f"empty window {spec!r}: give a duration above zero, e.g. last:30m")
        return Window(now - span, now, spec, "last")
    if spec.startswith("scenario:") and _steady_part(spec) is not None:
        return _steady_window(spec, records, run)
    if spec.startswith("scenario:"):
        return _scenario_window(spec, prom, records, now, lookback_s, run)
    first, sep, second = spec.partition(",")
    if not sep:
        raise WindowError(f"bad window {spec!r}: use START,END, last:DURATION or scenario:NAME[#ROUND]")
    start, end = _instant(first), _instant(second)
    if end <= start:
        raise WindowError(f"window ends before it starts: {spec!r}")
    return Window(start, end, spec, "given")


def scenario_of(spec: str) -> str | None:
    """The scenario NAME of a ``scenario:NAME[#ROUND][:steady[:ENGINE]]`` spec, else None."""
    if not reads_records(spec):
        return None
    steady = _steady_part(spec)
    return (steady[0] if steady is not None else spec[9:]).partition("#")[0] or None


def _steady_part(spec: str) -> tuple[str, str | None] | None:
    """(``NAME#ROUND``, ENGINE or None) of a ``scenario:NAME#ROUND:steady[:ENGINE]`` spec, else None."""
    body = spec[9:]
    if body.endswith(":steady"):
        return body[:-7], None
    head, sep, engine = body.rpartition(":steady:")
    return (head, engine) if sep and engine else None


def _steady_window(spec: str, records: Path | None, run: str | None = None) -> Window:
    from .experiment import steady_window
    from .merge import MergeError, load_records
    from .runs import RunError, group_rounds, select_run

    part = _steady_part(spec)
    assert part is not None
    (name, _, rnd), engine = part[0].partition("#"), part[1]
    if not name or not rnd.isdigit():
        raise WindowError(f"bad steady window {spec!r}: expected scenario:NAME#ROUND:steady[:ENGINE]")
    if records is None:
        raise WindowError(f"{spec}: a steady window comes from the records: add --records DIR (with requests.jsonl)")
    try:
        recs = select_run(load_records(records), run)
    except (MergeError, RunError) as exc:
        raise WindowError(str(exc)) from None
    runs = list(dict.fromkeys(key[0] for key in group_rounds(recs)
                              if key[2] == name and str(key[3]) == rnd and (engine is None or key[1] == engine)))
    if len(runs) > 1:
        raise _several_runs(spec, runs, records)
    _steady_repeats(spec, records, name, rnd, engine, runs[0] if runs else run)
    try:
        start, end, note = steady_window(recs, name, int(rnd), engine)
    except ValueError as exc:
        raise WindowError(f"{spec}: {exc}") from None
    return Window(start, end, spec, f"records ({records}: {note})", run=runs[0] if runs else run)


def _steady_repeats(spec: str, records: Path, name: str, rnd: str, engine: str | None, run: str | None) -> None:
    """Refuse a steady window of a round announced more than once in its run, as
    :func:`_from_records` does (the ``scenarios.jsonl`` beside the records says; none there: no check)."""
    from .runs import ScenarioLogError, read_announcements, scenario_log_path

    path = scenario_log_path(records)
    if run is None or not path.is_file():
        return
    try:
        log = read_announcements(path)
    except ScenarioLogError as exc:
        raise WindowError(str(exc)) from None
    _refuse_repeats(spec, run, [a for a in log.spans if a.run == run and a.scenario == name and a.round == rnd
                                and (engine is None or a.engine == engine)], records)


def _several_runs(spec: str, runs: list[str], records: Path) -> WindowError:
    return WindowError(f"{spec}: the records in {records} hold it in {len(runs)} runs ({', '.join(runs)}), "
                       f"which never mix: add --run ID, e.g. --run {runs[-1]}")


def _scenario_window(spec: str, prom: Prometheus | None, records: Path | None, now: float,
                     lookback_s: float, run: str | None = None) -> Window:
    name, _, rnd = spec[9:].partition("#")
    if not name or (rnd and not rnd.isdigit()):
        raise WindowError(f"bad scenario window {spec!r}: expected scenario:NAME or scenario:NAME#ROUND")
    round_ = rnd or None
    if records is not None:
        found_run, spans = _from_records(records, name, round_, now, run)
        return Window(min(s for _, s, _ in spans), max(e for _, _, e in spans), spec,
                      f"records ({records}, run {found_run})", engines=_per_engine(spans), run=found_run)
    if prom is None:
        raise WindowError("a scenario window needs --prometheus or --records")
    found = _from_gauges(prom, name, round_, now, lookback_s)
    if found is not None:
        return Window(min(s for _, s, _ in found), max(e for _, _, e in found), spec,
                      f"Prometheus ({START_GAUGE} / {END_GAUGE})", engines=_per_engine(found))
    start, end = _from_scenario_info(prom, name, round_, now, lookback_s)
    return Window(start, end, spec, "Prometheus (llmbench_scenario_info samples, to a scrape interval)")


def _per_engine(spans: list[EngineSpan]) -> tuple[EngineSpan, ...]:
    """Each engine's span: from its first start to its last end (several proxies, several spans)."""
    out: dict[str, tuple[float, float]] = {}
    for engine, start, end in spans:
        lo, hi = out.get(engine, (start, end))
        out[engine] = (min(lo, start), max(hi, end))
    return tuple((engine, lo, hi) for engine, (lo, hi) in sorted(out.items()))


def _from_records(records: Path, name: str, rnd: str | None, now: float,
                  run: str | None = None) -> tuple[str, list[EngineSpan]]:
    """(run, its spans) of a scenario (round) from ``scenarios.jsonl`` (:func:`.runs.read_announcements`):
    from the event that set it to the next change for that engine in the same run; a span a
    restart left open ends at the next run's first event, else now.  WindowError when it is in
    several runs and ``run`` picks none, or when ``rnd`` was announced more than once for an engine
    in that run (:func:`_refuse_repeats`)."""
    from .runs import ScenarioLogError, read_announcements, scenario_log_path

    path = scenario_log_path(records)
    try:
        log = read_announcements(path)
    except ScenarioLogError as exc:
        raise WindowError(str(exc)) from None
    if run is not None and run not in log.runs:
        raise WindowError(f"--run {run}: no scenario events of that run in {path} (runs there: "
                          f"{', '.join(log.runs) or 'none'})")
    by_run: dict[str, list[Announcement]] = {}
    for a in log.spans:
        if a.scenario == name and (rnd is None or a.round == rnd):
            by_run.setdefault(a.run, []).append(a)
    what = f"{name}{'#' + rnd if rnd else ''}"
    if not by_run or (run is not None and run not in by_run):
        raise WindowError(f"unknown scenario {what}: not in {path}" + (f" for run {run}" if run else ""))
    if run is None and len(by_run) > 1:
        raise _several_runs(f"scenario:{what}", sorted(by_run, key=lambda r: log.runs[r]), records)
    found = run if run is not None else next(iter(by_run))
    if rnd is not None:
        _refuse_repeats(f"scenario:{what}", found, by_run[found], records, now)
    return found, [(a.engine, a.start, now if a.end is None else a.end) for a in by_run[found]]


def _refuse_repeats(spec: str, run: str, spans: list[Announcement], records: Path, now: float | None = None) -> None:
    """WindowError when one engine's round among ``spans`` (the round's announcements in ``run``)
    was announced more than once: one window from its first start to its last end would count
    every request sent in between, other scenarios' too."""
    from .runs import repeated_rounds, utc_bound

    repeats = {key[1]: found for key, found in repeated_rounds(spans).items() if key[0] == run}
    if not repeats:
        return
    now = time.time() if now is None else now

    def pair(a: Announcement) -> str:
        return f"{utc_bound(a.start)},{utc_bound(now if a.end is None else a.end, up=True)}"

    engines = "; ".join(f"{engine} {len(found)} times ({' then '.join(pair(a) for a in found)})"
                        for engine, found in sorted(repeats.items()))
    example = pair(next(iter(sorted(repeats.items())))[1][-1])
    raise WindowError(f"{spec}: in run {run} this round was announced more than once (cleared or replaced, then "
                      f"set again), for {engines}: one window over them would count every request sent in "
                      f"between. Export one announcement as a time window, START,END as listed, e.g. "
                      f"--window {example}; evidence summarize --records {records} shows each announcement "
                      "as a round of its own")


def _gauge_values(prom: Prometheus, metric: str, sel: str, now: float, lookback_s: float) -> dict[tuple[str, ...], float]:
    """The latest value of each series of a timestamp gauge in the lookback, keyed by its labels."""
    expr = f"last_over_time({metric}{{{sel}}}[{int(lookback_s)}s])"
    out = {}
    for s in prom.query(expr, at=now):
        labels = s["metric"]
        key = tuple(labels.get(k, "") for k in ("instance", "engine", "scenario", "round"))
        out[key] = float(s["value"][1])
    return out


def _from_gauges(prom: Prometheus, name: str, rnd: str | None, now: float,
                 lookback_s: float) -> list[EngineSpan] | None:
    """Rounds' (engine, start, end) from the timestamp gauges; an open round ends now."""
    sel = f'scenario="{name}"' + (f', round="{rnd}"' if rnd else "")
    starts = _gauge_values(prom, START_GAUGE, sel, now, lookback_s)
    if not starts:
        return None
    ends = _gauge_values(prom, END_GAUGE, sel, now, lookback_s)
    spans = []
    for key, start in starts.items():
        end = ends.get(key)
        spans.append((key[1], start, end if end is not None and end >= start else now))
    return spans


def _from_scenario_info(prom: Prometheus, name: str, rnd: str | None, now: float,
                        lookback_s: float) -> tuple[float, float]:
    """First and last sample of ``llmbench_scenario_info`` for the scenario (round), to 1 s."""
    sel = f'scenario="{name}"' + (f', round="{rnd}"' if rnd else "")
    expr = f"max(llmbench_scenario_info{{{sel}}})"
    coarse = max(5.0, lookback_s / 10_000)
    series = prom.query_range(expr, now - lookback_s, now, coarse)
    stamps = [float(t) for s in series for t, _ in s["values"]]
    if not stamps:
        raise WindowError(f"unknown scenario {name}{'#' + rnd if rnd else ''}: no {START_GAUGE} nor "
                          f"llmbench_scenario_info samples in the last {lookback_s / 3600:g} h")
    lo, hi = min(stamps) - coarse, max(stamps) + coarse
    fine = prom.query_range(expr, lo, hi, max(1.0, (hi - lo) / 10_000))
    stamps = [float(t) for s in fine for t, _ in s["values"]] or stamps
    return min(stamps), max(stamps)
