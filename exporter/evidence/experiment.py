"""The experiment itself: was the load what the report says, did the client keep up, which part
of a round was steady.  Proxy-side, from the records' ``start_unix`` (arrival at the proxy),
``e2e_s``, ``client_bound`` and ``client_backpressure_s``.

Per round (:func:`round_load`): arrivals; the offered rate, (arrivals − 1) / (last − first
arrival); the inter-arrival coefficient of variation; peak and time-weighted mean in-flight
requests over the round (first arrival to last end); the share of ``client_bound`` requests;
the steady window and a load verdict, first that applies:

* ``too few``: fewer than :data:`MIN_ARRIVALS` (10) arrivals, or fewer than :data:`PER_SLOT` (4) ×
  the peak in flight (a closed loop of C with fewer than 4 × C requests is mostly ramp-up and
  drain), unless the arrivals themselves pass the Poisson test (an open loop's arrivals do not
  depend on how many are in flight): no verdict can be told, and none is guessed (never ``bursty``);
* ``closed-loop C``: C is the level held longest, and either the in-flight count is at C (within
  10% of C: exactly C below 10 clients) for at least 90% of the steady window (from the first to
  the last moment at C: ramp-up and drain cut off), or C is also the peak, the count is at C for
  at least half of the steady window and nine in ten of the later arrivals came within the
  clients' turnaround of the completion that freed their slot (:func:`.arrivals.slot_lags`: at
  most half the median E2E, plus the records' timing uncertainty).  The second test is what a
  real client gives: it takes a moment between a response and its next request, the more so on
  a CPU-bound host, and an engine that batches ends its requests together;
* ``poisson``: the Anderson-Darling test of an exponential fit (:mod:`.arrivals`) does not reject
  the inter-arrival gaps inside the open-loop steady window at the 1% level;
* ``bursty``: the fit is rejected and the gaps vary more than an exponential's (CV > 1);
* ``unknown``: anything else (more regular than Poisson, or no fit).

A closed loop's arrival rate follows the engine's speed, so two closed loops are the same load
when their C is the same; open loops when their verdicts match and their offered rates are within
10% (:func:`same_load`).  Either way the requests must be alike too: their mean prompt and output
lengths, as the engine counted them (usage), within 10% (:func:`same_workload`: two bench clients'
defaults differ, SGLang's random dataset draws lengths up to the asked one unless
``--random-range-ratio 1``).  The one-line form (:func:`load_line`) shows no offered rate for a
closed loop or for too few arrivals: there it measures the engine, or nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.core.stats import median, percentile

from .arrivals import (
    TOLERANCE,
    closed_steady,
    cv,
    exponential_fit,
    inflight_steps,
    near,
    open_steady,
    peak,
    plateau,
    slot_lags,
    time_at,
)

__all__ = ["Expect", "parse_expect", "round_load", "load_line", "load_lines", "same_load", "same_workload",
           "steady_records", "cell_load", "steady_window", "window_share", "seconds_text", "round_name",
           "CLOSED_SHARE", "MIN_ARRIVALS", "PER_SLOT", "TOO_FEW", "TURN_SHARE", "TURNAROUND", "LAG_SHARE"]

#: Share of the steady window at C that makes a closed loop.
CLOSED_SHARE = 0.90
#: Fewest arrivals for any verdict but ``too few``.
MIN_ARRIVALS = 10
#: Fewest arrivals per in-flight slot at the peak (a closed loop of C needs 4 × C requests).
PER_SLOT = 4
#: The verdict of a round with too few arrivals to tell its load.
TOO_FEW = "too few"
#: A closed loop whose clients take a moment between requests: share of the steady window at C.
TURN_SHARE = 0.5
#: ... and its clients' turnaround, at most this share of the median E2E (plus timing uncertainty) ...
TURNAROUND = 0.5
#: ... for at least this share of the arrivals after the first C.
LAG_SHARE = 0.9

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


def _closed(spans: list[tuple[float, float]], steps: list[tuple[float, int]], slack_s: float) -> tuple[
        int, tuple[float, float], dict[str, Any]] | None:
    """(C, steady window, figures) when the round is a closed loop of C (see the module), else None."""
    level = plateau(steps)
    window = closed_steady(steps, level) if level else None
    if not window or window[1] <= window[0]:
        return None
    span = window[1] - window[0]
    at_c = sum(t for lvl, t in time_at(steps, *window).items() if near(lvl, level)) / span
    if at_c >= CLOSED_SHARE:
        return level, window, {"at_plateau_share": at_c}
    lags = slot_lags(spans, level)
    if level != peak(steps) or at_c < TURN_SHARE or not lags:
        return None
    e2e = median([e - s for s, e in spans]) or 0.0
    bound = TURNAROUND * e2e + slack_s
    within = sum(1 for lag in lags if lag <= bound) / len(lags)
    if within < LAG_SHARE:
        return None
    return level, window, {"at_plateau_share": at_c, "turnaround_p90_s": percentile(lags, 90),
                           "turnaround_bound_s": bound}


def _too_few(n: int, peak: int) -> str | None:
    """Why a round of ``n`` arrivals with ``peak`` in flight is too few to tell its load, or None."""
    if n < MIN_ARRIVALS:
        return f"{n} arrivals: a verdict needs {MIN_ARRIVALS}"
    if n < PER_SLOT * peak:
        return f"{n} arrivals at up to {peak} in flight: a verdict needs {PER_SLOT} × {peak} = {PER_SLOT * peak}"
    return None


def _verdict(arrivals: list[float], steps: list[tuple[float, int]], spans: list[tuple[float, float]],
             slack_s: float = 0.0) -> tuple[str, tuple[float, float] | None, dict[str, Any]]:
    """(verdict, steady window, fit figures) of one round."""
    closed = _closed(spans, steps, slack_s)
    few = _too_few(len(arrivals), peak(steps))
    if closed is not None:
        level, at_c, figures = closed
        if few:
            return TOO_FEW, at_c, {**figures, "verdict_note": few}
        return f"closed-loop {level}", at_c, figures
    window = open_steady(arrivals)
    if len(arrivals) < MIN_ARRIVALS:
        return TOO_FEW, window, {"verdict_note": few}
    verdict, fit = _open_verdict(arrivals, window)
    if few and verdict != "poisson":  # an open loop's own arrivals tell it; anything else needs more
        return TOO_FEW, window, {**fit, "verdict_note": few}
    return verdict, window, fit


def _open_verdict(arrivals: list[float], window: tuple[float, float] | None) -> tuple[str, dict[str, Any]]:
    """``poisson``, ``bursty`` or ``unknown``, from the gaps inside the open-loop steady window."""
    inside = [a for a in arrivals if window and window[0] <= a <= window[1]]
    fit = exponential_fit([b - a for a, b in zip(inside, inside[1:])])
    figures: dict[str, Any] = {"fit": "anderson-darling exponential, rate estimated, 1% level",
                               "fit_n": fit.n if fit else 0, "fit_a2": fit.a2 if fit else None,
                               "fit_rejected": fit.rejected if fit else None}
    if fit is None:
        return "unknown", figures
    if not fit.rejected:
        return "poisson", figures
    spread = cv([b - a for a, b in zip(inside, inside[1:])])
    return ("bursty" if spread is not None and spread > 1.0 else "unknown"), figures


def round_load(records: Sequence[Record], expect: Expect | None = None) -> dict[str, Any]:
    """The load figures of one round (base units: seconds, requests/s, shares 0..1)."""
    spans = _spans(records)
    arrivals = sorted(s for s, _ in spans)
    steps = inflight_steps(spans)
    first, last_end = (arrivals[0], max(e for _, e in spans)) if spans else (0.0, 0.0)
    duration = last_end - first
    arrival_span = arrivals[-1] - arrivals[0] if arrivals else 0.0
    uncertainty = [float(r["timing_uncertainty_s"]) for r in records
                   if isinstance(r.get("timing_uncertainty_s"), (int, float))]
    slack = 2 * (median(uncertainty) or 0.0)  # an arrival's stamp and its slot's end, each as late as that
    verdict, window, fit = _verdict(arrivals, steps, spans, slack) if spans else (TOO_FEW, None, {
        "verdict_note": _too_few(0, 0)})
    prompt = [int(r["prompt_tokens"]) for r in records if isinstance(r.get("prompt_tokens"), int)]
    output = [int(r["completion_tokens"]) for r in records
              if r.get("outcome") == "success" and isinstance(r.get("completion_tokens"), int)]
    bound = [bool(r["client_bound"]) for r in records if r.get("client_bound") is not None]
    pressure = [float(r["client_backpressure_s"]) for r in records if r.get("client_backpressure_s") is not None]
    out: dict[str, Any] = {
        "arrivals": len(arrivals),
        "offered_rate_rps": (len(arrivals) - 1) / arrival_span if arrival_span > 0 else None,
        "interarrival_cv": cv([b - a for a, b in zip(arrivals, arrivals[1:])]),
        "inflight_peak": peak(steps),
        "inflight_mean": sum(e - s for s, e in spans) / duration if duration > 0 else None,
        "client_bound_share": sum(bound) / len(bound) if bound else None,
        "client_backpressure_p95_s": percentile(pressure, 95),
        "client_backpressure_max_s": max(pressure) if pressure else None,
        "prompt_tokens_mean": sum(prompt) / len(prompt) if prompt else None,
        "output_tokens_mean": sum(output) / len(output) if output else None,
        "load_verdict": verdict, "duration_s": duration,
        "steady_start_unix": window[0] if window else None, "steady_end_unix": window[1] if window else None,
        "steady_s": (window[1] - window[0]) if window else None, **fit,
    }
    if expect is not None:
        out.update(_matched(out, expect))
    return out


def _matched(load: Mapping[str, Any], expect: Expect) -> dict[str, Any]:
    verdict, rate = load["load_verdict"], load.get("offered_rate_rps")
    if verdict == TOO_FEW:
        return {"expected": expect.text, "expect_matched": None,
                "expect_note": f"too few arrivals to tell ({load.get('verdict_note')})"}
    if expect.kind == "closed":
        ok = verdict == f"closed-loop {int(expect.value)}"
        why = f"load is {verdict}" + ("" if ok else f", not closed-loop {int(expect.value)}")
    else:
        near = rate is not None and abs(rate - expect.value) <= TOLERANCE * expect.value
        ok = verdict == "poisson" and near
        shown = "-" if rate is None else f"{rate:.3g}"
        why = f"load is {verdict} at {shown} req/s, expected poisson at {expect.value:g} req/s ± 10%"
    return {"expected": expect.text, "expect_matched": ok, "expect_note": why}


#: a request's shape, as the engine counted it: (key, words in a "why")
WORKLOAD = {"prompt_tokens_mean": "prompt", "output_tokens_mean": "output"}


def cell_load(loads: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A cell's load over its rounds: their common verdict (``mixed (...)`` when they differ) and
    the median offered rate."""
    verdicts = [str(x.get("load_verdict")) for x in loads]
    counts = {v: verdicts.count(v) for v in dict.fromkeys(verdicts)}
    verdict = verdicts[0] if len(counts) == 1 else "mixed (" + ", ".join(f"{v} ×{n}" for v, n in counts.items()) + ")"

    def med(key: str) -> float | None:
        return median([float(x[key]) for x in loads if x.get(key) is not None])

    return {"load_verdict": verdict if verdicts else None, "offered_rate_rps": med("offered_rate_rps"),
            **{key: med(key) for key in WORKLOAD}}


