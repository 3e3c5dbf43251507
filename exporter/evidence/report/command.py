"""``evidence report --format html|md``: the command around :func:`.write.write_report`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["cmd_page", "add_options"]


def cmd_page(args: argparse.Namespace, prom: Any = None) -> int:
    """Write the report; exit 2 with one line for a mistake of the user's."""
    from ..merge import MergeError
    from ..outdir import OutDirError
    from ..promapi import PromError
    from ..runs import RunError
    from ..tokens import TokenizerError, load_vocabulary
    from .cells import CellsError
    from .write import ReportError, ReportOptions, write_report

    try:
        vocabulary = load_vocabulary(args.tokenizer) if args.tokenizer is not None else None
        opts = ReportOptions([Path(p) for p in args.records], Path(args.out), args.format, args.run, prom,
                             Path(args.baseline) if args.baseline else None, Path(args.plan) if args.plan else None,
                             args.force, vocabulary)
        manifest = write_report(opts)
    except (CellsError, MergeError, OutDirError, PromError, ReportError, RunError, TokenizerError, ValueError) as exc:
        print(f"evidence: {exc}", file=sys.stderr)
        return 2
    name = "report.md" if args.format == "md" else "report.html"
    print(f"report of run {manifest['run_id']} ({', '.join(manifest['engines'])}): {Path(args.out) / name} "
          f"(summary.json, rounds.csv, manifest.json beside it)")
    return 0


def add_options(r: argparse.ArgumentParser) -> None:
    """The options of ``--format html|md`` (``--records`` and ``--out`` are shared with llm-d)."""
    r.add_argument("--prometheus", metavar="URL", help="base URL of the Prometheus that scraped the run: html, md: "
                                                       "each engine's boards over its own window are exported beside "
                                                       "the report and shown; llm-d: each round's engine time series "
                                                       "(KV cache, running and waiting requests, GPUs) under "
                                                       "observability (default: none, not fetched)")
    r.add_argument("--header", action="append", metavar="NAME:VALUE",
                   help="extra HTTP header for the query API, repeatable (default: none)")
    r.add_argument("--baseline", metavar="DIR", help="html, md: an earlier run's records directory: a history "
                                                     "section with the noise verdict, engines paired by name "
                                                     "(default: none)")
    r.add_argument("--plan", metavar="FILE", help="html, md: the load plan (YAML) or load's summary.json: what each "
                                                  "scenario's cell was, where load did not announce it (default: "
                                                  "none; unknown scenarios are shown unpivoted)")
    r.add_argument("--tokenizer", type=Path, metavar="PATH", help="html, md: the model's tokenizer, to name the "
                                                                  "empty 200s' output token ids (default: ids only)")
