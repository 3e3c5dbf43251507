"""``summary.md`` of ``evidence summarize``: tables to paste into a report.

Rows in plan order (the order the rounds first appear in the records), milliseconds and per cent
(``summary.json`` and the CSV files keep seconds and ratios, named in their columns), failure
reasons beside the medians, and each table says which side measured it.  A round announced more
than once in a run is listed first, its announcements shown as rounds of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from exporter.core.stats import MIN_BOOTSTRAP_REQUESTS

from .decode import DECODE_KEYS
from .enginelog import engine_log_lines
from .experiment import load_line, round_name, seconds_text
from .noise import fmt_delta, fmt_noise, human, unit_of
from .proxyadded import ADDED_COLS, ADDED_NOTE, UNKNOWN, t0_text
from .ttftparts import MD_COLS as PART_COLS
from .ttftparts import NOTE as PARTS_NOTE
from .ttftparts import md_rows as part_rows
from .turns import NOTE as TURNS_NOTE
from .turns import SESSION_COLS, SESSION_NOTE, TURN_COLS
from .turns import TITLES as TURN_TITLES

__all__ = ["summary_markdown", "md_table", "PROXY_SIDE", "title_of"]

PROXY_SIDE = "proxy-side, from requests.jsonl"
_TITLES = {
    "success": "success", "requests": "requests", "rounds": "rounds", "ttft_p50_s": "TTFT P50",
    "ttft_p95_s": "TTFT P95", "tpot_p50_s": "TPOT P50", "tpot_p95_s": "TPOT P95", "e2e_p95_s": "E2E P95",
    "output_throughput_tok_s": "throughput", "goodput_ratio": "goodput", "goodput_tok_s": "goodput",
    "success_ratio": "success", "failure_reasons": "failures", "load_verdict": "load",
    "ttfb_p50_s": "TTFB P50", "ttfb_p95_s": "TTFB P95", "ttfe_p50_s": "TTFE P50", "ttfe_p95_s": "TTFE P95",
    "delta_pct": "delta", "value_a": "A", "value_b": "B",
    "ttft_s": "TTFT", "queue_s": "queue", "prefill_s": "prefill", "outside_s": "outside engine",
    "engine_timing": "engine clock",
    "t0_source": "t0", "proxy_added_n": "requests", "proxy_added_p50_s": "proxy added P50",
    "proxy_added_p95_s": "proxy added P95", "client_ttft_p95_s": "client TTFT P95",
    "itl_p50_med_s": "ITL med P50", "itl_p95_med_s": "ITL med P95", "itl_p99_med_s": "ITL med P99",
    "itl_max_s": "ITL max", "decode_stalls": "stalls", "tokens_per_event_mean": "tokens/event",
    "ttfo_p50_s": "TTFO P50", "ttfo_p95_s": "TTFO P95", "spec_acceptance_ratio": "spec acceptance",
    "itl_requests": "with ITL", "ttfo_n": "with TTFO", "e2e_p50_s": "E2E P50",
}
_FIGURES = ["ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s", "e2e_p95_s", "output_throughput_tok_s",
            "goodput_ratio", "goodput_tok_s"]
_MEDIAN_NOISY = ["ttft_p95_s", "tpot_p95_s", "e2e_p95_s", "output_throughput_tok_s", "goodput_ratio", "goodput_tok_s"]
_VARIANT_COLS = ["engine", "scenario", "success", "ttft_p50_s", "ttft_p95_s", "ttfb_p50_s", "ttfb_p95_s",
                 "ttfe_p50_s", "ttfe_p95_s"]
Fmt = Callable[[Mapping[str, Any], str], str]


def title_of(key: str) -> str:
    """A column header: a short title and the unit of a human table (``TTFT P95 ms``)."""
    unit = unit_of(key)
    title = _TITLES.get(key) or TURN_TITLES.get(key) or (key[:-2] if unit == "ms" else key)
    return f"{title} {unit}" if unit else title


def _cell(row: Mapping[str, Any], key: str) -> str:
    v = row.get(key)
    if isinstance(v, dict):
        return ", ".join(f"{k} {n}" for k, n in v.items()) or "-"
    return human(key, v)


def md_table(rows: list[dict[str, Any]], cols: list[str], fmt: Mapping[str, Fmt] | None = None,
             width: int | None = None, keep: int = 2) -> list[str]:
    """A Markdown table; with ``width``, split into tables of the first ``keep`` columns (what a row
    is) and as many of the others as keep every line within ``width`` characters, each after the
    first saying which columns it goes on with (a column too wide alone gets a table of its own)."""
    fmt = fmt or {}
    cells = [[title_of(c) for c in cols]] + [[fmt[c](r, c) if c in fmt else _cell(r, c) for c in cols] for r in rows]
    groups = [list(range(len(cols)))] if width is None else _groups(cells, keep, width)
    lines: list[str] = []
    for n, group in enumerate(groups):
        if n:
            lines += ["", f"(continued: {', '.join(cells[0][i] for i in group[keep:])} of the rows above)", ""]
        lines += ["| " + " | ".join(cells[0][i] for i in group) + " |", "|" + "---|" * len(group)]
        lines += ["| " + " | ".join(row[i] for i in group) + " |" for row in cells[1:]]
    return lines


def _groups(cells: list[list[str]], keep: int, width: int) -> list[list[int]]:
    """Column indices per table: the first ``keep`` in each, the others packed in order while the
    widest row stays within ``width`` (``| a | b |``: each cell plus 3, plus 1)."""
    widths = [max(len(row[i]) for row in cells) + 3 for i in range(len(cells[0]))]
    base = 1 + sum(widths[:keep])
    groups: list[list[int]] = []
    for i in range(keep, len(widths)):
        if groups and base + sum(widths[j] for j in groups[-1][keep:]) + widths[i] <= width:
            groups[-1].append(i)
        else:
            groups.append([*range(keep), i])
    return groups or [list(range(len(widths)))]


def _uncertain(row: Mapping[str, Any], key: str) -> str:
    """The share of requests whose timing uncertainty exceeds 10 % of their TTFT, in per cent."""
    v = row.get(key)
    return "-" if v is None else f"{v * 100:.1f} %"


UNCERTAIN_NOTE = ("uncertain: the share of requests whose timing uncertainty (the proxy's event-loop lag while "
                  "they were in flight, `timing_uncertainty_s`) exceeds 10 % of their TTFT; above 5 % the "
                  "round's TTFT figures may be off by more than a tenth (a CPU-bound host?), and "
                  "`evidence summarize` warns on stderr.")


def _run_cols(summary: Mapping[str, Any]) -> list[str]:
    """A run column only where the records hold several runs."""
    return ["run"] if len(summary.get("runs") or []) > 1 else []


def _head(summary: Mapping[str, Any]) -> list[str]:
    runs = summary.get("runs") or []
    lines = ["# Round tables", "",
             f"Every table here is {PROXY_SIDE} (the proxy's own record of each request), unless it says "
             "otherwise. Times in ms, shares in %; summary.json and the CSV files keep base units (seconds, "
             "ratios 0..1) and name them in their columns (ttft_p95_s, goodput_ratio).", "",
             (summary.get("slo_source") or {}).get("text", ""), ""]
    if len(runs) > 1:
        lines += ["Runs (one per proxy start; rounds of different runs are never merged, `--run ID` picks one): "
                  + ", ".join(f"{r['run_id']} ({r['rounds']} rounds)" for r in runs), ""]
    elif runs:
        lines += [f"Run: {runs[0]['run_id']}", ""]
    return lines


def _repeated(summary: Mapping[str, Any]) -> list[str]:
    """The rounds announced more than once in a run, each announcement shown as a round of its own."""
    rows = summary.get("repeated_rounds") or []
    if not rows:
        return []
    lines = ["**Rounds announced more than once** (cleared or replaced, then set again in the same run): each "
             "announcement is a round of its own below, the later ones labelled `ROUND (again at HH:MM:SSZ)` "
             "(UTC), never merged into one:", ""]
    for row in rows:
        who = f"{row['run']} " if len(summary.get("runs") or []) > 1 else ""
        spans = ", ".join(f"`{s['label']}` {s['start_utc']} to {s['end_utc'] or 'the end of the log'} "
                          f"({s['requests']} requests)" for s in row["spans"])
        lines.append(f"- {who}{row['engine']} {round_name(row['scenario'], row['round'])}: "
                     f"{row['announcements']} announcements: {spans}")
    return lines + [""]


def _medians(summary: Mapping[str, Any], width: int | None = None) -> list[str]:
    lines = [f"## Median of rounds ({PROXY_SIDE})", "",
             "Per engine × scenario (success counts add up over rounds). Beside each median: [min–max over rounds] "
             f"and, with at least {MIN_BOOTSTRAP_REQUESTS} requests, (CI lo–hi): a bootstrap 95% interval of the "
             "median. Goodput: requests that met their SLO over judged requests (all but client aborts).", ""]
    fmt: dict[str, Fmt] = {c: fmt_noise for c in _MEDIAN_NOISY}
    fmt["uncertain"] = _uncertain
    cols = _run_cols(summary) + ["engine", "scenario", "rounds", "success", "requests", *_MEDIAN_NOISY,
                                 "uncertain", "failure_reasons", "load_verdict"]
    return lines + md_table(summary["medians"], cols, fmt, width, keep=len(_run_cols(summary)) + 2) + [
        "", UNCERTAIN_NOTE]


def _compared(summary: Mapping[str, Any]) -> list[str]:
    rows = summary.get("engines_compared") or []
    if not rows:
        return []
    lines = ["", f"## Engines side by side ({PROXY_SIDE})", "", "B against A, medians of rounds, values in the "
             "metric's unit (ms, %, tok/s).", "", summary.get("noise_rule", ""), ""]
    value: Fmt = lambda r, c: human(r["metric"], r.get(c))  # noqa: E731
    return lines + md_table(rows, _run_cols(summary) + ["scenario", "metric", "a", "b", "value_a", "value_b",
                                                        "delta_pct", "verdict", "why"],
                            {"delta_pct": fmt_delta, "value_a": value, "value_b": value})


def _loads(summary: Mapping[str, Any]) -> list[str]:
    lines = ["", f"## Load per round ({PROXY_SIDE}: arrivals at the proxy, requests in flight, client "
             "back-pressure)", ""]
    several = len(summary.get("runs") or []) > 1
    for load in summary.get("load") or []:
        who = f"{load['run']} " if several else ""
        lines.append(f"- {who}{load['engine']} {round_name(load['scenario'], load['round'])}: {load_line(load)}")
    return lines


def _rounds(summary: Mapping[str, Any]) -> list[str]:
    """Each round twice: whole, then over its steady window."""
    rows = []
    for whole, steady in zip(summary["rounds"], summary.get("steady_rounds") or [{}] * len(summary["rounds"])):
        rows.append({**whole, "window": "whole"})
        span = steady.get("steady_s")
        rows.append({**steady, "window": "steady" + ("" if span is None else f" {seconds_text(span)} s")})
    cols = _run_cols(summary) + ["engine", "scenario", "round", "window", "success", "requests", *_FIGURES,
                                 "uncertain", "failure_reasons"]
    return ["", f"## Rounds: whole and steady window ({PROXY_SIDE})", "",
            "The steady window cuts off ramp-up and drain. Its figures count the requests that arrived "
            "inside it; its throughput and goodput tok/s count each request's output by the share of its "
            "generation (first token to end) inside the window, over the window's length. " + UNCERTAIN_NOTE,
            ""] + md_table(rows, cols, {"uncertain": _uncertain})


def _variants(summary: Mapping[str, Any]) -> list[str]:
    rows = summary.get("ttft_variants") or []
    if not rows:
        return []
    lines = ["", f"## TTFT variants ({PROXY_SIDE})", "",
             "Successful requests: ttft = first visible text, ttfb = first body byte, ttfe = first event with "
             "choices (what vLLM's bench client stamps). Pooled: each P50/P95 is over every successful request "
             "of the scenario's rounds together, not a median of rounds as in the round tables above.", ""]
    lines += md_table(rows, _run_cols(summary) + _VARIANT_COLS)
    if any(r.get("ttfb_n", 0) < r.get("success", 0) or r.get("ttfe_n", 0) < r.get("success", 0) for r in rows):
        lines += ["", "Some records carry no ttfb_s/ttfe_s (written by an older proxy): those variants count "
                      "only the records that have them, and show - where none do."]
    return lines


def _decode(summary: Mapping[str, Any]) -> list[str]:
    """Per round and route: the ITL distribution, TTFT beside TTFO, spec acceptance (:mod:`.itl`);
    then the pooling routes' rounds, apart."""
    lines: list[str] = []
    rows = summary.get("decode") or []
    if rows:
        cols = [*_run_cols(summary), "engine", "scenario", "round"]
        cols += ["route"] if len({r["route"] for r in rows}) > 1 else []
        cols += ["success", "itl_requests", *DECODE_KEYS[:6], "ttft_p50_s", "ttft_p95_s"]
        cols += ["ttfo_n", "ttfo_p50_s", "ttfo_p95_s"] if any(r.get("ttfo_n") for r in rows) else []
        cols += ["spec_acceptance_ratio"] if any(r.get("spec_requests") for r in rows) else []
        lines += ["", f"## Decode: gaps between tokens, TTFT and TTFO ({PROXY_SIDE})", "",
                  summary.get("decode_note", "") + ".", ""] + md_table(rows, cols)
    pooled = summary.get("pooling") or []
    if pooled:
        lines += ["", f"## Embeddings and rerank ({PROXY_SIDE})", "", summary.get("pooling_note", "") + ".", ""]
        lines += md_table(pooled, [*_run_cols(summary), "engine", "scenario", "round", "route", "requests",
                                   "success", "e2e_p50_s", "e2e_p95_s"])
    return lines


