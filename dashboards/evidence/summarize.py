"""``evidence summarize``: the seed's round tables from ``requests.jsonl``.

Rows by engine × scenario × round (success / total, exact TTFT and TPOT P50/P95, E2E P95,
success output throughput, SLO attainment), then the median of rounds per engine ×
scenario.  With Prometheus, each engine × scenario also gets the histogram-estimated P95
over the same window beside the exact P95, with the relative error: how far to trust the
boards' P95 curves.
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from exporter.core.stats import median_of_rounds, percentile, round_row
from exporter.proxy.config import DEFAULT_SLO

from .promapi import Prometheus

__all__ = ["load_records", "summarize", "write_summary", "HISTOGRAMS"]

HISTOGRAMS = {"ttft": ("llmbench_time_to_first_token_seconds", "ttft_s"),
              "tpot": ("llmbench_time_per_output_token_seconds", "tpot_s"),
              "e2e": ("llmbench_e2e_request_latency_seconds", "e2e_s")}
SKIP_SCENARIOS = frozenset({"warmup"})


def load_records(path: Path) -> list[dict[str, Any]]:
    """Records from a directory's ``requests.jsonl`` (or the file itself); bad lines are reported."""
    file = path / "requests.jsonl" if path.is_dir() else path
    records = []
    with open(file, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except ValueError:
                raise ValueError(f"{file}:{n}: not a JSON line") from None
    return records


def _end(r: dict[str, Any]) -> float:
    return float(r["start_unix"]) + float(r.get("e2e_s") or 0.0)


def summarize(records: list[dict[str, Any]], prom: Prometheus | None = None,
              scrape_s: float = 5.0) -> dict[str, Any]:
    groups: dict[tuple[str, str, Any], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r.get("scenario") in SKIP_SCENARIOS or r.get("start_unix") is None:
            continue
        groups[(r["engine"], r["scenario"], r.get("round"))].append(r)
    rows = []
    for (engine, scenario, rnd), recs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], str(kv[0][2]))):
        rows.append({"engine": engine, "scenario": scenario, "round": rnd, **round_row(recs, slo=DEFAULT_SLO)})
    medians = []
    by_cell: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_cell[(row["engine"], row["scenario"])].append(row)
    for (engine, scenario), cell_rows in by_cell.items():
        medians.append({"engine": engine, "scenario": scenario, **median_of_rounds(cell_rows)})
    out: dict[str, Any] = {"rounds": rows, "medians": medians}
    if prom is not None:
        out["histogram_vs_exact"] = _compare(prom, groups, scrape_s)
    return out


def _compare(prom: Prometheus, groups: dict[tuple[str, str, Any], list[dict[str, Any]]], scrape_s: float) -> list[dict[str, Any]]:
    cells: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for (engine, scenario, _), recs in groups.items():
        cells[(engine, scenario)].extend(recs)
    rows = []
    for (engine, scenario), recs in sorted(cells.items()):
        ok = [r for r in recs if r.get("outcome") == "success"]
        start = min(float(r["start_unix"]) for r in recs) - scrape_s
        end = max(_end(r) for r in recs) + 2 * scrape_s
        row: dict[str, Any] = {"engine": engine, "scenario": scenario, "window_start": start, "window_end": end}
        for key, (metric, field) in HISTOGRAMS.items():
            exact = percentile([r[field] for r in ok if r.get(field) is not None], 95)
            sel = f'{metric}_bucket{{engine="{engine}", scenario="{scenario}"}}[{max(1, round(end - start))}s]'
            # exact bucket counts in the window (max - min), not increase()'s extrapolation
            expr = f"histogram_quantile(0.95, sum by (le) (max_over_time({sel}) - min_over_time({sel})))"
            result = prom.query(expr, at=end)
            est = float(result[0]["value"][1]) if result else None
            if est is not None and est != est:  # NaN
                est = None
            rel = (est - exact) / exact if est is not None and exact else None
            row.update({f"{key}_p95_exact_s": exact, f"{key}_p95_histogram_s": est, f"{key}_p95_rel_error": rel})
        rows.append(row)
    return rows


_ROUND_COLS = ["engine", "scenario", "round", "success", "requests", "ttft_p50_s", "ttft_p95_s", "tpot_p50_s",
               "tpot_p95_s", "e2e_p95_s", "output_throughput_tok_s", "slo_attainment", "failure_reasons"]
_MEDIAN_COLS = ["engine", "scenario", "rounds", "success", "requests", "ttft_p95_s", "tpot_p95_s", "e2e_p95_s",
                "output_throughput_tok_s", "slo_attainment"]


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k} {n}" for k, n in sorted(v.items())) or "-"
    return str(v)


def _md_table(rows: list[dict[str, Any]], cols: list[str]) -> list[str]:
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in cols) + " |" for r in rows]
    return lines


def write_summary(summary: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, rows in (("rounds", summary["rounds"]), ("medians", summary["medians"]),
                       ("histogram_vs_exact", summary.get("histogram_vs_exact"))):
        if rows is None:
            continue
        path = out / f"{name}.csv"
        cols = list(rows[0]) if rows else []
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, cols)
            w.writeheader()
            for r in rows:
                w.writerow({k: json.dumps(v) if isinstance(v, dict) else v for k, v in r.items()})
        paths.append(path)
    js = out / "summary.json"
    js.write_text(json.dumps(summary, indent=1), encoding="utf-8")
    md = ["# Round tables", "", "Median of rounds per engine × scenario (success counts add up over rounds):", ""]
    md += _md_table(summary["medians"], _MEDIAN_COLS)
    md += ["", "Rounds:", ""] + _md_table(summary["rounds"], _ROUND_COLS)
    if summary.get("histogram_vs_exact"):
        cols = ["engine", "scenario"] + [f"{k}_p95_{x}" for k in HISTOGRAMS for x in ("exact_s", "histogram_s", "rel_error")]
        md += ["", "Histogram-estimated P95 (Prometheus) beside the exact P95 of the same requests:", ""]
        md += _md_table(summary["histogram_vs_exact"], cols)
    mdp = out / "summary.md"
    mdp.write_text("\n".join(md) + "\n", encoding="utf-8")
    return [*paths, js, mdp]
