"""``python -m dashboards`` / ``llm-bench-exporter dashboards``: write the boards' JSON, the rules
and the Kubernetes manifests."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .boards import GENERATED, write_all
from .k8s import K8S_DIR, InputError, write_k8s
from .mixin import CONFIG as MIXIN
from .promql import JobError, check_job
from .rules import RULES_FILE, write_rules


class OutError(ValueError):
    """Neither ``--out`` nor ``--in-repo``: where to write is the user's to say."""


def _targets(args: argparse.Namespace) -> tuple[Path, Path | None, Path | None]:
    """(boards, rules or None, manifests or None): under ``--out``, or the repository's tracked files
    with ``--in-repo`` (a bare ``--rules``/``--k8s`` names the tracked file or directory only then)."""
    if args.in_repo == bool(args.out):
        raise OutError("give --out DIR (boards, and a bare --rules or --k8s, go under it), or --in-repo to "
                       "regenerate the repository's tracked files" if not args.out else
                       "--out and --in-repo exclude each other")
    base = None if args.in_repo else Path(args.out)
    rules = None if args.rules is None else Path(args.rules) if args.rules != _BARE else \
        (RULES_FILE if base is None else base / RULES_FILE.name)
    k8s = None if args.k8s is None else Path(args.k8s) if args.k8s != _BARE else \
        (K8S_DIR if base is None else base / "kubernetes")
    return (GENERATED if base is None else base), rules, k8s


_BARE = "\0bare"  # a bare --rules or --k8s: its default path, as --out or --in-repo says


def _write(args: argparse.Namespace) -> None:
    out, rules_path, k8s = _targets(args)
    args.out, args.rules, args.k8s = str(out), None if rules_path is None else str(rules_path), k8s
    job = check_job(args.job) if args.job is not None else None
    if job is not None and job != MIXIN.job and args.k8s and not args.rules:
        raise JobError(f"--k8s with --job {job} needs --rules PATH too: the repository's rule file selects "
                       f"job {MIXIN.job!r}")
    boards = write_all(Path(args.out), job)
    for path in boards:
        print(path)
    rules = RULES_FILE
    if args.rules:
        rules = write_rules(Path(args.rules), job)
        print(rules)
    if args.k8s:
        for path in write_k8s(Path(args.k8s), boards, rules, job):
            print(path)


def cmd_dashboards(args: argparse.Namespace) -> int:
    try:
        _write(args)
    except OSError as exc:  # a path that cannot be created or read: one line, no traceback
        where = exc.filename if exc.filename is not None else "output"
        print(f"llm-bench-exporter dashboards: cannot write {where}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except (InputError, JobError, OutError) as exc:
        print(f"llm-bench-exporter dashboards: {exc}", file=sys.stderr)
        return 2
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("dashboards", help="write the Grafana dashboards' JSON (and the Prometheus rules)",
                       description="Write the Grafana dashboards' JSON from the one catalogue of queries, and "
                                   "with --rules the Prometheus recording and alert rules, with --k8s the "
                                   "Kubernetes manifests: under --out DIR, or with --in-repo over the "
                                   "repository's tracked files (dashboards/generated, prometheus/rules, "
                                   "deploy/kubernetes). Exit status 2 for a mistake (one line names it).")
    p.add_argument("--out", metavar="DIR", help="output directory for the boards (and a bare --rules or --k8s)")
    p.add_argument("--in-repo", action="store_true",
                   help=f"regenerate the repository's tracked files instead: boards in {GENERATED}, a bare --rules "
                        f"to {RULES_FILE}, a bare --k8s to {K8S_DIR}")
    p.add_argument("--rules", nargs="?", const=_BARE, default=None, metavar="PATH",
                   help=f"also write the recording and alert rules (bare: DIR/{RULES_FILE.name}, or the tracked "
                        "file with --in-repo)")
    p.add_argument("--k8s", nargs="?", const=_BARE, default=None, metavar="DIR",
                   help="also write Kubernetes manifests (Grafana dashboard ConfigMaps, PrometheusRule, "
                        "ServiceMonitor, the proxy's Deployment and Service) from the boards just written "
                        "and the rules file (bare: DIR/kubernetes, or the tracked directory with --in-repo)")
    p.add_argument("--job", metavar="NAME",
                   help=f"the Prometheus job that scrapes the proxies: boards and rules select it "
                        f"(default: {MIXIN.job}, as in prometheus/prometheus.yml)")
    p.set_defaults(func=cmd_dashboards)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards")
    sub = parser.add_subparsers(dest="command")
    add_parser(sub)
    args = parser.parse_args(["dashboards", *(argv if argv is not None else sys.argv[1:])])
    return cmd_dashboards(args)


if __name__ == "__main__":
    sys.exit(main())
