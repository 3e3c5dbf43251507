"""``evidence summarize``: the seed's round tables from one or several ``requests.jsonl``.

Proxy-side figures, from the records.  Rows by run × engine × scenario × round in plan order
(rounds of different runs never merge; ``run`` picks one): success / total, exact TTFT and TPOT
P50/P95, E2E P95, success output throughput, goodput; each round once whole and once over its
steady window (:mod:`.experiment`), with its load (arrivals, offered rate, in flight, client
back-pressure, load verdict).  Then the median of rounds per run × engine × scenario with the
rounds' spread (min–max) and, with enough requests, a bootstrap 95% interval beside each median;
engines side by side per run and scenario with a noise verdict; the TTFT variants (``ttft_s``,
``ttfb_s``, ``ttfe_s``) where the records carry them; where requests carry a ``session_id``, a
row per turn and per session (:mod:`.turns`); where records carry the decode fields, the ITL
distribution, TTFT beside TTFO and spec acceptance per round and route (:mod:`.decode`).
Embeddings and rerank requests stay out of the generation tables where a run also holds
generations: a ``pooling`` table of their own.  Each record is judged by its own ``slo``;
older records by the config given, else by the default (:func:`.runs.judge_by`).

A round announced more than once in a run (cleared or replaced, then set again: the proxy's
``scenarios.jsonl`` beside the records says so) is never merged into one: each announcement is a
round of its own, the later ones labelled ``ROUND (again at HH:MM:SSZ)``
(:func:`.runs.split_repeated`; ``repeated_rounds`` in the summary), with a ``warning:`` line each.

Several records directories (several proxies) merge exactly: the union of their requests.  With
Prometheus, each engine × scenario also gets the histogram-estimated P95 beside the exact P95,
with the relative error: how far to trust the boards' P95 curves.  The estimate comes from the
histogram's exact bucket counts (the catalogue's restart-safe ``exact_count``) from the scrape
before the cell's first request to a scrape after its last one (:func:`.counts.covering`).
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from itertools import combinations
from pathlib import Path
from typing import Any

from dashboards.catalogue import MIXIN, exact_count
from exporter.core.slo import slo_result
from exporter.core.stats import median_of_rounds, percentile, round_row
from exporter.proxy.config import DEFAULT_SLO, Config

from .counts import covering
from .decode import DECODE_NOTE, POOLING_NOTE, decode_cells, decode_rounds, pooling_rounds, split_routes
from .experiment import Expect, cell_load, round_load, round_name, steady_records, window_share
from .identity import identity
from .merge import load_records
from .noise import METRICS, RULE, delta_pct, judged_verdict
from .outdir import make_dir
from .promapi import Prometheus
from .proxyadded import added_rows, t0_mix_warning
from .runs import (
    Announcement,
    RoundKey,
    ScenarioLogError,
    group_rounds,
    judge_by,
    read_announcements,
    runs_in,
    scenario_log_path,
    select_run,
    split_repeated,
)
from .summary_md import summary_markdown
from .ttftparts import ttft_parts
from .turns import session_cells, session_table, turn_table

__all__ = ["load_records", "summarize", "write_summary", "histogram_p95_expr", "HISTOGRAMS", "TTFT_VARIANTS",
           "DROPPED", "uncertain_share", "uncertainty_warning", "UNCERTAIN_OF_TTFT", "UNCERTAIN_WARN",
           "repeated_warning"]

HISTOGRAMS = {"ttft": ("llmbench_time_to_first_token_seconds", "ttft_s"),
              "tpot": ("llmbench_time_per_output_token_seconds", "tpot_s"),
              "e2e": ("llmbench_e2e_request_latency_seconds", "e2e_s")}
#: first visible text, first body byte, first event with choices.
TTFT_VARIANTS = ("ttft_s", "ttfb_s", "ttfe_s")
#: record fields whose presence gives the decode tables (:mod:`.itl`)
DECODE_FIELDS = ("itl_p50_s", "ttfo_s", "spec_draft_tokens")
#: one name per figure: ``slo_attainment`` (met / all) is ``goodput_ratio`` (met / judged) but for
#: client aborts; the summary keeps ``goodput_ratio``.
DROPPED = ("slo_attainment",)
#: A request is ``uncertain`` when its timing uncertainty exceeds this share of its TTFT ...
UNCERTAIN_OF_TTFT = 0.10
#: ... and a round whose share of uncertain requests exceeds this one gets a warning.
UNCERTAIN_WARN = 0.05
Groups = dict[RoundKey, list[Mapping[str, Any]]]
CellKey = tuple[str, str, str]  # run, engine, scenario


def _end(r: Mapping[str, Any]) -> float:
    return float(r["start_unix"]) + float(r.get("e2e_s") or 0.0)


def _figures(recs: Sequence[Mapping[str, Any]], duration_s: float | None = None) -> dict[str, Any]:
    row = round_row(recs, duration_s, slo=DEFAULT_SLO, own_slo=True)  # every record carries its slo here
    return {**{k: v for k, v in row.items() if k not in DROPPED}, "uncertain": uncertain_share(recs)}


def uncertain_share(recs: Sequence[Mapping[str, Any]]) -> float | None:
    """The share of the requests with a TTFT whose ``timing_uncertainty_s`` (the proxy's event-loop
    lag while they were in flight) exceeds :data:`UNCERTAIN_OF_TTFT` of that TTFT: their timings
    may be off by more than a tenth.  None where no record carries both."""
    timed = [r for r in recs if isinstance(r.get("ttft_s"), (int, float))
             and isinstance(r.get("timing_uncertainty_s"), (int, float))]
    if not timed:
        return None
    return sum(1 for r in timed if r["timing_uncertainty_s"] > UNCERTAIN_OF_TTFT * r["ttft_s"]) / len(timed)


def uncertainty_warning(summary: Mapping[str, Any]) -> str | None:
    """One ``warning:`` line when a round's ``uncertain`` share exceeds :data:`UNCERTAIN_WARN`."""
    bad = [r for r in summary.get("rounds") or [] if (r.get("uncertain") or 0) > UNCERTAIN_WARN]
    if not bad:
        return None
    worst = max(bad, key=lambda r: r["uncertain"])
    return (f"warning: in {len(bad)} of {len(summary['rounds'])} rounds more than {UNCERTAIN_WARN:.0%} of the "
            f"requests have a timing uncertainty above {UNCERTAIN_OF_TTFT:.0%} of their TTFT (worst: "
            f"{worst['engine']} {round_name(worst['scenario'], worst['round'])}, {worst['uncertain']:.0%}): the "
            "proxy's event loop lagged while they were in flight (a CPU-bound host?); see the uncertain column "
            "and the records' timing_uncertainty_s before quoting their TTFT")


