"""Runs that never mix, and the SLO that judges each record.

A run is one ``serve`` start: every record carries its ``run_id``; records written before there
were run ids form one run, ``unknown``.  Rounds are grouped by run, engine, scenario and round, in
plan order (the order in which the rounds first appear, by start time); several proxies' records
of the same run and round form one round.

Each record is judged by its own ``slo`` (the thresholds the proxy judged it by); a record without
one by the config given (``slo_by_scenario``, else ``slo``), else by the default SLO.

The announcement spans of the rounds come from the proxy's ``scenarios.jsonl`` beside the records
(:func:`read_announcements`, the one reader of that file: ``evidence export``'s scenario windows
and ``evidence summarize`` use it).  A round announced more than once in a run (cleared or
replaced, then set again) has one span per announcement (:func:`repeated_rounds`): a window over
them all would count every request in between, so ``evidence export`` refuses such a round and
``evidence summarize`` shows each announcement as a round of its own (:func:`split_repeated`).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.core.timefmt import iso
from exporter.proxy.config import DEFAULT_SLO, Config

__all__ = ["UNKNOWN_RUN", "SKIP_SCENARIOS", "RunError", "run_of", "runs_in", "select_run", "group_rounds",
           "judge_by", "RoundKey", "SCENARIO_LOG", "Announcement", "ScenarioLog", "ScenarioLogError",
           "scenario_log_path", "read_announcements", "repeated_rounds", "utc_bound", "split_repeated",
           "refuse_client_side"]

UNKNOWN_RUN = "unknown"
SKIP_SCENARIOS = frozenset({"warmup"})
#: (run, engine, scenario, round)
RoundKey = tuple[str, str, str, Any]


class RunError(ValueError):
    """A ``--run`` that the records do not hold; the message lists those they do."""


def refuse_client_side(records: Sequence[Mapping[str, Any]], where: str) -> None:
    """RunError when ``records`` are the load driver's own (``load --out DIR``'s requests.jsonl: each
    with its intended send time, none with the proxy's run id): its timings are the client's, not
    the proxy's, and every evidence table says it is proxy-side."""
    if records and all("intended_start_unix" in r and not r.get("run_id") for r in records):
        raise RunError(f"{where} holds the load driver's own records (client-side, from load --out): give the "
                       "proxy's records directory (records_dir in its config), where every figure is measured "
                       "proxy-side")


def run_of(record: Mapping[str, Any]) -> str:
    return str(record.get("run_id") or UNKNOWN_RUN)


