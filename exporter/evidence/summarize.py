"""``evidence summarize``: the seed's round tables from one or several ``requests.jsonl``.

Rows by engine × scenario × round (success / total, exact TTFT and TPOT P50/P95, E2E P95,
success output throughput, SLO attainment, goodput), then the median of rounds per engine ×
scenario with the rounds' spread (min–max) and, with enough requests, a bootstrap 95%
interval beside each median; engines side by side per scenario with a noise verdict; the
TTFT variants (``ttft_s``, ``ttfb_s``, ``ttfe_s``) where the records carry them.  Several
records directories (several proxies) merge exactly: the union of their requests.  With
Prometheus, each engine × scenario also gets the histogram-estimated P95 beside the exact P95,
with the relative error: how far to trust the boards' P95 curves.  The estimate comes from the
histogram's exact bucket counts (the catalogue's restart-safe ``exact_count``) from the scrape
before the cell's first request to a scrape after its last one (:func:`.counts.covering`).
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from collections.abc import Sequence
from itertools import combinations
from pathlib import Path
from typing import Any

from exporter.core.stats import SloLike, median_of_rounds, percentile, round_row
from exporter.proxy.config import DEFAULT_SLO

from dashboards.catalogue import MIXIN, exact_count
from .counts import covering
from .merge import load_records
from .noise import METRICS, RULE, delta_pct, verdict
from .outdir import make_dir
from .promapi import Prometheus
from .summary_md import summary_markdown

__all__ = ["load_records", "summarize", "write_summary", "histogram_p95_expr", "HISTOGRAMS", "TTFT_VARIANTS"]

HISTOGRAMS = {"ttft": ("llmbench_time_to_first_token_seconds", "ttft_s"),
              "tpot": ("llmbench_time_per_output_token_seconds", "tpot_s"),
              "e2e": ("llmbench_e2e_request_latency_seconds", "e2e_s")}
#: first visible text, first body byte, first event with choices.
TTFT_VARIANTS = ("ttft_s", "ttfb_s", "ttfe_s")
SKIP_SCENARIOS = frozenset({"warmup"})
Groups = dict[tuple[str, str, Any], list[dict[str, Any]]]


def _end(r: dict[str, Any]) -> float:
    return float(r["start_unix"]) + float(r.get("e2e_s") or 0.0)


def _groups(records: Sequence[dict[str, Any]]) -> Groups:
    groups: Groups = defaultdict(list)
    for r in records:
        if r.get("scenario") in SKIP_SCENARIOS or r.get("start_unix") is None:
            continue
        groups[(str(r.get("engine")), str(r.get("scenario")), r.get("round"))].append(r)
    return dict(sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], str(kv[0][2]))))


def summarize(records: Sequence[dict[str, Any]], prom: Prometheus | None = None,
              scrape_s: float = 5.0, slo: SloLike = DEFAULT_SLO) -> dict[str, Any]:
    groups = _groups(records)
    rows = [{"engine": e, "scenario": s, "round": rnd, **round_row(recs, slo=slo)}
            for (e, s, rnd), recs in groups.items()]
    by_cell: dict[tuple[str, str], list[tuple[dict[str, Any], list[dict[str, Any]]]]] = defaultdict(list)
    for row, recs in zip(rows, groups.values()):
        by_cell[(row["engine"], row["scenario"])].append((row, recs))
    medians = [{"engine": e, "scenario": s,
                **median_of_rounds([r for r, _ in pairs], [recs for _, recs in pairs], slo=slo)}
               for (e, s), pairs in by_cell.items()]
    out: dict[str, Any] = {"slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s}, "rounds": rows, "medians": medians,
                           "engines_compared": _engines_compared(medians), "noise_rule": RULE,
                           "ttft_variants": _ttft_variants(groups)}
    if prom is not None:
        out["histogram_vs_exact"] = _compare(prom, groups, scrape_s)
    return out


def _engines_compared(medians: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per scenario, each pair of engines (A, B in name order) with B's verdict against A."""
    by_scenario: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for m in medians:
        by_scenario[m["scenario"]].append(m)
    rows = []
    for scenario, ms in sorted(by_scenario.items()):
        for a, b in combinations(sorted(ms, key=lambda m: m["engine"]), 2):
            for metric in METRICS:
                rows.append({"scenario": scenario, "metric": metric.key, "a": a["engine"], "b": b["engine"],
                             "value_a": a.get(metric.key), "value_b": b.get(metric.key),
                             "delta_pct": delta_pct(a.get(metric.key), b.get(metric.key)),
                             "verdict": verdict(a, b, metric)})
    return rows


def _ttft_variants(groups: Groups) -> list[dict[str, Any]]:
    """P50/P95 of each TTFT variant over successful requests (None where records lack it)."""
    cells: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for (engine, scenario, _), recs in groups.items():
        cells[(engine, scenario)].extend(r for r in recs if r.get("outcome") == "success")
    rows = []
    for (engine, scenario), ok in sorted(cells.items()):
        row: dict[str, Any] = {"engine": engine, "scenario": scenario, "success": len(ok)}
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
    cells: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for (engine, scenario, _), recs in groups.items():
        cells[(engine, scenario)].extend(recs)
    rows = []
    for (engine, scenario), recs in sorted(cells.items()):
        ok = [r for r in recs if r.get("outcome") == "success"]
        span = covering(min(float(r["start_unix"]) for r in recs), max(_end(r) for r in recs), scrape_s)
        row: dict[str, Any] = {"engine": engine, "scenario": scenario, "window_start": span.baseline,
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
    flat = [_flat(r) for r in rows]
    cols = list(flat[0]) if flat else []
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, cols)
        w.writeheader()
        for r in flat:
            w.writerow({k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in r.items()})


def write_summary(summary: dict[str, Any], out: Path) -> list[Path]:
    """CSV tables, ``summary.json`` and ``summary.md`` under ``out`` (OutDirError if it cannot be made)."""
    make_dir(out)
    paths = []
    for name in ("rounds", "medians", "engines_compared", "ttft_variants", "histogram_vs_exact"):
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