def _added(summary: Mapping[str, Any]) -> list[str]:
    """What the proxy added to each round's TTFT, and how its t0 was taken; nothing where no record
    says (an older proxy's)."""
    rows = summary.get("proxy_added") or []
    if not any(r.get("proxy_added_n") or set(r.get("t0_sources") or {}) - {UNKNOWN} for r in rows):
        return []
    t0: Fmt = lambda r, _: t0_text(r.get("t0_sources") or {UNKNOWN: 0})  # noqa: E731
    return (["", f"## What the proxy added to TTFT ({PROXY_SIDE})", "", ADDED_NOTE, ""]
            + md_table(list(rows), _run_cols(summary) + ["engine", "scenario", "round", *ADDED_COLS], {"t0_source": t0}))


def _parts(summary: Mapping[str, Any]) -> list[str]:
    """Where each round's TTFT went, where the engine gave its own clock; the engine log's join."""
    rows = summary.get("ttft_parts")
    if rows is None:
        return []
    lines = ["", f"## Where TTFT goes ({PROXY_SIDE}, split by the engine's own clock)", "", PARTS_NOTE, ""]
    if summary.get("engine_log"):
        notes, warnings = engine_log_lines(summary["engine_log"])
        lines += [f"- {line}" for line in notes + warnings] + [""]
    shown = part_rows(rows)
    if shown:
        lines += md_table(shown, _run_cols(summary) + ["engine", "scenario", "round", *PART_COLS])
    untimed = [f"{r['engine']} {round_name(r['scenario'], r['round'])}" for r in rows if not r.get("engine_timing")]
    if untimed:
        lines += ["", "No engine timing: " + ", ".join(untimed) + " (vLLM gives it with "
                  "--enable-per-request-metrics; SGLang in its request log: `evidence summarize --engine-log DIR`)."]
    return lines


