"""Evidence windows: ``START,END``, ``last:30m``, ``scenario:NAME[#ROUND]`` or
``scenario:NAME#ROUND:steady[:ENGINE]``, made absolute.

A steady window (the round with its ramp-up and drain cut off, :mod:`.experiment`) comes from the
records only (``--records DIR``: its ``requests.jsonl``), request by request: Prometheus' arrival
and in-flight series are sampled once a scrape, too coarse for a round of a few seconds.  It is
the latest run's round; where several engines ran it, ``:ENGINE`` picks one, or their steady
windows must overlap and the window is where all of them were steady.

A scenario window comes, first that applies, from:

1. ``--records``: the proxy's ``scenarios.jsonl`` (exact: the times the scenario was set);
2. Prometheus's round timestamp gauges ``llmbench_scenario_round_start_timestamp_seconds`` /
   ``llmbench_scenario_round_end_timestamp_seconds`` (exact to the proxy's clock; a round
   shorter than a scrape interval is still found);
3. samples of ``llmbench_scenario_info`` (proxies without those gauges; to a scrape interval).

:attr:`Window.source` says which, and the export writes it down.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from exporter.core.timefmt import iso

from .promapi import Prometheus, parse_duration

__all__ = ["Window", "WindowError", "parse_window", "iso", "check_not_future", "START_GAUGE", "END_GAUGE"]

START_GAUGE = "llmbench_scenario_round_start_timestamp_seconds"
END_GAUGE = "llmbench_scenario_round_end_timestamp_seconds"
#: How far into the future a window may end (clock skew between hosts), in seconds.
FUTURE_SLACK_S = 5.0


class WindowError(Exception):
    """A bad window spec, or a scenario that cannot be found."""


@dataclass(frozen=True)
class Window:
    start: float
    end: float
    spec: str
    source: str = "given"

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


def parse_window(spec: str, prom: Prometheus | None = None, records: Path | None = None,
                 now: float | None = None, lookback_s: float = 6 * 3600) -> Window:
    """Resolve a window spec to absolute unix times."""
    now = time.time() if now is None else now
    if spec.startswith("last:"):
        try:
            span = parse_duration(spec[5:])
        except ValueError as exc:
            raise WindowError(str(exc)) from None
        if span <= 0:
            raise WindowError(f"empty window {spec!r}: give a duration above zero, e.g. last:30m")
        return Window(now - span, now, spec, "last")
    if spec.startswith("scenario:") and _steady_part(spec) is not None:
        return _steady_window(spec, records)
    if spec.startswith("scenario:"):
        return _scenario_window(spec, prom, records, now, lookback_s)
    first, sep, second = spec.partition(",")
    if not sep:
        raise WindowError(f"bad window {spec!r}: use START,END, last:DURATION or scenario:NAME[#ROUND]")
    start, end = _instant(first), _instant(second)
    if end <= start:
        raise WindowError(f"window ends before it starts: {spec!r}")
    return Window(start, end, spec, "given")


def _steady_part(spec: str) -> tuple[str, str | None] | None:
    """(``NAME#ROUND``, ENGINE or None) of a ``scenario:NAME#ROUND:steady[:ENGINE]`` spec, else None."""
    body = spec[9:]
    if body.endswith(":steady"):
        return body[:-7], None
    head, sep, engine = body.rpartition(":steady:")
    return (head, engine) if sep and engine else None


def _steady_window(spec: str, records: Path | None) -> Window:
    from .experiment import steady_window
    from .merge import MergeError, load_records

    part = _steady_part(spec)
    assert part is not None
    (name, _, rnd), engine = part[0].partition("#"), part[1]
    if not name or not rnd.isdigit():
        raise WindowError(f"bad steady window {spec!r}: expected scenario:NAME#ROUND:steady[:ENGINE]")
    if records is None:
        raise WindowError(f"{spec}: a steady window comes from the records: add --records DIR (with requests.jsonl)")
    try:
        recs = load_records(records)
    except MergeError as exc:
        raise WindowError(str(exc)) from None
    try:
        start, end, note = steady_window(recs, name, int(rnd), engine)
    except ValueError as exc:
        raise WindowError(f"{spec}: {exc}") from None
    return Window(start, end, spec, f"records ({records}: {note})")


def _scenario_window(spec: str, prom: Prometheus | None, records: Path | None, now: float,
                     lookback_s: float) -> Window:
    name, _, rnd = spec[9:].partition("#")
    if not name or (rnd and not rnd.isdigit()):
        raise WindowError(f"bad scenario window {spec!r}: expected scenario:NAME or scenario:NAME#ROUND")
    round_ = rnd or None
    if records is not None:
        start, end = _from_records(records, name, round_, now)
        return Window(start, end, spec, f"records ({records})")
    if prom is None:
        raise WindowError("a scenario window needs --prometheus or --records")
    found = _from_gauges(prom, name, round_, now, lookback_s)
    if found is not None:
        return Window(found[0], found[1], spec, f"Prometheus ({START_GAUGE} / {END_GAUGE})")
    start, end = _from_scenario_info(prom, name, round_, now, lookback_s)
    return Window(start, end, spec, "Prometheus (llmbench_scenario_info samples, to a scrape interval)")


def _from_records(records: Path, name: str, rnd: str | None, now: float) -> tuple[float, float]:
    """Scenario windows from ``scenarios.jsonl``: from the event that set it to the next change."""
    path = records / "scenarios.jsonl" if records.is_dir() else records
    try:
        events = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        raise WindowError(f"cannot read scenario events from {path}: {exc}") from None
    spans: list[tuple[float, float]] = []
    open_at: dict[str, tuple[float, bool]] = {}  # engine -> (since, is ours)
    for ev in events:
        t = float(ev["unix"])
        ours = ev.get("scenario") == name and (rnd is None or str(ev.get("round")) == rnd)
        for engine in ev.get("engines", []):
            previous = open_at.pop(engine, None)
            if previous is not None and previous[1]:
                spans.append((previous[0], t))
            open_at[engine] = (t, ours)
    for opened, still_ours in open_at.values():
        if still_ours:
            spans.append((opened, now))
    if not spans:
        raise WindowError(f"unknown scenario {name}{'#' + rnd if rnd else ''}: not in {path}")
    return min(s for s, _ in spans), max(e for _, e in spans)


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
                 lookback_s: float) -> tuple[float, float] | None:
    """Rounds' start to end from the timestamp gauges; an open round ends now."""
    sel = f'scenario="{name}"' + (f', round="{rnd}"' if rnd else "")
    starts = _gauge_values(prom, START_GAUGE, sel, now, lookback_s)
    if not starts:
        return None
    ends = _gauge_values(prom, END_GAUGE, sel, now, lookback_s)
    spans = []
    for key, start in starts.items():
        end = ends.get(key)
        spans.append((start, end if end is not None and end >= start else now))
    return min(s for s, _ in spans), max(e for _, e in spans)


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
