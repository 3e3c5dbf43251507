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


def _write(args: argparse.Namespace) -> None:
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
    except (InputError, JobError) as exc:
        print(f"llm-bench-exporter dashboards: {exc}", file=sys.stderr)
        return 2
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("dashboards", help="write the Grafana dashboards' JSON (and the Prometheus rules)")
    p.add_argument("--out", default=str(GENERATED), help=f"directory (default: {GENERATED})")
    p.add_argument("--rules", nargs="?", const=str(RULES_FILE), default=None,
                   help=f"also write the recording and alert rules (default path: {RULES_FILE})")
    p.add_argument("--k8s", nargs="?", const=str(K8S_DIR), default=None, metavar="DIR",
                   help="also write Kubernetes manifests (Grafana dashboard ConfigMaps, PrometheusRule, "
                        f"ServiceMonitor, the proxy's Deployment and Service) from the boards just written "
                        f"and the rules file (default dir: {K8S_DIR})")
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
