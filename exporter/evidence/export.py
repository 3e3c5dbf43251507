"""``evidence export``: every panel's query over an absolute window, with data-point checks.

Writes, under the output directory:

* ``data/<board>/<panel>.csv`` and ``.json``: the series of each panel query;
* ``<board>.png``: the board in a light layout (matplotlib), the window on the figure (not with
  ``png=False``, ``--no-png``: drawing is most of an export's time);
* ``grafana/<board>-<panel>.png``: Grafana's own rendering, with ``--grafana``;
* ``EVIDENCE.md``: per panel the exact PromQL (the boards' Grafana variables filled in: every value,
  but ``$scenario`` of a scenario window, which is its scenario: :func:`scenario_filter`), the
  window (UTC and unix), the step, series
  and point counts, gaps longer than two steps, NaN and empty-series counts, and the first
  and last sample times; how the exact counts were taken: inside the window, or, for a window
  shorter than two scrape intervals, once from the scrapes around it (:mod:`.counts`);
* ``manifest.json``: the SHA-256 of every file above, Prometheus's build info, the tool
  version, the window and the step.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import requests

from dashboards.catalogue import BOARDS, MIXIN, RATE_WINDOW, Board, Panel, boards_for, expand
from dashboards.promql import job_selector
from exporter import __version__

from .counts import CountSpan, exact_counts
from .evidence_md import QueryEvidence, evidence_markdown, panel_kind
from .export_files import BoardLook, board_files
from .identity import for_window
from .outdir import OutDirError, check_out, prepare_out
from .promapi import MAX_POINTS, PromError, Prometheus, parse_duration
from .stepcheck import check_count_step
from .timeaxis import round_marks
from .totals import rate_note, round_totals, shortest_span, totals_lines
from .windows import Window, WindowError, check_not_future, iso, scenario_of

__all__ = ["ExportError", "QueryEvidence", "export", "verify_manifest", "GRAFANA_TOKEN_ENV", "choose_step", "PromError",
           "grid_start", "DEFAULT_STEP_S", "scenario_filter", "regex_literal"]

GRAFANA_TOKEN_ENV = "LLMBENCH_GRAFANA_TOKEN"
TARGET_POINTS = 1500
#: The step (and assumed scrape interval) when the backend does not tell its scrape interval.
DEFAULT_STEP_S = 15.0


class ExportError(Exception):
    """A failure the user can act on (exit status 2)."""


def _legend(fmt: str, labels: dict[str, str]) -> str:
    name = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()
    return name or json.dumps(labels, sort_keys=True)


def choose_step(window: Window, scrape_s: float | None, step: float | None) -> tuple[float, str]:
    """The step and a note on where it came from.  Default: about 1,500 points, never finer
    than the scrape interval (or :data:`DEFAULT_STEP_S` where the backend does not tell it)."""
    if step is None:
        floor = DEFAULT_STEP_S if scrape_s is None else scrape_s
        chosen = float(max(floor, math.ceil(window.seconds / TARGET_POINTS), 1))
        if scrape_s is None:
            return chosen, (f"default: the backend does not report its scrape interval, so {DEFAULT_STEP_S:g} s "
                            "or ~1,500 points is assumed; set --step to the scrape interval")
        return chosen, f"default: ~{TARGET_POINTS} points, not below the scrape interval {scrape_s:g} s"
    if not math.isfinite(step) or step <= 0:
        raise ExportError(f"--step must be a positive number of seconds, not {step:g}")
    points = math.floor(window.seconds / step) + 1
    if points > MAX_POINTS:
        raise ExportError(f"--step {step:g}s gives {points} points per series over {window.seconds:.0f}s; "
                          f"Prometheus allows {MAX_POINTS}: use --step {math.ceil(window.seconds / (MAX_POINTS - 1))} or more")
    return step, "--step"


def grid_start(window: Window, step: float) -> float:
    """The first point of a grid of ``step`` that ends exactly on the window's end."""
    return window.end - math.floor(window.seconds / step + 1e-9) * step


#: RE2's metacharacters (Prometheus' regex matchers): escaped with a backslash in a literal.
_RE2_META = frozenset("\\.+*?()|[]^$")
#: Characters written as ``\\x{..}`` instead: the selector's own punctuation (braces, commas, quotes).
_AS_HEX = frozenset('{},"')


def regex_literal(text: str) -> str:
    """``text`` as a Prometheus regex matcher's value (inside its double quotes) that matches it
    exactly: RE2's metacharacters escaped, a selector's punctuation and control characters as
    ``\\x{..}``, then each backslash doubled for the PromQL string."""
    pattern = "".join(f"\\{c}" if c in _RE2_META else f"\\x{{{ord(c):x}}}" if c in _AS_HEX or not c.isprintable()
                      else c for c in text)
    return pattern.replace("\\", "\\\\")


