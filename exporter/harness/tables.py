"""The load driver's round tables: ``rounds.csv`` and ``summary.json`` on disk, and the text
table printed by ``load`` and ``demo``.

Every figure here is client-side: timed by the load driver from its own send to the last byte
it read, so it includes the network and the way through the proxy; the proxy's records (``evidence
summarize``) are the primary numbers.  The text table is for people: milliseconds and
percent.  The CSV and JSON keep base units, named in each column (``_s`` seconds, ``_ratio``
and ``_attainment`` 0..1, ``_tok_s`` tokens per second; the rest are counts).

Each figure is the median over rounds with, beside it, the rounds' spread ``[min-max]``; a
bootstrap 95 % interval of the median follows on its own line when the rounds had enough
requests, for the figures whose interval has a width (a figure that resampling cannot move,
such as the throughput of fixed-length outputs, has none, and one round has no round-to-round
noise estimate at all).  Goodput is the SLO's: requests that met the SLO over judged requests
(failures count against it), and the output tokens of those requests per second.  Beside them,
the driver's own schedule: the P50/P99 of how late each request went out (actual minus
intended send time) and, open loop, the E2E P95 counted from the intended send time.

Beside the load, the prompt length: the one asked for (``in tok``: the cell's ``input_tokens``, a
trace's median ``input_length``) and the one the engine counted (``prompt tok``: the median of its
``usage.prompt_tokens``; a session's first turns).  The driver's prompts are words unless ``load
--tokenizer`` frames them in the engine's tokens, and a real model's tokenizer cuts words into
several tokens: :func:`prompt_warnings` names each cell whose counted length is more than 10 %
off the asked one.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from exporter.core.stats import median

__all__ = ["ROUND_COLUMNS", "TITLE", "write_tables", "round_table", "failure_summary", "add_prompt_lengths",
           "prompt_counts", "counted_prompts", "prompt_warnings", "PROMPT_TOLERANCE"]

ROUND_COLUMNS = (
    "engine", "stage", "scenario", "round", "requests", "success", "failures", "failure_reasons",
    "duration_s", "success_output_tokens", "output_throughput_tok_s", "ttft_p50_s", "ttft_p95_s",
    "tpot_p50_s", "tpot_p95_s", "e2e_p95_s", "slo_ttft_attainment", "slo_tpot_attainment",
    "judged", "slo_met", "goodput_ratio", "goodput_output_tokens", "goodput_tok_s",
    "schedule_lag_p50_s", "schedule_lag_p99_s", "e2e_from_intended_p95_s", "prompt_tokens_p50",
)

#: the first line of every text table: where its numbers come from
TITLE = ("load driver's round table, client-side (timed at the client, network and the proxy included; "
         "the proxy's records are the primary numbers: evidence summarize)")

#: (median key, column title, scale, decimals) of the text table
_FIGURES: tuple[tuple[str, str, float, int], ...] = (
    ("output_throughput_tok_s", "tok/s", 1.0, 1),
    ("goodput_ratio", "goodput %", 100.0, 1),
    ("goodput_tok_s", "good tok/s", 1.0, 1),
    ("ttft_p95_s", "TTFT P95 ms", 1000.0, 1),
    ("tpot_p95_s", "TPOT P95 ms", 1000.0, 1),
    ("e2e_p95_s", "E2E P95 ms", 1000.0, 1),
    ("e2e_from_intended_p95_s", "sched E2E P95 ms", 1000.0, 1),
)


#: a cell whose counted prompt length (median) is further than this share from the asked one is warned about
PROMPT_TOLERANCE = 0.10

def prompt_counts(records: Iterable[Mapping[str, Any]]) -> list[int]:
    """``usage.prompt_tokens`` of each request that carried it; of a session, its first turn only
    (the later ones carry the history)."""
    return [int(r["prompt_tokens"]) for r in records
            if isinstance(r.get("prompt_tokens"), int) and r.get("turn") in (None, 1)]


def counted_prompts(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """A cell's prompt length as the engine counted it, over its rounds' records: median, min, max
    and how many requests carried it (:func:`prompt_counts`)."""
    counts = prompt_counts(records)
    return {"counted_p50": median(counts), "counted_min": min(counts, default=None),
            "counted_max": max(counts, default=None), "requests": len(counts)}


def add_prompt_lengths(summary: Mapping[str, Any], traced: Callable[[str, int], float | None], exact: bool) -> None:
    """Beside each cell's counted prompt length (:func:`counted_prompts`, from the runner), the length
    asked (``input_tokens``, or ``traced(trace, requests)``: a trace's median ``input_length``) and
    ``tokenizer``: whether the prompts were framed with the engine's tokenizer (``exact``)."""
    for entry in summary.get("cells", []):
        cell = entry["cell"]
        asked = traced(cell["trace"], cell["requests"]) if cell.get("trace") else cell["input_tokens"]
        entry["prompt_tokens"] = {"asked": asked, **(entry.get("prompt_tokens") or {}), "tokenizer": exact}


def _tok(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}"


def prompt_warnings(summaries: Sequence[Mapping[str, Any]]) -> list[str]:
    """One ``warning:`` line per cell whose engine-counted prompt length (median) is more than
    :data:`PROMPT_TOLERANCE` off the asked one (a session cell framed with the tokenizer is not: its
    first turn adds the chat template's tokens to the asked user text)."""
    out = []
    for s in summaries:
        for entry in s.get("cells", []):
            p, cell = entry.get("prompt_tokens") or {}, entry["cell"]
            asked, got = p.get("asked"), p.get("counted_p50")
            if asked is None or got is None or abs(got - asked) <= PROMPT_TOLERANCE * asked:
                continue
            what = "the trace's median input_length" if cell.get("trace") else "input_tokens"
            head = (f"warning: cell {s['engine']} {cell['scenario']}: asked {what} {_tok(asked)}, the engine counted "
                    f"{_tok(got)} prompt tokens (median{', first turns' if cell.get('sessions') else ''})")
            if not p.get("tokenizer") and cell.get("sessions"):
                out.append(f"{head}: each turn's new text is words, not the model's tokens; --tokenizer MODEL_DIR "
                           "makes it that many tokens (the chat template comes on top)")
            elif not p.get("tokenizer"):
                out.append(f"{head}: the prompts are words, not the model's tokens; give --tokenizer MODEL_DIR (the "
                           "engine's model directory or tokenizer.json) to make them equal")
            elif not cell.get("sessions"):
                out.append(f"{head} although --tokenizer was given: is it the tokenizer of the engine's model, or is "
                           "input_tokens shorter than what it adds itself (its BOS, its chat template)?")
    return out


def _rows(summary: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    for cell in summary.get("cells", []):
        yield from cell.get("rounds", [])


def write_tables(out_dir: Path, summary: Mapping[str, Any]) -> None:
    """``rounds.csv`` (one row per round) and ``summary.json`` (medians, noise, stops, sweeps)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "rounds.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, ROUND_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for row in _rows(summary):
            w.writerow({**row, "failure_reasons": json.dumps(row.get("failure_reasons", {}), sort_keys=True)})
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False), encoding="utf-8")


def _num(v: Any, scale: float, nd: int) -> str:
    return "-" if v is None else f"{v * scale:.{nd}f}"


def _figure(median: Mapping[str, Any], key: str, scale: float, nd: int) -> str:
    """``median [min-max]``; the spread only when the rounds differ."""
    text = _num(median.get(key), scale, nd)
    lo_hi = (median.get("spread") or {}).get(key)
    if lo_hi and None not in lo_hi and median.get("rounds", 1) > 1:
        lo, hi = _num(lo_hi[0], scale, nd), _num(lo_hi[1], scale, nd)
        text += f" [{lo}-{hi}]" if lo != hi else ""
    return text


def _ci_line(median: Mapping[str, Any]) -> str | None:
    """The 95 % intervals that have a width; never one that reads ``x-x``."""
    ci = median.get("ci95") or {}
    parts = []
    for key, title, scale, nd in _FIGURES:
        lo_hi = ci.get(key)
        if lo_hi and None not in lo_hi:
            lo, hi = _num(lo_hi[0], scale, nd), _num(lo_hi[1], scale, nd)
            if lo != hi:
                parts.append(f"{title} {lo}-{hi}")
    if not parts:
        return None
    one = "; one round: no round-to-round noise" if median.get("rounds", 1) < 2 else ""
    return "    95% CI of the median (requests resampled): " + ", ".join(parts) + one


def _lag(median: Mapping[str, Any]) -> str:
    p50, p99 = median.get("schedule_lag_p50_s"), median.get("schedule_lag_p99_s")
    return "-" if p50 is None or p99 is None else f"{p50 * 1000:.2f}/{p99 * 1000:.2f}"


def _sweep_lines(engine: str, sweep: Mapping[str, Any]) -> list[str]:
    best = sweep.get("best")
    unit = "req/s" if sweep["over"] == "rate" else "concurrent"
    head = f"{engine}: sweep {sweep['stage']} over {sweep['over']} (goodput target {sweep['goodput_target']}): "
    if best is None:
        head += "no level met the SLO"
    else:
        head += (f"highest level that met the SLO: {best['level']:g} {unit} ({best['scenario']}), goodput "
                 f"{_num(best['goodput_ratio'], 100, 1)} %, {_num(best['goodput_tok_s'], 1, 1)} tok/s")
    ended = sweep.get("ended_by") or {}
    lines = [head]
    if "level" in ended:
        lines.append(f"  ended at {ended['level']:g} {unit}: {ended['reason']}; "
                     f"SLO {_counts(ended.get('slo_results'))}; failures {_counts(ended.get('failure_reasons'))}")
        if ended.get("first_error"):
            lines.append(f"  first error: {ended['first_error']}")
    else:
        lines.append(f"  {ended.get('reason', '')}")
    return lines


def _counts(counts: Mapping[str, int] | None) -> str:
    shown = {k: v for k, v in (counts or {}).items() if v}
    return ", ".join(f"{k} {v}" for k, v in sorted(shown.items())) if shown else "none"


def _grid(rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns padded to their widest cell: text left, figures right."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


def _cell_rows(s: Mapping[str, Any]) -> list[tuple[list[str], str | None]]:
    out = []
    for cell in s.get("cells", []):
        m = cell["median"]
        figs = [_figure(m, key, scale, nd) for key, _, scale, nd in _FIGURES]
        p = cell.get("prompt_tokens") or {}
        out.append(([str(s["engine"]), cell["cell"]["scenario"], f"{m['success']}/{m['requests']}",
                     _tok(p.get("asked")), _tok(p.get("counted_p50")), *figs, _lag(m)], _ci_line(m)))
    return out


def _column_groups(rows: Sequence[Sequence[str]], width: int, keep: int = 2) -> list[list[int]]:
    """Column indices per grid: the first ``keep`` (engine, scenario) in each, the others packed in
    order while a line (cells padded to their widest, two spaces between) stays within ``width``."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    groups: list[list[int]] = []
    for i in range(keep, len(widths)):
        if groups and sum(widths[j] + 2 for j in groups[-1]) + widths[i] <= width:
            groups[-1].append(i)
        else:
            groups.append([*range(keep), i])
    return groups or [list(range(len(widths)))]


def round_table(summaries: Sequence[Mapping[str, Any]], width: int | None = None) -> str:
    """The text table: one line per cell (median [spread]), CI lines, stops and sweeps; with
    ``width``, its columns split into grids whose lines fit it (engine and scenario in each)."""
    head = ["engine", "scenario", "success", "in tok", "prompt tok", *(title for _, title, _, _ in _FIGURES),
            "lag P50/P99 ms"]
    cells = [row for s in summaries for row in _cell_rows(s)]
    rows = [head] + [r for r, _ in cells]
    lines = [TITLE]
    for n, group in enumerate([list(range(len(head)))] if width is None else _column_groups(rows, width)):
        grid = _grid([[row[i] for i in group] for row in rows])
        if n:
            lines.append(f"(continued: {', '.join(head[i] for i in group[2:])} of the cells above)")
        lines += [grid[0], "-" * max(len(g) for g in grid)]
        for text, (_, ci) in zip(grid[1:], cells):
            lines.append(text)
            if ci and n == 0:
                lines.append(ci)
    for s in summaries:
        for stop in s.get("stops", []):
            if not any(stop == sw.get("ended_by") for sw in s.get("sweeps", [])):
                lines.append(f"{s['engine']}: stage {stop['stage']} stopped after {stop['after']}: {stop['reason']}")
        for sweep in s.get("sweeps", []):
            lines.extend(_sweep_lines(s["engine"], sweep))
    warm = [f"{s['engine']} {c['cell']['scenario']} {c['cell'].get('warmup')}" for s in summaries
            for c in s.get("cells", []) if c.get("cell", {}).get("warmup")]
    if warm:  # the progress line counted them too, apart: "8/8 requests (+2 warm-up)"
        lines.append("warm-up requests, sent before each cell's rounds and left out of this table (labelled "
                     f"'warmup' in the records): {', '.join(warm)}")
    slo = next((s["slo"] for s in summaries if s.get("slo")), None)
    if slo:
        lines.append(f"SLO: TTFT <= {slo['ttft_s']} s and TPOT <= {slo['tpot_s'] * 1000:g} ms; "
                     "goodput % = requests that met it / judged requests (failures count against it); "
                     "[min-max] = spread over rounds")
    lines.append("in tok = the prompt length asked (input_tokens: words unless load --tokenizer); prompt tok = "
                 "the prompt tokens the engine counted (usage, median; a session's first turns)")
    lines.append("lag = how late the load driver sent each request (actual minus intended send time); "
                 "sched E2E = E2E from the intended send time (open loop only: what a client that falls "
                 "behind its schedule hides from the usual E2E)")
    return "\n".join(lines)


def failure_summary(summaries: Sequence[Mapping[str, Any]]) -> str | None:
    """``failures: REASON N, ...; first error: DETAIL`` over every round, or None."""
    reasons: dict[str, int] = {}
    proxy: dict[str, int] = {}
    for s in summaries:
        for row in _rows(s):
            for reason, n in (row.get("failure_reasons") or {}).items():
                reasons[reason] = reasons.get(reason, 0) + n
            for reason, n in (row.get("proxy_reasons") or {}).items():
                proxy[reason] = proxy.get(reason, 0) + n
    if not reasons:
        return None
    first = next((s["first_error"] for s in summaries if s.get("first_error")), None)
    text = "failures: " + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1]))
    if proxy:  # HTTP 502/504 here: the proxy's records say why
        text += " (the proxy's records: " + ", ".join(f"{k} {v}" for k, v in sorted(proxy.items(),
                                                                                   key=lambda kv: -kv[1])) + ")"
    return text + (f"; first error: {first}" if first else "")
