"""``evidence report --format llm-d|html|md --records DIR --out DIR``: the command around :mod:`.llmd`
(llm-d) and :mod:`.report` (the Day-0 report, html or md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "cmd_report", "FORMATS"]

FORMATS = ("llm-d", "html", "md")
_PAGE_ONLY = ("baseline", "plan", "tokenizer")


def cmd_report(args: argparse.Namespace) -> int:
    args.records = [p for group in args.records for p in group]  # --records A B and --records A --records B
    if args.format != "llm-d":
        return _cmd_page(args)
    given = [f"--{k}" for k in _PAGE_ONLY if getattr(args, k, None)]
    if given or len(args.records) != 1:
        why = f"{', '.join(given)} belong to --format html|md" if given else "it takes one --records DIR"
        print(f"evidence: --format llm-d: {why}", file=sys.stderr)
        return 2
    return _cmd_llmd(args)


def _cmd_page(args: argparse.Namespace) -> int:
    from .promapi import Prometheus, parse_header
    from .report.command import cmd_page

    if args.model:
        print("evidence: --model belongs to --format llm-d", file=sys.stderr)
        return 2
    try:
        prom = Prometheus(args.prometheus, headers=dict(parse_header(h) for h in args.header or [])) \
            if args.prometheus else None
    except ValueError as exc:
        print(f"evidence: {exc}", file=sys.stderr)
        return 2
    return cmd_page(args, prom)


def _cmd_llmd(args: argparse.Namespace) -> int:
    from .llmd import write_reports
    from .merge import MergeError, load_records
    from .outdir import OutDirError, check_out, prepare_out
    from .promapi import PromError, Prometheus, parse_header
    from .runs import RunError, select_run

    records_dir, out = Path(args.records[0]), Path(args.out)
    try:
        check_out(out, args.force)
        prom = Prometheus(args.prometheus, headers=dict(parse_header(h) for h in args.header or [])) \
            if args.prometheus else None
        records = select_run(load_records(records_dir), args.run)
        if not records:
            raise MergeError(f"no records in {records_dir}")
        model = _model(args.model) if args.model else None
        prepare_out(out, args.force)
        manifest = write_reports(records_dir, out, records, {"model": model} if model else None, prom)
    except (MergeError, OutDirError, PromError, RunError, ValueError) as exc:
        print(f"evidence: {exc}", file=sys.stderr)
        return 2
    if not manifest["reports"]:
        print(f"evidence: no rounds in {records_dir} (warm-ups are left out)", file=sys.stderr)
        return 2
    for line in manifest.get("warnings") or []:
        print(line, file=sys.stderr)
    runs = {r["run_id"] for r in manifest["reports"]}
    print(f"{len(manifest['reports'])} llm-d benchmark reports (schema {manifest['schema_version']}) of "
          f"{len(runs)} run{'s' if len(runs) != 1 else ''} in {out} (manifest.json beside them)")
    return 0


def _model(path: str) -> dict[str, Any]:
    """A ``llm-bench-exporter model-check`` document, summed up for the manifest (its SHA-256 names it)."""
    import hashlib
    import json

    try:
        raw = Path(path).read_bytes()
        doc = json.loads(raw)
    except OSError as exc:
        raise ValueError(f"--model {path}: cannot read: {exc.strerror or exc}") from None
    except ValueError:
        raise ValueError(f"--model {path}: not JSON") from None
    if not isinstance(doc, dict) or not str(doc.get("format", "")).startswith("llmbench-model-check/"):
        raise ValueError(f"--model {path}: not a document of llm-bench-exporter model-check")
    return {"document": path, "document_sha256": hashlib.sha256(raw).hexdigest(), "dir": doc.get("dir"),
            "files": doc.get("files"), "total_bytes": doc.get("total_bytes"), "tensors": doc.get("tensors"),
            "index": doc.get("index")}


def add_parser(sub: Any) -> None:
    from .report.command import add_options

    r = sub.add_parser("report", help="the Day-0 report (html, md) or one llm-d Benchmark Report per run, engine, "
                                      "scenario and round (llm-d)",
                       description="Write the run's report. html: report.html, one self-contained page (figures "
                                   "inline, nothing fetched, printable) with the seed's sections: what ran, the core "
                                   "matrix, figures, throughput against interactivity, the rate sweep, where TTFT "
                                   "went, failures, boards, caveats, attachments, history; md: report.md with its "
                                   "PNGs; both with summary.json, rounds.csv and manifest.json (SHA-256 of every "
                                   "file and of the records). llm-d: one llm-d Benchmark Report 0.2.1 per run, "
                                   "engine, scenario and round. Exit status 2 for a mistake (one line names it).")
    r.add_argument("--format", required=True, choices=FORMATS,
                   help="html: the Day-0 report page; md: the same as Markdown with PNGs; llm-d: the llm-d "
                        "Benchmark Report, version 0.2.1 (JSON), which llm-d's tools compare")
    r.add_argument("--records", required=True, metavar="DIR", nargs="+", action="append",
                   help="the proxy's records directory (requests.jsonl, and engines.jsonl for the engines' identity); "
                        "html and md take several (several proxies of one run), also as --records repeated")
    r.add_argument("--out", required=True, metavar="DIR", help="output directory; must be new or empty")
    r.add_argument("--force", action="store_true", help="clear a non-empty --out first (default: refuse it)")
    r.add_argument("--run", metavar="ID", help="only this run (a run_id; default: llm-d: every run, each in reports "
                                               "of its own; html, md: the records' only run)")
    r.add_argument("--model", metavar="FILE", help="llm-d: the model's files as `llm-bench-exporter model-check DIR --out "
                                                   "FILE` listed them, carried in manifest.json (default: none)")
    add_options(r)
    r.set_defaults(func=cmd_report)
