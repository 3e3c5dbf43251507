"""Evidence windows: ``START,END``, ``last:30m`` or ``scenario:NAME[#ROUND]``, made absolute."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from exporter.core.timefmt import iso

from .promapi import Prometheus, parse_duration

__all__ = ["Window", "WindowError", "parse_window", "iso"]


class WindowError(Exception):
    """A bad window spec, or a scenario that cannot be found."""


@dataclass(frozen=True)
class Window:
    start: float
    end: float
    spec: str

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


def parse_window(spec: str, prom: Prometheus | None = None, records: Path | None = None,
                 now: float | None = None, lookback_s: float = 6 * 3600) -> Window:
    """Resolve a window spec to absolute unix times."""
    now = time.time() if now is None else now
    if spec.startswith("last:"):
        try:
            span = parse_duration(spec[5:])
        except ValueError as exc:
            raise WindowError(str(exc)) from None
        return Window(now - span, now, spec)
    if spec.startswith("scenario:"):
        name, _, rnd = spec[9:].partition("#")
        if not name or (rnd and not rnd.isdigit()):
            raise WindowError(f"bad scenario window {spec!r}: expected scenario:NAME or scenario:NAME#ROUND")
        if records is not None:
            start, end = _from_records(records, name, rnd or None)
        elif prom is not None:
            start, end = _from_prometheus(prom, name, rnd or None, now, lookback_s)
        else:
            raise WindowError("a scenario window needs --prometheus or --records")
        return Window(start, end, spec)
    first, sep, second = spec.partition(",")
    if not sep:
        raise WindowError(f"bad window {spec!r}: use START,END, last:DURATION or scenario:NAME[#ROUND]")
    start, end = _instant(first), _instant(second)
    if end <= start:
        raise WindowError(f"window ends before it starts: {spec!r}")
    return Window(start, end, spec)


def _from_records(records: Path, name: str, rnd: str | None) -> tuple[float, float]:
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
            spans.append((opened, time.time()))
    if not spans:
        raise WindowError(f"unknown scenario {name}{'#' + rnd if rnd else ''}: not in {path}")
    return min(s for s, _ in spans), max(e for _, e in spans)


def _from_prometheus(prom: Prometheus, name: str, rnd: str | None, now: float, lookback_s: float) -> tuple[float, float]:
    """First and last sample of ``llmbench_scenario_info`` for the scenario (round), to 1 s."""
    sel = f'scenario="{name}"' + (f', round="{rnd}"' if rnd else "")
    expr = f"max(llmbench_scenario_info{{{sel}}})"
    coarse = max(5.0, lookback_s / 10_000)
    series = prom.query_range(expr, now - lookback_s, now, coarse)
    stamps = [float(t) for s in series for t, _ in s["values"]]
    if not stamps:
        raise WindowError(f"unknown scenario {name}{'#' + rnd if rnd else ''}: no llmbench_scenario_info "
                          f"samples in the last {lookback_s / 3600:g} h")
    lo, hi = min(stamps) - coarse, max(stamps) + coarse
    fine = prom.query_range(expr, lo, hi, max(1.0, (hi - lo) / 10_000))
    stamps = [float(t) for s in fine for t, _ in s["values"]] or stamps
    return min(stamps), max(stamps)