def same_workload(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """None when two rounds' (or cells') requests are alike (mean prompt and output tokens within
    10%, or unknown on a side), else why they differ."""
    for key, words in WORKLOAD.items():
        xa, xb = a.get(key), b.get(key)
        if xa and xb and abs(xb - xa) > TOLERANCE * max(xa, xb):
            return f"workloads differ: {words} {xa:.0f} against {xb:.0f} tokens per request, more than 10% apart"
    return None


def same_load(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """None when two loads (verdict, offered_rate_rps, the requests' mean lengths) are the same,
    else why they differ."""
    va, vb = a.get("load_verdict"), b.get("load_verdict")
    if va != vb:
        return f"loads differ: {va} against {vb}"
    workload = same_workload(a, b)
    if workload:
        return workload
    if str(va).startswith("closed-loop") or va == TOO_FEW:
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


def _rate_text(load: Mapping[str, Any]) -> str:
    """The offered rate, where it says something of the load: not for a closed loop (its arrivals
    follow the engine's speed) nor for too few arrivals (32 requests sent at once are no rate)."""
    verdict, rate = str(load["load_verdict"]), load.get("offered_rate_rps")
    if verdict.startswith("closed-loop") or verdict == TOO_FEW:
        return ""
    return f"offered {'-' if rate is None else f'{rate:.3g}'} req/s "


def load_line(load: Mapping[str, Any]) -> str:
    """One line, e.g. ``200 arrivals (prompt/output 1024/128 tok), offered 0.48 req/s poisson (CV 1.02,
    fit not rejected), in flight <= 32 (mean 30.1), client back-pressure P95 0 ms (0% client-bound),
    steady 182 of 200 s``."""
    spread = load.get("interarrival_cv")
    verdict = str(load["load_verdict"])
    fit = {None: "no fit: too few arrivals", True: "fit rejected", False: "fit not rejected"}[load.get("fit_rejected")]
    detail = f"CV {spread:.2f}" if spread is not None else "CV -"
    if verdict == TOO_FEW:
        detail = str(load.get("verdict_note") or "too few arrivals")
    elif not verdict.startswith("closed-loop"):
        detail += f", {fit}"
    mean, share = load.get("inflight_mean"), load.get("client_bound_share")
    steady, whole = load.get("steady_s"), load.get("duration_s") or 0.0
    shape = "/".join("-" if load.get(k) is None else f"{load[k]:.0f}" for k in WORKLOAD)
    text = (f"{load['arrivals']} arrivals (prompt/output {shape} tok), {_rate_text(load)}"
            f"{verdict} ({detail}), in flight <= {load['inflight_peak']}"
            f" (mean {'-' if mean is None else f'{mean:.1f}'}), client back-pressure P95 "
            f"{_ms(load.get('client_backpressure_p95_s'))}"
            f" ({'-' if share is None else f'{share * 100:.0f}%'} client-bound), "
            f"steady {'-' if steady is None else seconds_text(steady)} of {seconds_text(whole)} s")
    if "expect_matched" in load:
        matched = {True: "matched", False: "NOT matched", None: "cannot tell"}[load["expect_matched"]]
        text += f"; expected {load['expected']}: {matched}"
    return text


def round_name(scenario: Any, rnd: Any) -> str:
    """A round as lines name it: ``short-c4#1``; a scenario without a round ``short-c4 (no round)``;
    requests sent while no scenario was announced ``unannounced (scenario none)``."""
    if scenario in (None, "none"):
        return "unannounced (scenario none)" if rnd is None else f"none#{rnd}"
    return f"{scenario} (no round)" if rnd is None else f"{scenario}#{rnd}"


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
    return [f"{(run + ' ') if several else ''}{engine} {round_name(scenario, rnd)}: {load_line(round_load(rs, wanted))}"
            for (run, engine, scenario, rnd), rs in groups.items()]
