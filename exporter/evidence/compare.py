"""``evidence compare A B``: two runs (records directories) per scenario and metric.

The value of each run is the median over rounds of each round's figure, as in the round
tables; beside it the rounds' spread (min–max) and, with enough requests, a bootstrap 95%
interval; the delta is (B − A) / A in per cent; the verdict follows :data:`noise.RULE`: no
verdict with one round on a side, none when the two sides ran different loads (and why).
Each side is one run (``run_a``/``run_b`` pick one where a directory holds several); each
record is judged by its own SLO, older ones by ``config`` or the default.

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

from exporter.proxy.config import Config

from .merge import load_records
from .noise import METRICS, RULE, delta_pct, fmt_delta, fmt_noise, judged_verdict
from .outdir import make_dir
from .proxyadded import sides_t0_warning
from .runs import RunError, refuse_client_side, runs_in
from .summarize import summarize
from .summary_md import PROXY_SIDE, md_table, title_of

__all__ = ["compare_dirs", "compare_runs", "load_run", "CompareError", "Run"]


class CompareError(ValueError):
    """Runs that cannot be compared; the message says why."""


@dataclass(frozen=True)
class Run:
    label: str
    path: Path
    engines: tuple[str, ...]
    medians: dict[tuple[str, str], dict[str, Any]]  # (engine, scenario) -> median of rounds
    run_id: str = ""
    slo_text: str = ""
    #: the engines' identities of its run (engines.jsonl beside the records), one line each
    builds: tuple[str, ...] = ()
    #: summarize's warnings for this side (a round announced twice, a version changed in the run)
    warnings: tuple[str, ...] = ()
    #: per round, how its t0 was taken and what the proxy added (summarize's ``proxy_added``)
    added: tuple[dict[str, Any], ...] = ()


def _one_run(records: list[dict[str, Any]], path: Path, flag: str, run: str | None) -> str:
    """The run a side stands for: ``run``, or the only one there; several without a pick are refused."""
    runs = runs_in(records)
    if run is not None:
        if run not in runs:
            raise CompareError(f"{flag} {run}: no records of that run in {path} (runs there: {', '.join(runs)})")
        return run
    if len(runs) > 1:
        raise CompareError(f"{path} holds {len(runs)} runs ({', '.join(runs)}): runs never mix, pick one with {flag} ID")
    return runs[0] if runs else ""


def load_run(path: Path, label: str, engine: str | None, *, run: str | None = None, flag: str = "--run-a",
             config: Config | None = None, config_path: Path | str | None = None) -> Run:
    records = load_records(path)
    try:
        refuse_client_side(records, str(path))
    except RunError as exc:
        raise CompareError(str(exc)) from None
    run_id = _one_run(records, path, flag, run)
    present = sorted({str(r.get("engine")) for r in records})
    pick = engine or (label if label in present and len(present) > 1 else None)
    if pick is not None:
        if pick not in present:
            raise CompareError(f"engine {pick!r} is not in {path} (engines there: {', '.join(present) or 'none'})")
        records = [r for r in records if r.get("engine") == pick]
    try:
        summary = summarize(records, config=config, config_path=config_path, run=run_id or None,
                            records_dirs=[path])  # beside them: announcements and identities
    except RunError as exc:
        raise CompareError(str(exc)) from None
    medians = {(m["engine"], m["scenario"]): m for m in summary["medians"]}
    if not medians:
        raise CompareError(f"no measured rounds in {path} (warm-up rounds are left out)")
    engines = tuple(sorted({e for e, _ in medians}))
    builds = [_build(x) for x in summary.get("engines", []) if x.get("name") in engines]
    return Run(label, path, engines, medians, run_id, summary["slo_source"]["text"],
               tuple(dict.fromkeys(builds)), tuple(summary.get("warnings", [])), tuple(summary.get("proxy_added", [])))


def _build(entry: dict[str, Any]) -> str:
    """An engine's identity in a line: ``vllm: vllm 0.32.0, model tiny``."""
    return f"{entry.get('name')}: {entry.get('kind')} {entry.get('version') or '?'}, model {entry.get('model') or '?'}"