def runs_in(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The runs of the records, in the order they started."""
    first: dict[str, float] = {}
    for r in records:
        if r.get("start_unix") is not None:
            run = run_of(r)
            first[run] = min(first.get(run, float("inf")), float(r["start_unix"]))
    return sorted(first, key=lambda run: (first[run], run))


def select_run(records: Sequence[Mapping[str, Any]], run: str | None) -> list[Mapping[str, Any]]:
    """The records of ``run`` (all when None; one proxy's id picks the run it is part of, see
    :func:`.merge.join_runs`); RunError when there are none."""
    if run is None:
        return list(records)
    picked = [r for r in records if run_of(r) == run or run in run_of(r).split("+")]
    if not picked:
        raise RunError(f"--run {run}: no records of that run (runs there: {', '.join(runs_in(records)) or 'none'})")
    return picked


def group_rounds(records: Sequence[Mapping[str, Any]]) -> dict[RoundKey, list[Mapping[str, Any]]]:
    """Records by (run, engine, scenario, round), warm-ups left out, in plan order."""
    groups: dict[RoundKey, list[Mapping[str, Any]]] = defaultdict(list)
    first: dict[RoundKey, float] = {}
    for r in records:
        if r.get("scenario") in SKIP_SCENARIOS or r.get("start_unix") is None:
            continue
        key = (run_of(r), str(r.get("engine")), str(r.get("scenario")), r.get("round"))
        groups[key].append(r)
        first[key] = min(first.get(key, float("inf")), float(r["start_unix"]))
    return {k: groups[k] for k in sorted(groups, key=lambda k: (first[k], str(k)))}


SCENARIO_LOG = "scenarios.jsonl"
#: (run, engine, scenario, round as text): one engine's round in one run
AnnouncedKey = tuple[str, str, str, str]


class ScenarioLogError(ValueError):
    """A ``scenarios.jsonl`` that cannot be read; the message names it and the cause."""


@dataclass(frozen=True)
class Announcement:
    """One announcement of a round for one engine: from the event that set it to the next event
    of the same run that changed that engine's scenario or round (set again unchanged, it goes
    on: one span).  ``end`` None: still announced where the log ends, and no later run began."""

    run: str
    engine: str
    scenario: str
    round: str
    start: float
    end: float | None

    @property
    def key(self) -> AnnouncedKey:
        return (self.run, self.engine, self.scenario, self.round)


@dataclass(frozen=True)
class ScenarioLog:
    """What :func:`read_announcements` read: the runs (each with its first event's time, in the
    order they appear) and every announcement span, in the order they began."""

    path: Path
    runs: dict[str, float]
    spans: list[Announcement]


def scenario_log_path(records: Path) -> Path:
    """The ``scenarios.jsonl`` of a records directory, or beside a records file (or that file)."""
    if records.is_dir():
        return records / SCENARIO_LOG
    return records if records.name == SCENARIO_LOG else records.parent / SCENARIO_LOG


def _events(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioLogError(f"cannot read scenario events from {path}: {exc.strerror or exc}") from None
    events = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
            if not isinstance(ev, dict):
                raise ValueError("not a JSON object")
            ev["unix"] = float(ev["unix"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ScenarioLogError(f"cannot read scenario events from {path}: line {n}: "
                                   f"{'no unix time' if isinstance(exc, KeyError) else exc}") from None
        events.append(ev)
    return events


def read_announcements(path: Path) -> ScenarioLog:
    """Every round's announcement spans per engine from a proxy's ``scenarios.jsonl`` (``path``:
    the file, or a records directory).  An event with the engine's scenario and round unchanged
    (``POST /-/scenario`` twice alike) continues the span; a span that a proxy restart left
    announced ends at the next run's first event.  Events without a ``run_id`` (an older proxy)
    are the run ``unknown``.  ScenarioLogError when the file cannot be read."""
    path = scenario_log_path(path) if path.is_dir() else path
    events = _events(path)
    runs: dict[str, float] = {}
    for ev in events:
        r = str(ev.get("run_id") or UNKNOWN_RUN)
        runs[r] = min(runs.get(r, math.inf), ev["unix"])
    spans: list[tuple[float, int, Announcement]] = []
    open_at: dict[tuple[str, str], tuple[str, str, float]] = {}  # (run, engine) -> (scenario, round, since)
    for ev in events:
        t, ev_run = ev["unix"], str(ev.get("run_id") or UNKNOWN_RUN)
        now_on = None if ev.get("scenario") is None else (str(ev["scenario"]), str(ev.get("round")))
        for engine in ev.get("engines") or []:
            engine = str(engine)
            current = open_at.get((ev_run, engine))
            if current is not None and now_on == current[:2]:
                continue  # announced again unchanged: the same span
            if current is not None:
                del open_at[(ev_run, engine)]
                spans.append((current[2], len(spans), Announcement(ev_run, engine, *current[:2], current[2], t)))
            if now_on is not None:
                open_at[(ev_run, engine)] = (*now_on, t)
    for (ev_run, engine), (scenario, rnd, since) in open_at.items():
        later = [first for r, first in runs.items() if first > since and r != ev_run]
        spans.append((since, len(spans), Announcement(ev_run, engine, scenario, rnd, since, min(later, default=None))))
    return ScenarioLog(path, runs, [a for _, _, a in sorted(spans, key=lambda x: (x[0], x[1]))])


def repeated_rounds(spans: Iterable[Announcement]) -> dict[AnnouncedKey, list[Announcement]]:
    """The rounds announced more than once for an engine in a run: their spans, in time order
    (the same span read twice, from a copy of the records, counts once)."""
    by_key: dict[AnnouncedKey, dict[float, Announcement]] = defaultdict(dict)
    for a in spans:
        by_key[a.key].setdefault(a.start, a)
    return {key: [found[t] for t in sorted(found)] for key, found in by_key.items() if len(found) > 1}


def utc_bound(ts: float, up: bool = False) -> str:
    """``ts`` in UTC to the millisecond, rounded down (``up``: up), as ``--window START,END``
    takes it: a window written with these holds the whole span."""
    ms = math.ceil(ts * 1000 - 1e-6) if up else math.floor(ts * 1000 + 1e-6)
    return f"{iso(ms // 1000)[:-1]}.{ms % 1000:03d}Z"


def _again(rnd: Any, a: Announcement, precise: bool) -> str:
    when = utc_bound(a.start) if precise else iso(a.start)
    return f"{rnd} (again at {when[11:]})"


def split_repeated(records: Sequence[dict[str, Any]], spans: Iterable[Announcement]) -> list[dict[str, Any]]:
    """Tell apart the announcements of a round announced more than once in a run: each record of
    such a round (warm-ups aside) goes to the announcement its ``start_unix`` falls in (else the
    nearest); those of the first keep their ``round``, those of each later one get
    ``ROUND (again at HH:MM:SSZ)`` (its start, UTC), so that they form a round of their own.
    ``records`` are changed in place; returns a row per such round that has records: ``run``,
    ``engine``, ``scenario``, ``round``, ``announcements`` (how many) and ``spans`` (each one's
    ``label``, ``start``/``end`` unix and UTC, and ``requests``).  Records of a run joined from
    several proxies (``A+B``) go by the first of its proxies' runs that repeated the round."""
    repeats = repeated_rounds(spans)
    if not repeats:
        return []
    labels: dict[AnnouncedKey, list[Any]] = {}
    counts: dict[AnnouncedKey, list[int]] = {}
    for r in records:
        if r.get("scenario") in SKIP_SCENARIOS or r.get("start_unix") is None:
            continue
        rnd = r.get("round")
        for part in run_of(r).split("+"):
            key = (part, str(r.get("engine")), str(r.get("scenario")), str(rnd))
            found = repeats.get(key)
            if found is None:
                continue
            if key not in labels:
                precise = len({iso(a.start) for a in found[1:]}) < len(found) - 1
                labels[key] = [rnd, *(_again(rnd, a, precise) for a in found[1:])]
                counts[key] = [0] * len(found)
            t = float(r["start_unix"])
            index = min(range(len(found)), key=lambda i: _distance(t, found[i]))
            counts[key][index] += 1
            r["round"] = labels[key][index]
            break
    return [{"run": key[0], "engine": key[1], "scenario": key[2], "round": labels[key][0],
             "announcements": len(repeats[key]),
             "spans": [{"label": label, "start": a.start, "end": a.end, "start_utc": iso(a.start, ms=True),
                        "end_utc": None if a.end is None else iso(a.end, ms=True), "requests": n}
                       for label, a, n in zip(labels[key], repeats[key], counts[key])]}
            for key in labels]


