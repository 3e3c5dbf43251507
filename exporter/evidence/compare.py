"""``evidence compare A B``: two runs (records directories) per scenario and metric.

The value of each run is the median over rounds of each round's figure, as in the round
tables; beside it the rounds' spread (min–max) and, with enough requests, a bootstrap 95%
interval; the delta is (B − A) / A in per cent; the verdict follows :data:`noise.RULE`.

A run's records may hold several engines (one proxy in front of both): the run's label, or
``engine_a``/``engine_b``, picks one, so ``compare_dirs(d, d, out, "sglang", "vllm")`` compares
the two engines of one run.  Runs of one engine each are matched by scenario; otherwise by
engine and scenario.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.proxy.config import DEFAULT_SLO

from .merge import load_records
from .noise import METRICS, RULE, delta_pct, fmt_delta, fmt_noise, verdict
from .outdir import make_dir
from .summarize import summarize
from .summary_md import md_table

__all__ = ["compare_dirs", "compare_runs", "load_run", "CompareError", "Run"]


class CompareError(ValueError):
    """Runs that cannot be compared; the message says why."""


@dataclass(frozen=True)
class Run:
    label: str
    path: Path
    engines: tuple[str, ...]
    medians: dict[tuple[str, str], dict[str, Any]]  # (engine, scenario) -> median of rounds


def load_run(path: Path, label: str, engine: str | None) -> Run:
    records = load_records(path)
    present = sorted({str(r.get("engine")) for r in records})
    pick = engine or (label if label in present and len(present) > 1 else None)
    if pick is not None:
        if pick not in present:
            raise CompareError(f"engine {pick!r} is not in {path} (engines there: {', '.join(present) or 'none'})")
        records = [r for r in records if r.get("engine") == pick]
    medians = {(m["engine"], m["scenario"]): m for m in summarize(records, slo=DEFAULT_SLO)["medians"]}
    if not medians:
        raise CompareError(f"no measured rounds in {path} (warm-up rounds are left out)")
    return Run(label, path, tuple(sorted({e for e, _ in medians})), medians)


def _pairs(a: Run, b: Run) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(scenario or engine/scenario, median A, median B) for every cell both runs have."""
    if len(a.engines) == 1 and len(b.engines) == 1:
        ma = {s: m for (_, s), m in a.medians.items()}
        mb = {s: m for (_, s), m in b.medians.items()}
        return [(s, ma[s], mb[s]) for s in sorted(ma) if s in mb]
    return [(f"{e}/{s}", a.medians[(e, s)], b.medians[(e, s)]) for (e, s) in sorted(a.medians) if (e, s) in b.medians]


def compare_runs(a: Run, b: Run) -> list[dict[str, Any]]:
    rows = []
    for cell, ma, mb in _pairs(a, b):
        for metric in METRICS:
            va, vb = ma.get(metric.key), mb.get(metric.key)
            rows.append({
                "scenario": cell, "metric": metric.key, "engine_a": ma["engine"], "engine_b": mb["engine"],
                "rounds_a": ma["rounds"], "rounds_b": mb["rounds"], "value_a": va, "value_b": vb,
                "delta_pct": delta_pct(va, vb),
                "spread_a": ma["spread"].get(metric.key), "spread_b": mb["spread"].get(metric.key),
                "ci95_a": ma["ci95"].get(metric.key), "ci95_b": mb["ci95"].get(metric.key),
                "verdict": verdict(ma, mb, metric),
                "cell_a": {"rounds": ma["rounds"], "spread": ma["spread"], "ci95": ma["ci95"], metric.key: va},
                "cell_b": {"rounds": mb["rounds"], "spread": mb["spread"], "ci95": mb["ci95"], metric.key: vb},
            })
    return rows


def _csv(path: Path, rows: list[dict[str, Any]], a: Run, b: Run) -> None:
    cols = ["scenario", "metric", "label_a", "label_b", "engine_a", "engine_b", "rounds_a", "rounds_b", "value_a",
            "value_b", "delta_pct", "spread_a_min", "spread_a_max", "spread_b_min", "spread_b_max",
            "ci95_a_lo", "ci95_a_hi", "ci95_b_lo", "ci95_b_hi", "verdict"]
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            flat = {**r, "label_a": a.label, "label_b": b.label}
            for side in ("a", "b"):
                flat[f"spread_{side}_min"], flat[f"spread_{side}_max"] = r[f"spread_{side}"] or (None, None)
                flat[f"ci95_{side}_lo"], flat[f"ci95_{side}_hi"] = r[f"ci95_{side}"] or (None, None)
            w.writerow(flat)


def _markdown(rows: list[dict[str, Any]], a: Run, b: Run, pngs: list[Path]) -> str:
    lines = [f"# {b.label} against {a.label}", "",
             f"- A = **{a.label}**: `{a.path}` (engines: {', '.join(a.engines)})",
             f"- B = **{b.label}**: `{b.path}` (engines: {', '.join(b.engines)})",
             "- Value of a run: the median over rounds of each round's figure; beside it [min–max over rounds] "
             "and (CI lo–hi), a bootstrap 95% interval of the median where there are enough requests.",
             "- Delta: (B − A) / A in per cent.", f"- Verdict rule: {RULE}", ""]
    fmt = {"A": lambda r, _: fmt_noise(r["cell_a"], r["metric"]), "B": lambda r, _: fmt_noise(r["cell_b"], r["metric"]),
           "delta_pct": fmt_delta}
    for cell in dict.fromkeys(r["scenario"] for r in rows):
        lines += [f"## {cell}", ""]
        lines += md_table([r for r in rows if r["scenario"] == cell], ["metric", "A", "B", "delta_pct", "verdict"], fmt)
        lines.append("")
    lines += ["Charts: " + ", ".join(f"`{p.name}`" for p in pngs), ""]
    return "\n".join(lines)


def compare_dirs(a: Path, b: Path, out: Path, label_a: str = "A", label_b: str = "B", *,
                 engine_a: str | None = None, engine_b: str | None = None) -> dict[str, Any]:
    """Compare two records directories; writes compare.md, compare.csv and one PNG per metric
    under ``out``; returns {"rows", "files"}.  Raises CompareError, MergeError, OutDirError."""
    from .compare_plot import plot_metric

    run_a, run_b = load_run(Path(a), label_a, engine_a), load_run(Path(b), label_b, engine_b)
    rows = compare_runs(run_a, run_b)
    if not rows:
        raise CompareError(f"{label_a} and {label_b} share no scenario: nothing to compare")
    make_dir(out)
    sides = (run_a.label, run_a.engines), (run_b.label, run_b.engines)
    pngs = [plot_metric([r for r in rows if r["metric"] == m.key], m, *sides, out / f"{m.key}.png")
            for m in METRICS]
    csv_path, md_path = out / "compare.csv", out / "compare.md"
    _csv(csv_path, rows, run_a, run_b)
    md_path.write_text(_markdown(rows, run_a, run_b, pngs), encoding="utf-8")
    clean = [{k: v for k, v in r.items() if k not in ("cell_a", "cell_b")} for r in rows]
    return {"rows": clean, "files": [md_path, csv_path, *pngs]}