def _cells(a: Run, b: Run) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Each run's medians by cell: the scenario when both runs hold one engine, else engine/scenario."""
    if len(a.engines) == 1 and len(b.engines) == 1:
        return {s: m for (_, s), m in a.medians.items()}, {s: m for (_, s), m in b.medians.items()}
    return ({f"{e}/{s}": m for (e, s), m in a.medians.items()}, {f"{e}/{s}": m for (e, s), m in b.medians.items()})


def _pairs(a: Run, b: Run) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(scenario or engine/scenario, median A, median B) for every cell both runs have, in A's plan order."""
    ma, mb = _cells(a, b)
    return [(cell, ma[cell], mb[cell]) for cell in ma if cell in mb]


def unpaired(a: Run, b: Run) -> dict[str, list[str]]:
    """The cells only one run has (not compared), by side: ``{"a": [...], "b": [...]}``."""
    ma, mb = _cells(a, b)
    return {"a": [c for c in ma if c not in mb], "b": [c for c in mb if c not in ma]}


def compare_runs(a: Run, b: Run) -> list[dict[str, Any]]:
    rows = []
    for cell, ma, mb in _pairs(a, b):
        for metric in METRICS:
            va, vb = ma.get(metric.key), mb.get(metric.key)
            verdict, why = judged_verdict(ma, mb, metric)
            rows.append({
                "scenario": cell, "metric": metric.key, "engine_a": ma["engine"], "engine_b": mb["engine"],
                "rounds_a": ma["rounds"], "rounds_b": mb["rounds"], "value_a": va, "value_b": vb,
                "delta_pct": delta_pct(va, vb),
                "spread_a": ma["spread"].get(metric.key), "spread_b": mb["spread"].get(metric.key),
                "ci95_a": ma["ci95"].get(metric.key), "ci95_b": mb["ci95"].get(metric.key),
                "verdict": verdict, "why": why, "load_a": ma.get("load_verdict"), "load_b": mb.get("load_verdict"),
                "offered_rate_a_rps": ma.get("offered_rate_rps"), "offered_rate_b_rps": mb.get("offered_rate_rps"),
                "cell_a": {"rounds": ma["rounds"], "spread": ma["spread"], "ci95": ma["ci95"], metric.key: va},
                "cell_b": {"rounds": mb["rounds"], "spread": mb["spread"], "ci95": mb["ci95"], metric.key: vb},
            })
    return rows


def _csv(path: Path, rows: list[dict[str, Any]], a: Run, b: Run) -> None:
    cols = ["scenario", "metric", "label_a", "label_b", "engine_a", "engine_b", "rounds_a", "rounds_b", "value_a",
            "value_b", "delta_pct", "spread_a_min", "spread_a_max", "spread_b_min", "spread_b_max",
            "ci95_a_lo", "ci95_a_hi", "ci95_b_lo", "ci95_b_hi", "verdict", "why", "load_a", "load_b",
            "offered_rate_a_rps", "offered_rate_b_rps"]
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            flat = {**r, "label_a": a.label, "label_b": b.label}
            for side in ("a", "b"):
                flat[f"spread_{side}_min"], flat[f"spread_{side}_max"] = r[f"spread_{side}"] or (None, None)
                flat[f"ci95_{side}_lo"], flat[f"ci95_{side}_hi"] = r[f"ci95_{side}"] or (None, None)
            w.writerow(flat)


