"""The report's first sections: what ran (with findings drawn from the data), the core matrix and
the rate sweep.  Values come from :class:`.model.Report`; units are in every column name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..decode import DECODE_KEYS
from ..noise import human
from .doc import Block, Items, Para, Section, Table
from .model import MATRIX_METRICS, MatrixCell, Report

__all__ = ["what_ran", "core_matrix", "rate_sweep", "fmt_median", "unpivoted_table", "decode_blocks"]


def fmt_median(key: str, value: float | None, spread: Sequence[float] | None) -> str:
    """``median [min–max]`` in the key's unit (ms, %, tok/s)."""
    if value is None:
        return "-"
    if not spread or human(key, spread[0]) == human(key, spread[1]):
        return human(key, value)  # one round, or rounds that agree to the digits shown
    return f"{human(key, value)} [{human(key, spread[0])}–{human(key, spread[1])}]"


def _short(value: Any, limit: int = 160) -> str:
    text = str(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _engine_lines(report: Report) -> list[str]:
    lines = []
    for e in report.summary.get("engines") or []:
        if not isinstance(e, Mapping):
            continue
        args = e.get("server_args") or {}
        shown = ", ".join(f"{k}={_short(v)}" for k, v in list(args.items())[:12]) if isinstance(args, Mapping) else ""
        more = f" (+{len(args) - 12} more in summary.json)" if isinstance(args, Mapping) and len(args) > 12 else ""
        ready = [x for x in (e.get("time_to_ready_s") or []) if isinstance(x, (int, float))] \
            if isinstance(e.get("time_to_ready_s"), list) else [e.get("time_to_ready_s")]
        ready_text = ", ".join(f"{x:.1f} s" for x in ready if isinstance(x, (int, float))) or \
            "not measured (up when the proxy started)"
        lines.append(f"{e.get('name')}: {e.get('kind') or 'unknown'} {e.get('version') or '(version not reported)'}, "
                     f"model {e.get('model') or '-'}, max_model_len {e.get('max_model_len') or '-'}; time to "
                     f"ready {ready_text}; launch arguments: "
                     f"{shown or 'not reported'}{more}")
    return lines or ["engines: not known (no engines.jsonl beside the records)"]


def _findings(report: Report) -> list[str]:
    out = []
    for (shape, c), row in sorted(report.matrix.items()):
        cells = list(row.values())
        if len(cells) < 2 or c != max(report.concurrencies(shape)):
            continue
        a, b = cells[0], cells[1]
        ta, tb = a.median.get("output_throughput_tok_s"), b.median.get("output_throughput_tok_s")
        if ta and tb:
            out.append(f"{shape} at C{c}: output throughput {a.engine} {ta:.1f} vs {b.engine} {tb:.1f} tok/s "
                       f"({(tb - ta) / ta * 100:+.1f} % for {b.engine}); TTFT P95 "
                       f"{human('ttft_p95_s', a.median.get('ttft_p95_s'))} vs "
                       f"{human('ttft_p95_s', b.median.get('ttft_p95_s'))} ms.")
    for engine, t in sorted(report.totals.get("per_engine", {}).items()):
        if t["failures"]:
            out.append(f"{engine}: {t['failures']} of {t['requests']} requests failed (see Failures).")
    return out or ["No cell ran on two engines with a known shape and concurrency: no side-by-side finding."]


def _slo_text(source: Any) -> str:
    if isinstance(source, Mapping):
        return str(source.get("text") or "SLO: as each record says")
    return str(source or "SLO: as each record says")


def what_ran(report: Report) -> Section:
    s = Section("What ran")
    proxy = report.summary.get("proxy") or {}
    t = report.totals
    s.blocks.append(Items(tuple(_engine_lines(report)) + (
        f"proxy: llm-bench-exporter {proxy.get('version') or '-'}, config SHA-256 "
        f"{proxy.get('config_sha256') or 'not known'}; run ids: {', '.join(proxy.get('run_ids') or [report.run_id])}",
        f"totals: {t['rounds']} rounds, {t['requests']} requests, {t['failures']} failures "
        f"({t['captures_kept']} raw captures kept); warm-up requests apart: {t['warmup_requests']}; calibration "
        f"requests apart: {t['calibration_requests']} (neither is in any denominator)",
        f"measured: {report.summary.get('measured')}; {_slo_text(report.summary.get('slo_source'))}",
    )))
    s.blocks.append(Para("Findings, from the data:"))
    s.blocks.append(Items(tuple(_findings(report))))
    return s


def _cell_text(cell: MatrixCell | None, key: str) -> str:
    if cell is None:
        return "not run"
    if key == "success":
        k, n = cell.success
        return f"{k}/{n}"
    if key == "passed":
        r, total = cell.passed
        return f"{r}/{total}"
    value, spread = cell.value(key)
    return fmt_median(key, value, spread) + (" †" if cell.loads_differ else "")


def core_matrix(report: Report) -> Section:
    s = Section("Core matrix")
    if not report.matrix:
        s.blocks.append(Para("No closed-loop cell with a known shape (input/output tokens) and concurrency: "
                             "`load` announces them, or give --plan FILE. The scenarios follow unpivoted."))
        s.blocks.append(unpivoted_table(report.unpivoted))
        return s
    concs = report.concurrencies()
    head = ("shape (in/out tokens)", "figure", *(f"C{c} {e}" for c in concs for e in report.engines))
    figures = (("success", "success k/n (requests)"), ("passed", "rounds passed r/R"),
               *((k, f"{label} ({unit}), median [min–max]") for k, label, _, unit in MATRIX_METRICS))
    rows = []
    for shape in report.shapes:
        for key, label in figures:
            rows.append((shape, label, *(_cell_text(report.matrix.get((shape, c), {}).get(e), key)
                                         for c in concs for e in report.engines)))
    s.blocks.append(Table(head, tuple(rows), merge=(0,), caption="Each figure is the median over the cell's rounds "
                          "with the rounds' [min–max]; success k/n adds up the rounds (client aborts in n); a round "
                          "passed when every request of it succeeded. † the two engines' loads differ here (as "
                          "`evidence compare` judges it): their figures are not comparable."))
    if report.unpivoted:
        s.blocks.append(Para("Scenarios with no known closed-loop cell or rate (shown unpivoted):"))
        s.blocks.append(unpivoted_table(report.unpivoted))
    return s


def unpivoted_table(medians: Sequence[Mapping[str, Any]]) -> Table:
    head = ("engine", "scenario", "success k/n", "rounds passed", "TTFT P95 (ms)", "TPOT P95 (ms)",
            "output throughput (tok/s)")
    rows = tuple((m["engine"], m["scenario"], f"{m.get('success')}/{m.get('requests')}",
                  f"{m.get('rounds_passed')}/{m.get('rounds')}",
                  *(fmt_median(k, m.get(k), (m.get("spread") or {}).get(k))
                    for k in ("ttft_p95_s", "tpot_p95_s", "output_throughput_tok_s"))) for m in medians)
    return Table(head, rows)


def _stop_lines(stops: Sequence[Mapping[str, Any]], report: Report) -> list[str]:
    lines = []
    for stop in stops:
        skipped = ", ".join(stop.get("skipped") or []) or "none"
        lines.append(f"{stop.get('engine', '')} stage {stop.get('stage')}: stopped after {stop.get('after')} "
                     f"({stop.get('reason')}); cells not run: {skipped}".strip())
    ran = {m["scenario"] for m in report.summary.get("medians") or []}
    planned = [c for c in report.cells.values() if c.rate and c.scenario not in ran]
    if planned:
        lines.append("rate cells planned that have no records: " + ", ".join(c.scenario for c in planned))
    return lines


def rate_sweep(report: Report, stops: Sequence[Mapping[str, Any]]) -> Section:
    s = Section("Rate sweep")
    if not report.sweep:
        s.blocks.append(Para("No rate cell (open loop, Poisson arrivals) in this run."))
    else:
        head = ("rate (req/s)", *(f"{e} {x}" for e in report.engines for x in
                                  ("success k/n", "SLO attainment (%)", "goodput (tok/s)", "offered (req/s)")))
        rows = []
        for rate in sorted(report.sweep):
            cells: list[str] = [f"{rate:g}"]
            for e in report.engines:
                m = report.sweep[rate].get(e)
                cells += ["not run"] * 4 if m is None else [
                    f"{m.get('success')}/{m.get('requests')}",
                    fmt_median("goodput_ratio", m.get("goodput_ratio"), (m.get("spread") or {}).get("goodput_ratio")),
                    fmt_median("goodput_tok_s", m.get("goodput_tok_s"), (m.get("spread") or {}).get("goodput_tok_s")),
                    human("offered_rate_rps", m.get("offered_rate_rps"))]
            rows.append(tuple(cells))
        s.blocks.append(Table(head, tuple(rows), caption="SLO attainment: requests that met the SLO over judged "
                              "requests (failures count as not met), median of rounds [min–max]."))
    lines = _stop_lines(stops, report)
    s.blocks.append(Para("Stop rule events: " + ("none recorded" if not lines else "")))
    if lines:
        s.blocks.append(Items(tuple(lines)))
    return s

_HEAD = {"itl_p50_med_s": "ITL med P50 (ms)", "itl_p95_med_s": "ITL med P95 (ms)",
         "itl_p99_med_s": "ITL med P99 (ms)",
         "itl_max_s": "ITL max (ms)", "decode_stalls": "decode stalls", "tokens_per_event_mean": "tokens/event",
         "ttft_p50_s": "TTFT P50 (ms)", "ttft_p95_s": "TTFT P95 (ms)", "ttfo_p50_s": "TTFO P50 (ms)",
         "ttfo_p95_s": "TTFO P95 (ms)", "spec_acceptance_ratio": "spec acceptance (%)"}


def _where(report: Report, scenario: str) -> tuple[tuple[int, int, int, str], str]:
    """A sort key (shape, concurrency, then the scenario) and the cell's name."""
    info = report.cells.get(scenario)
    if info is not None and info.shape and info.concurrency:
        return (info.input_tokens or 0, info.output_tokens or 0, info.concurrency, ""), f"{info.shape} C{info.concurrency}"
    if info is not None and info.rate:
        return (1 << 30, 0, 0, scenario), f"{scenario} ({info.rate:g} req/s)"
    return (1 << 31, 0, 0, scenario), scenario


def _shown(cells: list[Mapping[str, Any]]) -> list[str]:
    """The figures any cell has (TTFO only where answers were told apart, spec only where reported)."""
    return [k for k in DECODE_KEYS if any(c.get(k) is not None for c in cells)]


def decode_blocks(report: Report) -> list[Block]:
    """The core matrix's decode table and its embeddings and rerank rounds, read from what
    ``evidence summarize`` computed (``decode_cells``, ``pooling``): a row per cell, engine and
    route, each figure the median of the cell's rounds with their [min–max], as the matrix shows."""
    calib = set(report.calibration)
    cells = [c for c in report.summary.get("decode_cells") or [] if c["scenario"] not in calib]
    blocks: list[Block] = []
    if cells:
        keys = _shown(cells)
        routes = len({c["route"] for c in cells}) > 1
        rank = {e: i for i, e in enumerate(report.engines)}
        cells.sort(key=lambda c: (_where(report, c["scenario"])[0], rank.get(c["engine"], len(rank)), c["route"]))
        head = ("cell", "engine", *(("route",) if routes else ()), *(_HEAD[k] for k in keys))
        rows = tuple((_where(report, c["scenario"])[1], c["engine"], *((c["route"],) if routes else ()),
                      *(fmt_median(k, c.get(k), (c.get("spread") or {}).get(k)) for k in keys)) for c in cells)
        blocks += [Para("Decode, per cell: the gaps between visible-text arrivals, each shared by the tokens the "
                        "later arrival carried, TTFT beside TTFO."),
                   Table(head, rows, merge=(0,), caption="Each figure is the median over the cell's rounds with "
                         "the rounds' [min–max]; in a round, " + str(report.summary.get("decode_note", "")) + ".")]
    pooled = [p for p in report.summary.get("pooling") or [] if p["scenario"] not in calib]
    if pooled:
        rows = tuple((_where(report, p["scenario"])[1], p["engine"], p["route"], str(p["round"]),
                      f"{p['success']}/{p['requests']}", fmt_median("e2e_p50_s", p.get("e2e_p50_s"), None),
                      fmt_median("e2e_p95_s", p.get("e2e_p95_s"), None)) for p in pooled)
        blocks.append(Table(("cell", "engine", "route", "round", "success k/n", "E2E P50 (ms)", "E2E P95 (ms)"), rows,
                            caption="Embeddings and rerank rounds, per round: " + str(report.summary.get("pooling_note"))
                            + "; not in the tables above."))
    return blocks