def scenario_filter(window: Window) -> str | None:
    """The scenario a ``scenario:NAME[#ROUND][:steady[:ENGINE]]`` window is of (its boards' ``$scenario``
    then matches it only, as the board does with that scenario selected: scenarios run in the
    same minutes stay out of its 1-minute rates); None for any other window (``$scenario``
    matches every scenario)."""
    return scenario_of(window.spec)


def rate_window(scrape_s: float) -> str:
    """The catalogue's 1-minute window, widened when the scrape interval is too coarse for it."""
    need = 4 * scrape_s
    return RATE_WINDOW if parse_duration(RATE_WINDOW) >= need else f"{math.ceil(need)}s"


def _evidence(prom: Prometheus, panel: Panel, window: Window, step: float, rw: str,
              span: CountSpan | None, variables: dict[str, str] | None = None) -> list[QueryEvidence]:
    """Each query of the panel over the window's grid; with ``span`` (an exact-count panel of a
    short window) once, at ``span.at`` over ``span.range_s``.  ``variables``: Grafana variables that
    match one value (``scenario``), the others match every value."""
    out = []
    range_s, first, last = (window.seconds, grid_start(window, step), window.end) if span is None else \
        (span.range_s, span.at, span.at)
    for q in panel.queries:
        expr = expand(q.expr, range_s=range_s, **(variables or {})).replace(f"[{RATE_WINDOW}]", f"[{rw}]")
        ev = QueryEvidence(q.ref, expr, q.legend, span=span, first_bucket=first_bucket_bound(prom, expr, last))
        for s in prom.query_range(expr, first, last, step):
            times = [float(t) for t, _ in s["values"]]
            values = [float(v) for _, v in s["values"]]
            ev.series.append({"name": _legend(q.legend, s["metric"]), "labels": s["metric"],
                              "times": times, "values": values})
            ev.points += len(values)
            nan = sum(1 for v in values if math.isnan(v))
            ev.nan += nan
            if nan == len(values):
                ev.empty_series += 1
            ev.gaps += [(a, b) for a, b in zip(times, times[1:]) if b - a > 2 * step]
            if ev.first_bucket is not None:
                ev.in_first_bucket += sum(1 for v in values if 0 < v <= ev.first_bucket)
            if times:
                ev.first = times[0] if ev.first is None else min(ev.first, times[0])
                ev.last = times[-1] if ev.last is None else max(ev.last, times[-1])
        out.append(ev)
    return out


_QUANTILE_OF = re.compile(r"^histogram_quantile\([\d.]+, .*?rate\(([^\[]+_bucket[^\[]*)\[")


def first_bucket_bound(prom: Prometheus, expr: str, at: float) -> float | None:
    """The lowest finite bucket bound of the histogram a ``histogram_quantile`` query reads (None
    for any other query, or where the histogram has no series): a quantile at or below it only
    says "below that bound" (vLLM's queue-time buckets start at 0.3 s)."""
    m = _QUANTILE_OF.match(expr)
    if m is None:
        return None
    bounds = [float(s["metric"]["le"]) for s in prom.query(f"group by (le) ({m.group(1)})", at)
              if s["metric"].get("le") not in (None, "+Inf")]
    positive = [b for b in bounds if b > 0]  # a bucket of 0 holds exact zeros: the first to place a value is above
    return min(positive) if positive else None


def _grafana(url: str, token: str, board_key: str, board: Board, window: Window, out: Path) -> list[Path]:
    """Grafana's own PNG of each panel (``/render/d-solo``), light theme, same window."""
    from dashboards.boards import build

    panels = [p for p in build(board)["panels"] if p["type"] != "row"]
    paths = []
    for panel, built in zip(board.panels, panels):
        params = {"orgId": 1, "panelId": built["id"], "from": int(window.start * 1000), "to": int(window.end * 1000),
                  "width": 1000, "height": 500, "theme": "light", "tz": "UTC"}
        try:
            r = requests.get(f"{url.rstrip('/')}/render/d-solo/{board.uid}/{board.uid}", params=params,
                             headers={"Authorization": f"Bearer {token}"}, timeout=120)
        except requests.RequestException as exc:
            raise ExportError(f"cannot reach Grafana at {url}: {type(exc).__name__}") from None
        if r.status_code != 200 or not r.content.startswith(b"\x89PNG"):
            raise ExportError(f"Grafana render of {board_key}/{panel.key} failed: HTTP {r.status_code}")
        path = out / "grafana" / f"{board_key}-{panel.key}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(r.content)
        paths.append(path)
    return paths


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _query_all(prom: Prometheus, boards: dict[str, Board], window: Window, step: float, rw: str,
               span: CountSpan | None, progress: bool, scenario: str | None = None, engine: str | None = None
               ) -> dict[str, dict[str, list[QueryEvidence]]]:
    """Every panel's evidence; ``scenario``: the scenario filter (:func:`scenario_filter`); ``engine``:
    the boards' ``$engine`` matches that engine only (exact counts too)."""
    variables = {} if scenario is None else {"scenario": regex_literal(scenario)}
    only = {} if engine is None else {"engine": regex_literal(engine)}
    variables.update(only)
    results: dict[str, dict[str, list[QueryEvidence]]] = {}
    total = sum(len(b.panels) for b in boards.values())
    done = 0
    for name, board in boards.items():
        results[name] = {}
        for panel in board.panels:
            if panel_kind(panel) == "exact-count":  # unfiltered: every request that ended in the window
                results[name][panel.key] = _evidence(prom, panel, window, step, rw, span, only)
            else:
                results[name][panel.key] = _evidence(prom, panel, window, step, rw, None, variables)
            done += 1
            if progress:
                sys.stderr.write(f"\rquerying panels {done}/{total}")
                sys.stderr.flush()
    if progress:
        sys.stderr.write("\n")
    return results