def _markdown(rows: list[dict[str, Any]], a: Run, b: Run, pngs: list[Path], warnings: list[str]) -> str:
    lines = [f"# {b.label} against {a.label}", "",
             *(f"- {w}" for w in warnings),
             f"- Measured {PROXY_SIDE} of each run.",
             f"- A = **{a.label}**: `{a.path}` (run {a.run_id or '-'}; engines: {', '.join(a.engines)}); {a.slo_text}",
             f"- B = **{b.label}**: `{b.path}` (run {b.run_id or '-'}; engines: {', '.join(b.engines)}); {b.slo_text}",
             *(f"- {side} measured {'; '.join(run.builds)}" for side, run in (("A", a), ("B", b)) if run.builds),
             *(f"- {side}: {w}" for side, run in (("A", a), ("B", b)) for w in run.warnings),
             "- Value of a run: the median over rounds of each round's figure, in ms, % or tok/s; beside it "
             "[min–max over rounds] and (CI lo–hi), a bootstrap 95% interval of the median where there are "
             "enough requests.",
             "- Delta: (B − A) / A in per cent.", f"- Verdict rule: {RULE}", ""]
    fmt = {"A": lambda r, _: fmt_noise(r["cell_a"], r["metric"]), "B": lambda r, _: fmt_noise(r["cell_b"], r["metric"]),
           "delta_pct": fmt_delta, "metric": lambda r, _: title_of(r["metric"])}
    for cell in dict.fromkeys(r["scenario"] for r in rows):
        first = next(r for r in rows if r["scenario"] == cell)
        lines += [f"## {cell}", "", f"Load: A {first['load_a']}, B {first['load_b']}.", ""]
        lines += md_table([r for r in rows if r["scenario"] == cell],
                          ["metric", "A", "B", "delta_pct", "verdict", "why"], fmt)
        lines.append("")
    alone = unpaired(a, b)
    for side, run in (("a", a), ("b", b)):
        if alone[side]:
            lines += [f"Not compared, only in {side.upper()} ({run.label}): {', '.join(alone[side])}.", ""]
    lines += ["Charts: " + ", ".join(f"`{p.name}`" for p in pngs), ""] if pngs else []
    return "\n".join(lines)


def compare_dirs(a: Path, b: Path, out: Path, label_a: str = "A", label_b: str = "B", *,
                 engine_a: str | None = None, engine_b: str | None = None, run_a: str | None = None,
                 run_b: str | None = None, config: Config | None = None,
                 config_path: Path | str | None = None, png: bool = True) -> dict[str, Any]:
    """Compare two records directories; writes compare.md, compare.csv and (``png``) one PNG per
    metric under ``out``; returns {"rows", "files"}.  Raises CompareError, MergeError, OutDirError."""
    from .compare_plot import plot_metric

    judge: dict[str, Any] = {"config": config, "config_path": config_path}
    side_a = load_run(Path(a), label_a, engine_a, run=run_a, flag="--run-a", **judge)
    side_b = load_run(Path(b), label_b, engine_b, run=run_b, flag="--run-b", **judge)
    if Path(a).resolve() == Path(b).resolve() and (side_a.run_id, side_a.engines) == (side_b.run_id, side_b.engines):
        raise CompareError(f"A and B are the same records ({a}): the same run and engines ({', '.join(side_a.engines)})"
                           " compared with themselves say nothing; name an engine on each side (--label-a sglang "
                           "--label-b vllm, or --engine-a/--engine-b) or give another run as B")
    rows = compare_runs(side_a, side_b)
    if not rows:
        raise CompareError(f"{label_a} and {label_b} share no scenario: nothing to compare")
    make_dir(out)
    sides = (side_a.label, side_a.engines), (side_b.label, side_b.engines)
    pngs = [plot_metric([r for r in rows if r["metric"] == m.key], m, *sides, out / f"{m.key}.png")
            for m in METRICS if png]
    csv_path, md_path = out / "compare.csv", out / "compare.md"
    _csv(csv_path, rows, side_a, side_b)
    mixed = sides_t0_warning(side_a.added, side_b.added, side_a.label, side_b.label)
    warnings = [mixed] if mixed else []
    md_path.write_text(_markdown(rows, side_a, side_b, pngs, warnings), encoding="utf-8")
    clean = [{k: v for k, v in r.items() if k not in ("cell_a", "cell_b")} for r in rows]
    return {"rows": clean, "files": [md_path, csv_path, *pngs], "unpaired": unpaired(side_a, side_b),
            "warnings": warnings}
