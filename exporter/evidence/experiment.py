"""The experiment itself: was the load what the report says, did the client keep up, which part
of a round was steady.  Proxy-side, from the records' ``start_unix`` (arrival at the proxy),
``e2e_s``, ``client_bound`` and ``client_backpressure_s``.

Per round (:func:`round_load`): arrivals; the offered rate, (arrivals − 1) / (last − first
arrival); the inter-arrival coefficient of variation; peak and time-weighted mean in-flight
requests over the round (first arrival to last end); the share of ``client_bound`` requests;
the steady window and a load verdict, first that applies:

* ``closed-loop C``: the in-flight count is at C (within 10% of C: exactly C below 10 clients,
  since a real client takes a moment between two requests) for at least 90% of the steady window
  (from the first to the last moment at C: ramp-up and drain cut off); C is the level held longest;
* ``poisson``: the Anderson-Darling test of an exponential fit (:mod:`.arrivals`) does not reject
  the inter-arrival gaps inside the open-loop steady window at the 1% level;
* ``bursty``: the fit is rejected and the gaps vary more than an exponential's (CV > 1);
* ``unknown``: anything else (too few arrivals, or more regular than Poisson).

A closed loop's arrival rate follows the engine's speed, so two closed loops are the same load
when their C is the same; open loops when their verdicts match and their offered rates are within
10% (:func:`same_load`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.core.stats import median, percentile

from .arrivals import (TOLERANCE, closed_steady, cv, exponential_fit, inflight_steps, near, open_steady, plateau,
                       time_at)

__all__ = ["Expect", "parse_expect", "round_load", "load_line", "load_lines", "same_load", "steady_records", "cell_load",
           "steady_window", "window_share", "seconds_text",
           "CLOSED_SHARE", "MIN_ARRIVALS"]

#: Share of the steady window at C that makes a closed loop.
CLOSED_SHARE = 0.90
#: Fewest arrivals for any verdict but ``unknown``.
MIN_ARRIVALS = 3

Record = Mapping[str, Any]


@dataclass(frozen=True)
class Expect:
    """``--expect poisson:RATE`` (req/s) or ``--expect closed:C``."""

    kind: str
    value: float

    @property
    def text(self) -> str:
        return f"{self.kind}:{self.value:g}"


def parse_expect(text: str) -> Expect:
    kind, _, value = text.partition(":")
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if kind not in ("poisson", "closed") or not number > 0 or (kind == "closed" and number != int(number)):
        raise ValueError(f"--expect {text!r}: use poisson:RATE (requests/s, e.g. poisson:0.5) or closed:C "
                         "(requests in flight, e.g. closed:32)")
    return Expect(kind, number)


def _spans(records: Sequence[Record]) -> list[tuple[float, float]]:
    return [(float(r["start_unix"]), float(r["start_unix"]) + float(r.get("e2e_s") or 0.0))
            for r in records if r.get("start_unix") is not None]


def _verdict(arrivals: list[float], steps: list[tuple[float, int]]) -> tuple[str, tuple[float, float] | None,
                                                                              dict[str, Any]]:
    """(verdict, steady window, fit figures) of one round."""
    level = plateau(steps)
    window = closed_steady(steps, level) if level else None
    if window and len(arrivals) >= MIN_ARRIVALS and window[1] > window[0]:
        at_c = sum(t for lvl, t in time_at(steps, *window).items() if near(lvl, level))
        if at_c >= CLOSED_SHARE * (window[1] - window[0]):
            return f"closed-loop {level}", window, {"at_plateau_share": at_c / (window[1] - window[0])}
    window = open_steady(arrivals)
    inside = [a for a in arrivals if window and window[0] <= a <= window[1]]
    fit = exponential_fit([b - a for a, b in zip(inside, inside[1:])])
    figures: dict[str, Any] = {"fit": "anderson-darling exponential, rate estimated, 1% level",
                               "fit_n": fit.n if fit else 0, "fit_a2": fit.a2 if fit else None,
                               "fit_rejected": fit.rejected if fit else None}
    if fit is None:
        return "unknown", window, figures
    if not fit.rejected:
        return "poisson", window, figures
    spread = cv([b - a for a, b in zip(inside, inside[1:])])
    return ("bursty" if spread is not None and spread > 1.0 else "unknown"), window, figures


def round_load(records: Sequence[Record], expect: Expect | None = None) -> dict[str, Any]:
    """The load figures of one round (base units: seconds, requests/s, shares 0..1)."""
    spans = _spans(records)
    arrivals = sorted(s for s, _ in spans)
    steps = inflight_steps(spans)
    first, last_end = (arrivals[0], max(e for _, e in spans)) if spans else (0.0, 0.0)
    duration = last_end - first
    arrival_span = arrivals[-1] - arrivals[0] if arrivals else 0.0
    verdict, window, fit = _verdict(arrivals, steps) if spans else ("unknown", None, {})
    bound = [bool(r["client_bound"]) for r in records if r.get("client_bound") is not None]
    pressure = [float(r["client_backpressure_s"]) for r in records if r.get("client_backpressure_s") is not None]
    out: dict[str, Any] = {
        "arrivals": len(arrivals),
        "offered_rate_rps": (len(arrivals) - 1) / arrival_span if arrival_span > 0 else None,
        "interarrival_cv": cv([b - a for a, b in zip(arrivals, arrivals[1:])]),
        "inflight_peak": max((lvl for _, lvl in steps), default=0),
        "inflight_mean": sum(e - s for s, e in spans) / duration if duration > 0 else None,
        "client_bound_share": sum(bound) / len(bound) if bound else None,
        "client_backpressure_p95_s": percentile(pressure, 95),
        "client_backpressure_max_s": max(pressure) if pressure else None,
        "load_verdict": verdict, "duration_s": duration,
        "steady_start_unix": window[0] if window else None, "steady_end_unix": window[1] if window else None,
        "steady_s": (window[1] - window[0]) if window else None, **fit,
    }
    if expect is not None:
        out.update(_matched(out, expect))
    return out


def _matched(load: Mapping[str, Any], expect: Expect) -> dict[str, Any]:
    verdict, rate = load["load_verdict"], load.get("offered_rate_rps")
    if expect.kind == "closed":
        ok = verdict == f"closed-loop {int(expect.value)}"
        why = f"load is {verdict}" + ("" if ok else f", not closed-loop {int(expect.value)}")
    else:
        near = rate is not None and abs(rate - expect.value) <= TOLERANCE * expect.value
        ok = verdict == "poisson" and near
        shown = "-" if rate is None else f"{rate:.3g}"
        why = f"load is {verdict} at {shown} req/s, expected poisson at {expect.value:g} req/s ± 10%"
    return {"expected": expect.text, "expect_matched": ok, "expect_note": why}


def cell_load(loads: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A cell's load over its rounds: their common verdict (``mixed (...)`` when they differ) and
    the median offered rate."""
    verdicts = [str(x.get("load_verdict")) for x in loads]
    counts = {v: verdicts.count(v) for v in dict.fromkeys(verdicts)}
    verdict = verdicts[0] if len(counts) == 1 else "mixed (" + ", ".join(f"{v} ×{n}" for v, n in counts.items()) + ")"
    rates = [float(x["offered_rate_rps"]) for x in loads if x.get("offered_rate_rps") is not None]
    return {"load_verdict": verdict if verdicts else None, "offered_rate_rps": median(rates)}