def _llmbench_jobs(prom: Prometheus, at: float, range_s: float) -> list[str]:
    """The jobs under which Prometheus has ``llmbench_`` series in the ``range_s`` before ``at``."""
    expr = f'group by (job) (last_over_time({{__name__=~"llmbench_.+"}}[{max(300, math.ceil(range_s))}s]))'
    return sorted({s["metric"].get("job", "") for s in prom.query(expr, at)})


def _no_series(prom: Prometheus, window: Window, job: str | None, scenario: str | None = None) -> str:
    """Every panel of the proxies' boards empty: the selector used, and the jobs that do have the
    proxies' series (in the window, else now), in one line."""
    selector = job_selector(job)
    found = _llmbench_jobs(prom, window.end, window.seconds)
    others = [j for j in found if j != (job or MIXIN.job)]
    if others:
        where = (f"Prometheus has llmbench_ series then under job {', '.join(repr(j) for j in others)}: "
                 f"pass --job {others[0]}")
    elif found:
        where = f"Prometheus has llmbench_ series then only under job {found[0]!r}, but none that a panel selects"
    else:
        now = _llmbench_jobs(prom, time.time(), 300)
        where = ("Prometheus has no llmbench_ series under any job then: check the window"
                 + (f" (it has them now under job {', '.join(repr(j) for j in now)})" if now else
                    " and that the backend scraped (or received) the exporter"))
    return (f"no samples in the window {iso(window.start)} to {iso(window.end)}: every panel of the proxies' "
            f"boards is empty with the selector {{{selector}}}"
            + (f" and the scenario filter {scenario!r}" if scenario is not None else "") + f"; {where}")


def proxy_panels_empty(boards: dict[str, Board], results: dict[str, dict[str, list[QueryEvidence]]],
                       job: str | None) -> bool:
    """Whether every query of the proxies' boards on the proxies' series (with the proxies'
    selector; every query where the boards chosen have none) found no sample."""
    selector = job_selector(job)
    queries = [ev for b, board in boards.items() for p in board.panels for ev in results[b][p.key]]
    proxy = [ev for ev in queries if selector in ev.expr] or queries
    return not any(ev.points - ev.nan for ev in proxy)


def _grafana_token(grafana: str | None) -> str | None:
    if not grafana:
        return None
    token = os.environ.get(GRAFANA_TOKEN_ENV)
    if not token:
        raise ExportError(f"--grafana needs a service-account token in the environment variable {GRAFANA_TOKEN_ENV}")
    return token


def _write_all(out: Path, boards: dict[str, Board], results: dict[str, dict[str, list[QueryEvidence]]],
               window: Window, step: float, rw: str, grafana: str | None, token: str | None,
               look: BoardLook) -> list[Path]:
    """The data files and the PNG of each board (:func:`.export_files.board_files`), and Grafana's
    PNGs with ``grafana``."""
    files = board_files(out, boards, results, window, step, rw, look)
    if grafana and token:
        for b in results:
            files += _grafana(grafana, token, b, boards[b], window, out)
    return files


def _check_args(window: Window, out: Path, boards: list[str] | None, step: float | None, force: bool) -> list[str]:
    """The boards to export; ExportError, before any query, for an unknown board, a window in the
    future, an output directory in use and a bad ``--step``."""
    names = boards or list(BOARDS)
    unknown = [b for b in names if b not in BOARDS]
    if unknown:
        raise ExportError(f"unknown boards {unknown}; choose from {sorted(BOARDS)}")
    try:
        check_not_future(window)
        check_out(out, force)
    except (WindowError, OutDirError) as exc:
        raise ExportError(str(exc)) from None
    if step is not None:
        choose_step(window, None, step)
    return names