def _sessions(summary: Mapping[str, Any], width: int | None = None) -> list[str]:
    """Per turn and per session, where the requests carried a session id."""
    if not summary.get("turns"):
        return []
    keep = len(_run_cols(summary)) + 2
    return (["", f"## Per turn ({PROXY_SIDE})", "", TURNS_NOTE, ""]
            + md_table(summary["turns"], _run_cols(summary) + TURN_COLS, width=width, keep=keep + 1)  # and turn
            + ["", f"## Per session ({PROXY_SIDE})", "", SESSION_NOTE, ""]
            + md_table(summary.get("session_cells") or [], _run_cols(summary) + SESSION_COLS, width=width, keep=keep))


def _histograms(summary: Mapping[str, Any]) -> list[str]:
    if not summary.get("histogram_vs_exact"):
        return []
    keys = ("ttft", "tpot", "e2e")
    cols = ["engine", "scenario"] + [f"{k}_p95_{x}" for k in keys for x in ("exact_s", "histogram_s", "rel_error")]
    return ["", "## Histogram P95 against the exact P95 (Prometheus histograms beside the proxy's records)", "",
            "ms; rel_error = (histogram − exact) / exact, as a ratio.", ""] + md_table(summary["histogram_vs_exact"], cols)


def headline_markdown(summary: Mapping[str, Any], width: int | None = None) -> str:
    """The median-of-rounds table and one load line per round (and the per-turn tables, where there
    were sessions): what a terminal shows first; with ``width``, each table split so that its lines
    fit it (:func:`md_table`)."""
    return "\n".join(_medians(summary, width) + _loads(summary) + _sessions(summary, width))


def summary_markdown(summary: Mapping[str, Any]) -> str:
    md = _head(summary) + _repeated(summary) + _medians(summary) + _compared(summary) + _loads(summary) + _rounds(summary)
    md += _variants(summary) + _decode(summary) + _added(summary) + _parts(summary) + _sessions(summary)
    if summary.get("sources"):
        md += ["", "Records merged (the union of requests; same run, engine, scenario and round form one round):", ""]
        md += [f"- {note}" for note in summary["sources"]]
    md += _histograms(summary)
    return "\n".join(md) + "\n"