def _round_tables(groups: Groups, expect: Expect | None) -> tuple[list[dict[str, Any]], ...]:
    """(rounds, steady rounds, loads): one row each per round."""
    rounds, steady, loads = [], [], []
    for (run, engine, scenario, rnd), recs in groups.items():
        head = {"run": run, "engine": engine, "scenario": scenario, "round": rnd}
        load = round_load(recs, expect)
        rounds.append({**head, **_figures(recs)})
        loads.append({**head, **load})
        steady.append({**head, "steady_s": load["steady_s"], **_steady_figures(recs, load)})
    return rounds, steady, loads


def _steady_figures(recs: Sequence[Mapping[str, Any]], load: Mapping[str, Any]) -> dict[str, Any]:
    """The figures of the requests that arrived inside the steady window; throughput and goodput
    over its length, each request's output counted by the share of its generation inside it."""
    inside = steady_records(recs, load)
    lo, hi = load.get("steady_start_unix"), load.get("steady_end_unix")
    if not inside or lo is None or hi is None or not hi > lo:
        return {"requests": len(inside)}
    row = _figures(inside, hi - lo)
    ok = [r for r in recs if r.get("outcome") == "success"]
    met = [r for r in ok if slo_result(r.get("ttft_s"), r.get("tpot_s"), r["slo"]["ttft_s"], r["slo"]["tpot_s"]) == "met"]
    for key, chosen in (("output_throughput_tok_s", ok), ("goodput_tok_s", met)):
        tokens = sum((r.get("completion_tokens") or 0) * window_share(r, lo, hi) for r in chosen)
        row[key] = tokens / (hi - lo)
    return row


