"""Where TTFT went, the caveats drawn from the data, and the history against ``--baseline``: each
from what ``evidence summarize`` computed (its ``ttft_parts``, ``rounds``, ``histogram_vs_exact``,
``engines_compared``, ``warnings``), the history's verdict by the noise rule of ``evidence compare``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..noise import LOADS_DIFFER, METRICS, RULE, delta_pct, human, judged_verdict, unit_of
from ..summarize import UNCERTAIN_OF_TTFT, UNCERTAIN_WARN, uncertainty_warning
from ..ttftparts import md_rows
from .added import added_table
from .doc import Items, Para, Section, Table
from .model import Report
from .sections import fmt_median

__all__ = ["ttft_section", "caveats", "history"]


def ttft_section(report: Report) -> Section:
    s = Section("Where TTFT went")
    rows = md_rows(report.summary.get("ttft_parts") or [])
    if not rows:
        s.blocks.append(Para("Not measured: no record carries the engine's own clock (SGLang's request log joined "
                             "with `evidence summarize --engine-log DIR`, or vLLM's timing in its answers). TTFT "
                             "is shown whole in the core matrix."))
        return s
    s.blocks.append(Table(
        ("engine", "scenario#round", "timed", "at", "TTFT (ms)", "queue (ms)", "prefill (ms)", "outside engine (ms)",
         "mostly"),
        tuple((r["engine"], f"{r['scenario']}#{r['round']}", r["timed"], r["at"], human("ttft_s", r["ttft_s"]),
               human("queue_s", r["queue_s"]), human("prefill_s", r["prefill_s"]), human("outside_s", r["outside_s"]),
               r["mostly"]) for r in rows),
        caption="Per round where the engine's clock was joined: its queue and prefill, and the rest of TTFT "
                "outside the engine (network, the proxy, the engine's HTTP front end)."))
    return s


def _uncertain(report: Report) -> list[str]:
    rounds = report.summary.get("rounds") or []
    out = []
    for engine in report.engines:
        bad = [r for r in rounds if r["engine"] == engine and (r.get("uncertain") or 0) > UNCERTAIN_WARN]
        if bad:
            out.append(f"{engine}: {len(bad)} of {sum(1 for r in rounds if r['engine'] == engine)} rounds have more "
                       f"than {UNCERTAIN_WARN:.0%} of their requests with a timing uncertainty above "
                       f"{UNCERTAIN_OF_TTFT:.0%} of their TTFT (the proxy's event loop lagged; quote their TTFT with "
                       "care): " + ", ".join(f"{r['scenario']}#{r['round']} {r['uncertain']:.0%}" for r in bad))
    return out


def _p99(report: Report) -> str:
    sizes = [int(r["requests"]) for r in report.summary.get("rounds") or []]
    held = f"its rounds hold {min(sizes)} to {max(sizes)} requests" if sizes else "no round"
    return f"P99 is not shown: {held}; a P99 needs far more requests a round than a P95 to mean anything."


def _histograms(report: Report) -> list[str]:
    rows = report.summary.get("histogram_vs_exact")
    if rows is None:
        return ["Histogram P95 against exact: not checked (no --prometheus): the boards' P95 curves are "
                "bucket estimates, the tables here are exact."]
    out = []
    for r in rows:
        rel = r.get("ttft_p95_rel_error")
        if rel is not None:
            out.append(f"{r['engine']} {r['scenario']}: the histogram's TTFT P95 is {rel * 100:+.1f} % off the exact "
                       "P95 (the boards' curves carry that error)")
    return out


def caveats(report: Report, boards_fetched: bool) -> Section:
    s = Section("Caveats")
    items = [*_uncertain(report), *_histograms(report)]
    differ = {(r["scenario"], r["a"], r["b"]) for r in report.summary.get("engines_compared") or []
              if r.get("verdict") == LOADS_DIFFER}
    items += [f"{sc}: {a} and {b} ran different loads; their figures are not compared" for sc, a, b in sorted(differ)]
    items.append(_p99(report))
    if report.unpivoted:
        items.append("Scenarios without a known cell are shown unpivoted: " +
                     ", ".join(sorted({m["scenario"] for m in report.unpivoted})))
    if not boards_fetched:
        items.append("Not measured here: the engines' own time series, GPU and energy (no --prometheus).")
    added = added_table(report)
    if added is None:
        items.append("What the proxy added to the client's TTFT (proxy_added_s) and how t0 was taken (t0_source): "
                     "not recorded (records of an older proxy).")
    uncertain = uncertainty_warning(report.summary)  # its rounds are listed one by one above
    items += [str(w) for w in report.summary.get("warnings") or [] if w != uncertain]
    s.blocks.append(Items(tuple(items)))
    if added is not None:
        s.blocks += [Para("TTFT and what the proxy added to it, per cell:"), added]
    return s


def _pairs(now: Mapping[str, Any], then: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    base = {(m["engine"], m["scenario"]): m for m in then.get("medians") or []}
    return [(base[(m["engine"], m["scenario"])], m) for m in now.get("medians") or []
            if (m["engine"], m["scenario"]) in base]


def history(report: Report, baseline: Mapping[str, Any] | None, baseline_name: str | None) -> Section:
    s = Section("History")
    if baseline is None:
        s.blocks.append(Para("No --baseline given: no earlier run to compare with."))
        return s
    runs = ", ".join(r["run_id"] for r in baseline.get("runs") or [])
    s.blocks.append(Para(f"Against the baseline {baseline_name} (run {runs or '-'}), engines paired by name, each "
                         f"cell's median of rounds. {RULE}"))
    rows = []
    for then, now in _pairs(report.summary, baseline):
        for metric in METRICS:
            key = metric.key
            verdict, why = judged_verdict(then, now, metric)
            unit = unit_of(key)
            rows.append((now["engine"], now["scenario"], f"{metric.title} ({unit})" if unit else metric.title,
                         fmt_median(key, then.get(key), (then.get("spread") or {}).get(key)),
                         fmt_median(key, now.get(key), (now.get("spread") or {}).get(key)),
                         "-" if (d := delta_pct(then.get(key), now.get(key))) is None else f"{d:+.1f} %",
                         f"{verdict}: {why}" if why else (verdict or "-")))
    if not rows:
        s.blocks.append(Para("No (engine, scenario) cell of this run is in the baseline."))
        return s
    s.blocks.append(Table(("engine", "scenario", "figure", "baseline", "this run", "delta", "verdict"), tuple(rows),
                          merge=(0, 1)))
    return s