def _distance(t: float, a: Announcement) -> float:
    """How far ``t`` lies outside the span (0 inside it)."""
    return max(a.start - t, 0.0, t - (a.end if a.end is not None else math.inf))


def _has_slo(record: Mapping[str, Any]) -> bool:
    slo = record.get("slo")
    return isinstance(slo, Mapping) and all(isinstance(slo.get(k), (int, float)) for k in ("ttft_s", "tpot_s"))


def _default_text() -> str:
    return f"the default SLO (TTFT <= {DEFAULT_SLO.ttft_s:g} s, TPOT <= {DEFAULT_SLO.tpot_s * 1000:g} ms)"


def judge_by(records: Sequence[Mapping[str, Any]], config: Config | None = None,
             config_path: Path | str | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Records that all carry the ``slo`` that judges them, and a note of where it came from:
    ``{"own": N, "fallback": M, "fallback_source": TEXT, "text": one line}``."""
    out: list[dict[str, Any]] = []
    missing = 0
    for r in records:
        if _has_slo(r):
            out.append(dict(r))
            continue
        missing += 1
        slo = config.slo_for(str(r.get("scenario"))) if config is not None else DEFAULT_SLO
        out.append({**r, "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s}})
    source = f"the config {config_path} (slo, slo_by_scenario)" if config is not None else _default_text()
    own = len(out) - missing
    text = f"SLO: each record judged by its own slo ({own} records)"
    if missing:
        text = (f"SLO: {own} records judged by their own slo; {missing} without one (an older proxy) "
                f"judged by {source}")
    return out, {"own": own, "fallback": missing, "fallback_source": source if missing else None, "text": text}