def _reasons(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    total: dict[str, int] = defaultdict(int)
    for row in rows:
        for reason, n in (row.get("failure_reasons") or {}).items():
            total[reason] += n
    return dict(total)


def _medians(groups: Groups, rounds: list[dict[str, Any]], loads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_cell: dict[CellKey, list[tuple[dict[str, Any], Sequence[Mapping[str, Any]], dict[str, Any]]]] = defaultdict(list)
    for row, recs, load in zip(rounds, groups.values(), loads):
        by_cell[(row["run"], row["engine"], row["scenario"])].append((row, recs, load))
    out = []
    for (run, engine, scenario), triples in by_cell.items():
        rows = [r for r, _, _ in triples]
        m = median_of_rounds(rows, [recs for _, recs, _ in triples], slo=DEFAULT_SLO, own_slo=True)
        for key in DROPPED:
            for part in (m, m["spread"], m["ci95"]):
                part.pop(key, None)
        out.append({"run": run, "engine": engine, "scenario": scenario, **m, "failure_reasons": _reasons(rows),
                    "uncertain": uncertain_share([r for _, recs, _ in triples for r in recs]),
                    **cell_load([load for _, _, load in triples])})
    return out


def summarize(records: Sequence[Mapping[str, Any]], prom: Prometheus | None = None, scrape_s: float = 5.0, *,
              config: Config | None = None, config_path: Path | str | None = None, run: str | None = None,
              expect: Expect | None = None, records_dirs: Sequence[Path] = ()) -> dict[str, Any]:
    """The summary document; RunError for a ``run`` the records lack.  ``records_dirs``: where the
    records came from, for the engines' and the proxy's identity beside them (``engines``,
    ``proxy``; a version that changed inside a run is in ``warnings``)."""
    judged, slo_note = judge_by(select_run(records, run), config, config_path)
    spans, unread = _announcements(records_dirs)
    repeated = split_repeated(judged, spans)  # a round announced twice in a run: two rounds
    gens, pooled = split_routes(judged)  # embeddings and rerank apart from the generations
    groups = group_rounds(gens)
    rounds, steady, loads = _round_tables(groups, expect)
    medians = _medians(groups, rounds, loads)
    out: dict[str, Any] = {"measured": "proxy-side, from requests.jsonl", "runs": _runs(judged, groups),
                           "slo_source": slo_note, "rounds": rounds, "steady_rounds": steady, "load": loads,
                           "medians": medians, "engines_compared": _engines_compared(medians), "noise_rule": RULE,
                           "ttft_variants": _ttft_variants(groups), "ttft_parts": ttft_parts(groups),
                           "proxy_added": added_rows(groups)}
    if any(r.get("session_id") for r in judged):  # per turn and per session (.turns)
        sessions = session_table(judged)
        out.update(turns=turn_table(judged), sessions=sessions, session_cells=session_cells(sessions))
    if any(k in r for r in gens for k in DECODE_FIELDS):  # records of a proxy that measures decode
        out.update(decode=decode_rounds(groups), decode_note=DECODE_NOTE)
        out["decode_cells"] = decode_cells(out["decode"])
    if pooled:
        out.update(pooling=pooling_rounds(group_rounds(pooled)), pooling_note=POOLING_NOTE)
    if prom is not None:
        out["histogram_vs_exact"] = _compare(prom, groups, scrape_s)
    if repeated:
        out["repeated_rounds"] = repeated
    ident = identity(records_dirs, [r["run_id"] for r in out["runs"]])
    uncertain = uncertainty_warning(out)
    mixed = t0_mix_warning(out["proxy_added"])  # TTFTs measured from different instants
    out.update(engines=ident["engines"], proxy=ident["proxy"],
               warnings=[*out.get("warnings", []), *([uncertain] if uncertain else []), *([mixed] if mixed else []),
                         *unread,
                         *map(repeated_warning, repeated), *ident["warnings"]])
    return out


def _announcements(records_dirs: Sequence[Path]) -> tuple[list[Announcement], list[str]]:
    """The announcement spans of the ``scenarios.jsonl`` beside each records path (none beside:
    none), and a ``warning:`` line for each that cannot be read."""
    spans: list[Announcement] = []
    unread: list[str] = []
    for path in dict.fromkeys(scenario_log_path(Path(p)) for p in records_dirs):
        if not path.is_file():
            continue
        try:
            spans += read_announcements(path).spans
        except ScenarioLogError as exc:
            unread.append(f"warning: {exc}; a round announced more than once there is not told apart")
    return spans, unread


def repeated_warning(row: Mapping[str, Any]) -> str:
    """The ``warning:`` line of a round announced more than once in a run (:func:`.runs.split_repeated`)."""
    shown = ", ".join(f"{s['label']} ({s['requests']} requests)" for s in row["spans"])
    return (f"warning: {row['engine']} {round_name(row['scenario'], row['round'])} was announced "
            f"{row['announcements']} times in run {row['run']} (cleared or replaced, then set again): its records "
            f"are shown as separate rounds, by announcement: {shown}; announce a new round number for each new "
            "round")


def _runs(records: Sequence[Mapping[str, Any]], groups: Groups) -> list[dict[str, Any]]:
    rounds: dict[str, int] = defaultdict(int)
    for key in groups:
        rounds[key[0]] += 1
    return [{"run_id": run, "rounds": rounds.get(run, 0)} for run in runs_in(records)]


def _engines_compared(medians: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per run and scenario, each pair of engines (A, B in the order they ran) with B's verdict against A."""
    by_cell: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for m in medians:
        by_cell[(m["run"], m["scenario"])].append(m)
    rows = []
    for (run, scenario), ms in by_cell.items():
        for a, b in combinations(ms, 2):
            for metric in METRICS:
                verdict, why = judged_verdict(a, b, metric)
                rows.append({"run": run, "scenario": scenario, "metric": metric.key, "a": a["engine"],
                             "b": b["engine"], "value_a": a.get(metric.key), "value_b": b.get(metric.key),
                             "delta_pct": delta_pct(a.get(metric.key), b.get(metric.key)), "verdict": verdict,
                             "why": why})
    return rows


def _cells(groups: Groups) -> dict[CellKey, list[Mapping[str, Any]]]:
    cells: dict[CellKey, list[Mapping[str, Any]]] = defaultdict(list)
    for (run, engine, scenario, _), recs in groups.items():
        cells[(run, engine, scenario)].extend(recs)
    return cells


def _ttft_variants(groups: Groups) -> list[dict[str, Any]]:
    """P50/P95 of each TTFT variant over successful requests (None where records lack it)."""
    rows = []
    for (run, engine, scenario), recs in _cells(groups).items():
        ok = [r for r in recs if r.get("outcome") == "success"]
        row: dict[str, Any] = {"run": run, "engine": engine, "scenario": scenario, "success": len(ok)}
        for key in TTFT_VARIANTS:
            xs = [float(r[key]) for r in ok if r.get(key) is not None]
            name = key[:-2]
            row.update({f"{name}_n": len(xs), f"{name}_p50_s": percentile(xs, 50), f"{name}_p95_s": percentile(xs, 95)})
        rows.append(row)
    return rows


def histogram_p95_expr(metric: str, engine: str, scenario: str, range_s: int) -> str:
    """The P95 of a proxy histogram from its exact bucket counts over ``range_s`` seconds
    (the catalogue's restart-safe :func:`exact_count`, not ``increase()``'s extrapolation)."""
    sel = f"{metric}_bucket" + MIXIN.proxy(f'{MIXIN.engine_label}="{engine}"', f'scenario="{scenario}"')
    return f"histogram_quantile(0.95, sum by (le) ({exact_count(sel, f'{range_s}s')}))"


def _compare(prom: Prometheus, groups: Groups, scrape_s: float) -> list[dict[str, Any]]:
    rows = []
    for (run, engine, scenario), recs in _cells(groups).items():
        ok = [r for r in recs if r.get("outcome") == "success"]
        span = covering(min(float(r["start_unix"]) for r in recs), max(_end(r) for r in recs), scrape_s)
        row: dict[str, Any] = {"run": run, "engine": engine, "scenario": scenario, "window_start": span.baseline,
                               "window_end": span.at}
        for key, (metric, field) in HISTOGRAMS.items():
            exact = percentile([r[field] for r in ok if r.get(field) is not None], 95)
            result = prom.query(histogram_p95_expr(metric, engine, scenario, span.range_s), at=span.at)
            est = float(result[0]["value"][1]) if result else None
            if est is not None and est != est:  # NaN
                est = None
            rel = (est - exact) / exact if est is not None and exact else None
            row.update({f"{key}_p95_exact_s": exact, f"{key}_p95_histogram_s": est, f"{key}_p95_rel_error": rel})
        rows.append(row)
    return rows


def _flat(row: dict[str, Any]) -> dict[str, Any]:
    """A CSV row: spread and ci95 as ``KEY_min``/``KEY_max``/``KEY_ci95_lo``/``KEY_ci95_hi``."""
    out = {k: v for k, v in row.items() if k not in ("spread", "ci95")}
    for key, pair in (row.get("spread") or {}).items():
        out[f"{key}_min"], out[f"{key}_max"] = pair if pair else (None, None)
    for key, pair in (row.get("ci95") or {}).items():
        out[f"{key}_ci95_lo"], out[f"{key}_ci95_hi"] = pair if pair else (None, None)
    return out


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    write_rows(path, [_flat(r) for r in rows])


def write_rows(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """``rows`` as a CSV file: every key of any row a column, in first-seen order; a nested value
    as its JSON."""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in r.items()})


TABLES = ("rounds", "steady_rounds", "load", "medians", "engines_compared", "ttft_variants", "ttft_parts",
          "proxy_added", "histogram_vs_exact", "turns", "sessions", "session_cells", "decode", "decode_cells",
          "pooling")


def write_summary(summary: dict[str, Any], out: Path) -> list[Path]:
    """CSV tables (base units, named in the columns), ``summary.json`` and ``summary.md`` (ms and %)
    under ``out`` (OutDirError if it cannot be made)."""
    make_dir(out)
    paths = []
    for name in TABLES:
        rows = summary.get(name)
        if rows is None:
            continue
        path = out / f"{name}.csv"
        _write_csv(path, rows)
        paths.append(path)
    js = out / "summary.json"
    js.write_text(json.dumps(summary, indent=1), encoding="utf-8")
    mdp = out / "summary.md"
    mdp.write_text(summary_markdown(summary), encoding="utf-8")
    return [*paths, js, mdp]