def export(prom: Prometheus, window: Window, out: Path, boards: list[str] | None = None, step: float | None = None,
           grafana: str | None = None, progress: bool | None = None, force: bool = False,
           job: str | None = None, records: Path | None = None, engine: str | None = None, png: bool = True) -> dict[str, Any]:
    """Run the export; returns the manifest.  Raises ExportError/PromError with a clear message.
    ``job``: the proxies' Prometheus job (default: the mixin's); ``records``: their records directory
    (its ``engines.jsonl`` names the engines and the proxy, else ``llmbench_engine_info`` does; its
    ``scenarios.jsonl`` marks where each round began on the PNGs); ``engine``: that engine's series only;
    ``png``: draw each board's PNG (False: the data, EVIDENCE.md and the manifest only)."""
    progress = sys.stderr.isatty() if progress is None else progress
    names = _check_args(window, out, boards, step, force)
    token = _grafana_token(grafana)
    backend = prom.backend()
    if backend["name"] == "VictoriaMetrics":
        prom.extra_params["nocache"] = "1"  # no response cache: it would round the grid to step multiples
    intervals = prom.scrape_intervals()
    step, step_note = choose_step(window, min(intervals.values()) if intervals else None, step)
    rw = rate_window(max(intervals.values(), default=DEFAULT_STEP_S))
    counts = exact_counts(window, intervals.get(job or MIXIN.job) or max(intervals.values(), default=step))
    if (count_step := check_count_step(prom, job or MIXIN.job, window, intervals))["warning"]:
        print(f"warning: {count_step['warning']}", file=sys.stderr)
    every = boards_for(job)
    chosen = {name: every[name] for name in names}
    scenario = scenario_filter(window)
    results = _query_all(prom, chosen, window, step, rw, counts.span, progress, scenario, engine)
    no_series = _no_series(prom, window, job, scenario) if proxy_panels_empty(chosen, results, job) else None
    totals = round_totals(prom, window, counts.scrape_s, job, records=records)
    short = shortest_span(window.seconds, totals)  # a round shorter than the window holding it
    short_rates = rate_note(short[0], parse_duration(rw), rw, short[1])
    try:
        prepare_out(out, force)
    except OutDirError as exc:
        raise ExportError(str(exc)) from None
    rounds = round_marks(records, window.run, engine, window.start, window.end)
    look = BoardLook(scenario, totals is not None, short, rounds, engine, png)
    files = _write_all(out, chosen, results, window, step, rw, grafana, token, look)
    md = out / "EVIDENCE.md"
    md.write_text(evidence_markdown(window, step, step_note, rw, backend, prom.url, results, counts.note,
                                    selector=job_selector(job), no_series=no_series, rate_note=short_rates,
                                    scenario_filter=scenario, pngs=png,
                                    totals=None if totals is None else totals_lines(totals, window.spec))
                  + (f"\n**Warning:** {count_step['warning']}\n" if count_step["warning"] else ""), encoding="utf-8")
    files.append(md)
    manifest = {
        "tool": "llm-bench-exporter evidence", "version": __version__,
        "created_utc": iso(time.time()),
        "prometheus": {"url": prom.url, "backend": backend, "buildinfo": prom.buildinfo(),
                       "headers": prom.header_names, "scrape_intervals_s": intervals},
        "window": {"spec": window.spec, "source": window.source, "start": window.start, "end": window.end,
                   "start_utc": iso(window.start), "end_utc": iso(window.end), "run": window.run},
        "scenario_filter": scenario, "engine_filter": engine, "rounds_marked": len(rounds), "pngs": png,
        **({} if totals is None else {"round_totals": totals}),
        "rate_note": short_rates, "no_series": no_series,
        "step_s": step, "step_note": step_note, "grid_start": grid_start(window, step),
        "rate_window": rw, "exact_counts": counts.manifest(), "count_step_check": count_step, "boards": names, "job": job or MIXIN.job,
        "files": [{"path": str(p.relative_to(out)), "bytes": p.stat().st_size, "sha256": _sha256(p)}
                  for p in sorted(files)],
        **for_window(records, window.start, window.end, prom, job or MIXIN.job),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return manifest


def verify_manifest(out: Path) -> list[str]:
    """Files whose SHA-256 no longer matches the manifest (empty when all verify)."""
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    bad = []
    for f in manifest["files"]:
        p = out / f["path"]
        if not p.exists() or _sha256(p) != f["sha256"]:
            bad.append(f["path"])
    return bad

