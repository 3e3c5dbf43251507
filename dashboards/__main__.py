"""``python -m dashboards`` / ``llm-bench-exporter dashboards``: write the boards' JSON and the rules."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .boards import GENERATED, write_all
from .rules import RULES_FILE, write_rules


def cmd_dashboards(args: argparse.Namespace) -> int:
    for path in write_all(Path(args.out)):
        print(path)
    if args.rules:
        print(write_rules(Path(args.rules)))
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("dashboards", help="write the Grafana dashboards' JSON (and the Prometheus rules)")
    p.add_argument("--out", default=str(GENERATED), help=f"directory (default: {GENERATED})")
    p.add_argument("--rules", nargs="?", const=str(RULES_FILE), default=None,
                   help=f"also write the recording and alert rules (default path: {RULES_FILE})")
    p.set_defaults(func=cmd_dashboards)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards")
    sub = parser.add_subparsers(dest="command")
    add_parser(sub)
    args = parser.parse_args(["dashboards", *(argv if argv is not None else sys.argv[1:])])
    return cmd_dashboards(args)


if __name__ == "__main__":
    sys.exit(main())