def same_load(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """None when two loads (verdict, offered_rate_rps) are the same, else why they differ."""
    va, vb = a.get("load_verdict"), b.get("load_verdict")
    if va != vb:
        return f"loads differ: {va} against {vb}"
    if str(va).startswith("closed-loop"):
        return None
    ra, rb = a.get("offered_rate_rps"), b.get("offered_rate_rps")
    if ra and rb and abs(rb - ra) > TOLERANCE * max(ra, rb):
        return f"loads differ: offered {ra:.3g} against {rb:.3g} req/s, more than 10% apart"
    return None


def steady_records(records: Sequence[Record], load: Mapping[str, Any]) -> list[Record]:
    """The requests that arrived inside the round's steady window."""
    lo, hi = load.get("steady_start_unix"), load.get("steady_end_unix")
    if lo is None or hi is None:
        return []
    return [r for r in records if r.get("start_unix") is not None and lo <= float(r["start_unix"]) <= hi]


def steady_window(records: Sequence[Record], scenario: str, rnd: int,
                  engine: str | None = None) -> tuple[float, float, str]:
    """(start, end, note) of a round's steady window in the latest run that ran it; ValueError
    when there is none, or when several engines ran it apart and ``engine`` does not pick one."""
    from .runs import group_rounds

    rounds = [(key, rs) for key, rs in group_rounds(records).items()
              if key[2] == scenario and str(key[3]) == str(rnd) and (engine is None or key[1] == engine)]
    if not rounds:
        raise ValueError(f"no records of round {rnd} of {scenario}" + (f" on {engine}" if engine else ""))
    run = rounds[-1][0][0]  # plan order: the latest run's rounds come last
    windows: dict[str, tuple[float | None, float | None]] = {}
    for (r_run, r_engine, _, _), rs in rounds:
        if r_run == run:
            load = round_load(rs)
            windows[r_engine] = (load["steady_start_unix"], load["steady_end_unix"])
    if any(lo is None or hi is None for lo, hi in windows.values()):
        raise ValueError(f"too few requests for a steady window (run {run})")
    start = max(float(lo) for lo, _ in windows.values() if lo is not None)
    end = min(float(hi) for _, hi in windows.values() if hi is not None)
    if end <= start:
        raise ValueError(f"{' and '.join(windows)} ran it at different times: add the engine, "
                         f"e.g. scenario:{scenario}#{rnd}:steady:{next(iter(windows))}")
    return start, end, f"run {run}, steady window of {', '.join(windows)}"


def window_share(record: Record, lo: float, hi: float) -> float:
    """The share of a request's generation (first token to end) inside ``lo``..``hi``: how much of
    its output the window's throughput counts."""
    start = float(record["start_unix"]) + float(record.get("ttft_s") or 0.0)
    end = float(record["start_unix"]) + float(record.get("e2e_s") or 0.0)
    if end <= start:
        return 1.0 if lo <= end <= hi else 0.0
    return max(0.0, min(end, hi) - max(start, lo)) / (end - start)


def seconds_text(v: float) -> str:
    """Seconds for a line: whole from 10 s up, else two decimals."""
    return f"{v:.0f}" if v >= 10 else f"{v:.2f}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f} ms"


def load_line(load: Mapping[str, Any]) -> str:
    """One line, e.g. ``offered 0.48 req/s poisson (CV 1.02, fit not rejected), in flight <= 32 (mean
    30.1), client back-pressure P95 0 ms (0% client-bound), steady 182 of 200 s``."""
    rate = load.get("offered_rate_rps")
    spread = load.get("interarrival_cv")
    fit = {None: "no fit: too few arrivals", True: "fit rejected", False: "fit not rejected"}[load.get("fit_rejected")]
    detail = f"CV {spread:.2f}" if spread is not None else "CV -"
    if not str(load["load_verdict"]).startswith("closed-loop"):
        detail += f", {fit}"
    mean, share = load.get("inflight_mean"), load.get("client_bound_share")
    steady, whole = load.get("steady_s"), load.get("duration_s") or 0.0
    text = (f"{load['arrivals']} arrivals, offered {'-' if rate is None else f'{rate:.3g}'} req/s "
            f"{load['load_verdict']} ({detail}), in flight <= {load['inflight_peak']}"
            f" (mean {'-' if mean is None else f'{mean:.1f}'}), client back-pressure P95 "
            f"{_ms(load.get('client_backpressure_p95_s'))}"
            f" ({'-' if share is None else f'{share * 100:.0f}%'} client-bound), "
            f"steady {'-' if steady is None else seconds_text(steady)} of {seconds_text(whole)} s")
    if "expect_matched" in load:
        text += f"; expected {load['expected']}: {'matched' if load['expect_matched'] else 'NOT matched'}"
    return text


def load_lines(records: Path | Sequence[Path], expect: str | None = None) -> list[str]:
    """``RUN ENGINE SCENARIO#ROUND: <load line>`` for every round of a records directory (or
    several proxies' directories), in the order the rounds started: for the demo's printout.
    Raises :class:`.merge.MergeError` for a directory that cannot be read."""
    from .merge import load_many
    from .runs import group_rounds

    paths = [records] if isinstance(records, Path) else list(records)
    recs, _ = load_many(paths)
    wanted = parse_expect(expect) if expect else None
    groups = group_rounds(recs)
    several = len({key[0] for key in groups}) > 1
    return [f"{(run + ' ') if several else ''}{engine} {scenario}#{rnd}: {load_line(round_load(rs, wanted))}"
            for (run, engine, scenario, rnd), rs in groups.items()]
