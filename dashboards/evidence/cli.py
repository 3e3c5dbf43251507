"""``evidence``: export Prometheus windows for reports, re-decode raw SSE, summarize rounds."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from exporter import __version__

from dashboards.catalogue import BOARDS
from .decode import decode_capture, format_row
from .export import GRAFANA_TOKEN_ENV, ExportError, export
from .promapi import Prometheus, PromError
from .summarize import load_records, summarize, write_summary
from .windows import WindowError, iso, parse_window

__all__ = ["main"]


def _fail(msg: str) -> int:
    print(f"evidence: {msg}", file=sys.stderr)
    return 2


def cmd_export(args: argparse.Namespace) -> int:
    prom = Prometheus(args.prometheus)
    try:
        window = parse_window(args.window, prom=prom, records=Path(args.records) if args.records else None)
        manifest = export(prom, window, Path(args.out), boards=args.boards, step=args.step, grafana=args.grafana)
    except (WindowError, ExportError, PromError) as exc:
        return _fail(str(exc))
    print(f"window {iso(window.start)} to {iso(window.end)}, step {manifest['step_s']:g}s: "
          f"{len(manifest['files'])} files in {args.out} (EVIDENCE.md, manifest.json)")
    return 0


def cmd_decode(args: argparse.Namespace) -> int:
    results = [decode_capture(Path(p)) for p in args.captures]
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for r in results:
            print(format_row(r))
    return 0 if all(r["ok"] for r in results) else 1


def cmd_summarize(args: argparse.Namespace) -> int:
    try:
        records = load_records(Path(args.records))
    except (OSError, ValueError) as exc:
        return _fail(str(exc))
    if not records:
        return _fail(f"no records in {args.records}")
    prom = Prometheus(args.prometheus) if args.prometheus else None
    try:
        summary = summarize(records, prom)
    except PromError as exc:
        return _fail(str(exc))
    out = Path(args.out) if args.out else Path(args.records) / "summary"
    paths = write_summary(summary, out)
    print((out / "summary.md").read_text(encoding="utf-8"))
    print("written: " + ", ".join(str(p) for p in paths))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="evidence", description=__doc__)
    p.add_argument("--version", action="version", version=__version__)
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="pull every panel's query over a window into CSV/JSON, PNG, EVIDENCE.md")
    e.add_argument("--prometheus", required=True, help="Prometheus base URL")
    e.add_argument("--window", required=True, help="START,END (RFC 3339 or unix), last:30m, scenario:NAME[#ROUND]")
    e.add_argument("--out", required=True, help="output directory")
    e.add_argument("--boards", nargs="+", choices=sorted(BOARDS), help="default: all")
    e.add_argument("--step", type=float, help="seconds (default: ~1500 points, not below the scrape interval)")
    e.add_argument("--records", help="records directory: resolve scenario windows from its scenarios.jsonl")
    e.add_argument("--grafana", help=f"Grafana URL: also fetch its PNGs (token in ${GRAFANA_TOKEN_ENV})")
    e.set_defaults(func=cmd_export)
    d = sub.add_parser("decode", help="re-decode raw SSE captures and judge them again")
    d.add_argument("captures", nargs="+", help="captures/<id>.sse or .json")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_decode)
    s = sub.add_parser("summarize", help="round tables from requests.jsonl")
    s.add_argument("--records", required=True, help="records directory or requests.jsonl")
    s.add_argument("--prometheus", help="also compare histogram P95s with the exact ones")
    s.add_argument("--out", help="output directory (default: RECORDS/summary)")
    s.set_defaults(func=cmd_summarize)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
