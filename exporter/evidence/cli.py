"""``evidence``: export Prometheus windows for reports, re-decode raw SSE, summarize and compare runs."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dashboards.catalogue import BOARDS, MIXIN
from dashboards.promql import check_job
from exporter import __version__

from .decode import decode_capture, format_row
from .export import DEFAULT_STEP_S, GRAFANA_TOKEN_ENV, TARGET_POINTS, ExportError, export
from .llmd_cli import add_parser as report_parser
from .merge import MergeError, load_many
from .mooncake import add_parser as trace_parser
from .outdir import OutDirError
from .promapi import TOKEN_ENV, PromError, Prometheus, parse_header
from .tokens import TokenizerError, load_vocabulary
from .totals import totals_line
from .windows import WindowError, iso, parse_window

__all__ = ["main", "build_parser"]


def _fail(msg: str) -> int:
    print(f"evidence: {msg}", file=sys.stderr)
    return 2


def _prom(args: argparse.Namespace) -> Prometheus:
    headers = dict(parse_header(h) for h in args.header or [])
    return Prometheus(args.prometheus, headers=headers)


def cmd_export(args: argparse.Namespace) -> int:
    try:
        if args.job is not None:
            check_job(args.job)  # before any query: a bad name is the user's mistake, not Prometheus'
        prom = _prom(args)
        window = parse_window(args.window, prom=prom, records=Path(args.records) if args.records else None,
                              run=args.run)
        manifest = export(prom, window, Path(args.out), boards=args.boards, step=args.step, grafana=args.grafana,
                          force=args.force, job=args.job, records=Path(args.records) if args.records else None,
                          engine=args.engine, png=args.png)
    except (ValueError, WindowError, ExportError, PromError) as exc:
        return _fail(str(exc))
    backend = manifest["prometheus"]["backend"]
    print(f"window {iso(window.start)} to {iso(window.end)} ({window.source}), step {manifest['step_s']:g}s "
          f"({manifest['step_note']}); backend {backend['name']} {backend.get('version') or ''}".rstrip()
          + f": {len(manifest['files'])} files in {args.out} (EVIDENCE.md, manifest.json)")
    if manifest["exact_counts"]["widened"]:
        print(f"exact counts {manifest['exact_counts']['note']}")
    for line in manifest.get("warnings") or []:  # e.g. an engine whose version changed inside a run
        print(line, file=sys.stderr)
    for engine, t in (manifest.get("round_totals") or {}).items():
        print(totals_line(engine, t))
    if manifest.get("no_series"):  # the files are written: they show the empty panels and the selector
        print(f"evidence: {manifest['no_series']} (files written to {args.out})", file=sys.stderr)
        return 3
    return 0


def cmd_decode(args: argparse.Namespace) -> int:
    vocabulary = None
    if args.tokenizer is not None:
        try:
            vocabulary = load_vocabulary(args.tokenizer)
        except TokenizerError as exc:
            print(f"evidence decode: {exc}", file=sys.stderr)
            return 2
    results = [decode_capture(Path(p), vocabulary) for p in args.captures]
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for r in results:
            print(format_row(r))
    unreadable = [r for r in results if r["verdict"] == "unreadable"]
    for r in unreadable:  # not a capture (or not one of ours): the user's mistake, not a failed check
        print(f"evidence decode: {r['capture']} is not a readable capture: {r['reason']}", file=sys.stderr)
    return 2 if unreadable else 0 if all(r["ok"] for r in results) else 1


def _one_line(exc: Exception) -> str:
    """A config error (one line per bad field) as one line."""
    return "; ".join(x.strip() for x in str(exc).splitlines() if x.strip())


def _judge_config(args: argparse.Namespace) -> Any:
    """The proxy config given by ``--config`` (its slo and slo_by_scenario judge older records)."""
    if not getattr(args, "config", None):
        return None
    from exporter.proxy.config import load_config

    return load_config(args.config)


def cmd_summarize(args: argparse.Namespace) -> int:
    from exporter.proxy.config import ConfigError

    from .enginelog import engine_log_lines, join_dirs
    from .experiment import parse_expect
    from .outdir import check_out, prepare_out
    from .runs import RunError, refuse_client_side
    from .summarize import summarize, write_summary
    from .summary_md import summary_markdown

    try:
        if args.out:
            check_out(Path(args.out), args.force)  # before any work: never write into an earlier output
        expect = parse_expect(args.expect) if args.expect else None
        config = _judge_config(args)
        records, notes = load_many([Path(p) for p in args.records])
        if not records:
            return _fail(f"no records in {', '.join(args.records)}")
        refuse_client_side(records, ", ".join(args.records))
        engine_log = join_dirs(records, [Path(p) for p in args.engine_log]) if args.engine_log else None
        if engine_log is not None:
            records = engine_log[0]  # with SGLang's own clock joined by response id
        prom = _prom(args) if args.prometheus else None
        summary = summarize(records, prom, config=config, config_path=args.config, run=args.run, expect=expect,
                            records_dirs=[Path(p) for p in args.records])
        if engine_log is not None:
            summary["engine_log"] = engine_log[1]
        if len(args.records) > 1:
            summary["sources"] = notes
        if args.out:
            prepare_out(Path(args.out), args.force)
        paths = write_summary(summary, Path(args.out)) if args.out else []  # beside the records only when asked
    except ConfigError as exc:
        return _fail(_one_line(exc))
    except (MergeError, OutDirError, PromError, RunError, ValueError) as exc:
        return _fail(str(exc))
    print(summary_markdown(summary))
    print("written: " + ", ".join(str(p) for p in paths) if paths else
          "nothing written: --out DIR writes summary.md, summary.json and the CSV tables")
    for line in summary.get("warnings") or []:  # timing uncertainty; an engine whose version changed in a run
        print(line, file=sys.stderr)
    for line in engine_log_lines(summary["engine_log"])[1] if engine_log is not None else []:
        print(line, file=sys.stderr)  # parts the engine log lacks
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from exporter.proxy.config import ConfigError

    from .compare import CompareError, compare_dirs
    from .outdir import check_out, prepare_out

    try:
        check_out(Path(args.out), args.force)
        prepare_out(Path(args.out), args.force)
        result = compare_dirs(Path(args.a), Path(args.b), Path(args.out), args.label_a, args.label_b,
                              engine_a=args.engine_a, engine_b=args.engine_b, run_a=args.run_a, run_b=args.run_b,
                              config=_judge_config(args), config_path=args.config, png=args.png)
    except ConfigError as exc:
        return _fail(_one_line(exc))
    except (CompareError, MergeError, OutDirError) as exc:
        return _fail(str(exc))
    print((Path(args.out) / "compare.md").read_text(encoding="utf-8"))
    print("written: " + ", ".join(str(p) for p in result["files"]))
    for line in result.get("warnings") or []:  # the two sides' t0 taken in different ways
        print(line, file=sys.stderr)
    return 0


def _prom_options(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--prometheus", required=required, metavar="URL",
                   help="base URL of a Prometheus-compatible query API, path prefix included, e.g. "
                        "http://127.0.0.1:9090 or http://vm:8428/prometheus"
                        + ("" if required else " (default: none, no histogram check)")
                        + f"; a bearer token is read from ${TOKEN_ENV}")
    p.add_argument("--header", action="append", metavar="NAME:VALUE",
                   help="extra HTTP header for the query API, repeatable, e.g. X-Scope-OrgID:team-a (default: none)")


def _engine_name(text: str) -> str:
    if not re.fullmatch(r"[a-z0-9_-]+", text):
        raise argparse.ArgumentTypeError(f"{text!r}: an engine's name, as in the proxy's config ([a-z0-9_-]+)")
    return text


def _export_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    e = sub.add_parser("export", help="pull every panel's query over a window into CSV/JSON, PNG, EVIDENCE.md",
                       description="Pull every panel's query over a window into CSV/JSON, PNG and EVIDENCE.md. "
                                   "Exit status 2 for a mistake (one line names it); 3 when every panel of the "
                                   "proxies' boards found no series (the files are written all the same, and one "
                                   "line names the selector used and the jobs that have llmbench_ series).")
    _prom_options(e, required=True)
    e.add_argument("--window", required=True,
                   help="START,END (RFC 3339 with a timezone, or unix seconds), last:DURATION (e.g. last:30m), "
                        "scenario:NAME[#ROUND], or scenario:NAME#ROUND:steady[:ENGINE] (the round's steady "
                        "window; needs --records)")
    e.add_argument("--out", required=True, metavar="DIR", help="output directory; must be new or empty")
    e.add_argument("--force", action="store_true", help="clear a non-empty --out first (default: refuse it)")
    e.add_argument("--boards", nargs="+", choices=sorted(BOARDS), help="boards to export (default: all)")
    e.add_argument("--step", type=float, metavar="SECONDS",
                   help=f"seconds between points (default: ~{TARGET_POINTS} points over the window, not below the "
                        f"scrape interval, or {DEFAULT_STEP_S:g} s where the backend does not report it)")
    e.add_argument("--records", metavar="DIR",
                   help="records directory: scenario windows from its scenarios.jsonl, which wins over "
                        "Prometheus, and the engines' identity (versions, arguments) and the proxy's from its "
                        "engines.jsonl (default: none, scenario windows and the engines from Prometheus)")
    e.add_argument("--run", metavar="ID",
                   help="the run (a run_id) of a scenario window read from --records, needed when the records "
                        "hold that round in several runs (default: its only run; several are refused)")
    e.add_argument("--grafana", metavar="URL",
                   help=f"Grafana URL: also fetch its PNGs, token in ${GRAFANA_TOKEN_ENV} (default: none)")
    e.add_argument("--engine", type=_engine_name, metavar="NAME",
                   help="only this engine's series (the boards' engine variable: data, PNGs and EVIDENCE.md alike; "
                        "the engines' own series on the internals board go by their job) and its rounds marked "
                        "(default: every engine)")
    e.add_argument("--no-png", dest="png", action="store_false",
                   help="draw no PNG of the boards: the CSV/JSON data, EVIDENCE.md and manifest.json only, in a "
                        "fraction of the time (drawing is most of an export's) (default: a PNG per board)")
    e.add_argument("--job", metavar="NAME",
                   help=f"the Prometheus job that scrapes the proxies (default: {MIXIN.job}); an export "
                        "that finds nothing says under which job Prometheus has the proxies' series")
    e.set_defaults(func=cmd_export)


_CONFIG_HELP = ("the proxy's config (YAML): its slo and slo_by_scenario judge records that carry no slo of "
                "their own, written by an older proxy (default: none, such records are judged by the default SLO)")


def _summarize_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("summarize", help="round tables from requests.jsonl; several --records merge exactly",
                       description="Round tables from the proxy's requests.jsonl: per run, engine, scenario and "
                                   "round the success counts, exact TTFT/TPOT/E2E percentiles, throughput and "
                                   "goodput, the load each round had and its steady window; the median of rounds "
                                   "with its spread; engines side by side with a noise verdict. Several --records "
                                   "(several proxies) merge exactly. Exit status 2 for a mistake (one line names "
                                   "it).")
    s.add_argument("--records", required=True, action="append", metavar="DIR",
                   help="records directory or requests.jsonl, repeatable: the union of the requests is summarized")
    _prom_options(s, required=False)
    s.add_argument("--out", metavar="DIR", help="output directory for summary.md, summary.json and the CSV tables; "
                                                "must be new or empty (default: none, the tables are printed and "
                                                "nothing is written)")
    s.add_argument("--force", action="store_true", help="clear a non-empty --out first (default: refuse it)")
    s.add_argument("--run", metavar="ID", help="only this run's records (a run_id; default: every run, each in rows "
                                               "of its own, never merged)")
    s.add_argument("--config", metavar="FILE", help=_CONFIG_HELP)
    s.add_argument("--expect", metavar="LOAD", help="the load the rounds should have had: poisson:RATE (req/s) or "
                                                    "closed:C (in flight); each round says whether it matched "
                                                    "(default: none)")
    s.add_argument("--engine-log", action="append", metavar="DIR",
                   help="SGLang's per-request files (sglang-request-metrics-*.log, every hour's), written when it is "
                        "started with --enable-metrics --export-metrics-to-file --export-metrics-to-file-dir DIR; "
                        "repeatable: each line's timing is joined to the record with its response id, for where "
                        "TTFT goes (nothing else of a line is kept: it holds the prompt) (default: none)")
    s.set_defaults(func=cmd_summarize)


def _compare_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = sub.add_parser("compare", help="compare two runs per scenario and metric, with a noise verdict",
                       description="Compare two runs (records directories), or the two engines of one run, per "
                                   "scenario and metric: each side's median of rounds with its spread, the delta "
                                   "and a verdict (better, worse or within noise; none from one round or when the "
                                   "loads differ). A run is never compared with itself. Exit status 2 for a "
                                   "mistake (one line names it).")
    c.add_argument("a", metavar="A", help="records directory (or requests.jsonl) of run A")
    c.add_argument("b", metavar="B", help="records directory (or requests.jsonl) of run B")
    c.add_argument("--out", required=True, metavar="DIR", help="output directory (compare.md, compare.csv, PNGs); "
                                                               "must be new or empty")
    c.add_argument("--force", action="store_true", help="clear a non-empty --out first (default: refuse it)")
    c.add_argument("--label-a", default="A", metavar="NAME", help="name of run A; picks that engine when A holds several (default: A)")
    c.add_argument("--label-b", default="B", metavar="NAME", help="name of run B; picks that engine when B holds several (default: B)")
    c.add_argument("--engine-a", metavar="ENGINE", help="only this engine's records of A (default: the label's, or all)")
    c.add_argument("--engine-b", metavar="ENGINE", help="only this engine's records of B (default: the label's, or all)")
    c.add_argument("--run-a", metavar="ID", help="the run of A, where A holds several (default: its only run)")
    c.add_argument("--run-b", metavar="ID", help="the run of B, where B holds several (default: its only run)")
    c.add_argument("--config", metavar="FILE", help=_CONFIG_HELP)
    c.add_argument("--no-png", dest="png", action="store_false",
                   help="draw no PNG per metric: compare.md and compare.csv only, in a fraction of the time "
                        "(default: a PNG per metric)")
    c.set_defaults(func=cmd_compare)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="evidence",
        description="evidence: export Prometheus windows for reports, re-decode raw SSE, summarize and compare runs",
        epilog="The proxy, the load driver, the simulators and the demo are llm-bench-exporter's (in the same "
               "bin/ directory): llm-bench-exporter --help.")
    p.add_argument("--version", action="version", version=f"llm-bench-exporter {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    _export_parser(sub)
    d = sub.add_parser("decode", help="re-decode raw SSE captures and judge them again",
                       description="Re-decode raw SSE captures (the proxy's captures/<id>.sse with its .json) "
                                   "offline with the proxy's own core and judge them again: the verdict, the "
                                   "checks (SHA-256 against the capture and requests.jsonl) and, with "
                                   "--tokenizer, the output token ids named. Exit status 1 when a capture's "
                                   "check fails; 2 for a file that is not a readable capture.")
    d.add_argument("captures", nargs="+", help="captures/<id>.sse or .json")
    d.add_argument("--json", action="store_true",
                   help="print one JSON document with every capture's verdict and checks (default: one line each)")
    d.add_argument("--tokenizer", type=Path, metavar="PATH",
                   help="the model's tokenizer (its directory or tokenizer.json): name the output token ids the "
                        "capture holds (engine option token_ids: true) and say which are special tokens (default: none, ids not "
                        "named)")
    d.set_defaults(func=cmd_decode)
    _summarize_parser(sub)
    _compare_parser(sub)
    report_parser(sub)
    trace_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
