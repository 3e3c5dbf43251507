"""``llm-bench-exporter serve``: load the config, check it can run, start the supervised workers."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from .config import Config, ConfigError, load_config, parse_gpu, parse_listen
from .gpu import check_source

__all__ = ["add_parser", "cmd_serve"]

log = logging.getLogger("llmbench")

DESCRIPTION = ("Run the measuring proxy exporter: each engine's OpenAI API under /ENGINE/v1/ (completions, chat "
               "completions, models) goes to that engine's configured upstream, byte for byte; every request is "
               "timed (TTFT, TPOT, E2E) and judged strictly, and counted on /metrics for Prometheus, written to "
               "records_dir (requests.jsonl, scenarios.jsonl, engines.jsonl, raw SSE captures: of failures by "
               "default) and labelled by the round a bench client announces on POST /-/scenario. Ctrl-C or "
               "SIGTERM stops it gracefully. Exit status 2 for a mistake (a config refused with the field's path "
               "and reason, a records_dir that cannot be written or is in use, a port that cannot be bound), one "
               "line names it.")


def _listen(value: str) -> str:
    try:
        parse_listen(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _gpu(value: str) -> str:
    try:
        return parse_gpu(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _workers(value: str) -> int:
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= 256:
        raise argparse.ArgumentTypeError(f"expected a whole number of processes 1..256, got {value!r}")
    return int(value)


def _preflight(config: Config) -> str | None:
    """Why this config cannot serve here (one line), or None."""
    try:
        config.records_dir.mkdir(parents=True, exist_ok=True)
        with open(config.records_dir / "requests.jsonl", "ab"):
            pass
    except OSError as exc:
        return f"records_dir {config.records_dir}: {exc.strerror or exc}"
    from .trace import check_trace  # loads the tokenizer once: a bad one is one line, before the workers start

    return check_trace(config.trace) or check_source(config.gpu)


def cmd_serve(args: argparse.Namespace) -> int:
    from .workers import run_supervised

    try:
        config = load_config(args.config, listen=args.listen, gpu=args.gpu)
    except ConfigError as exc:
        print(f"llm-bench-exporter: {exc}", file=sys.stderr)
        return 2
    problem = _preflight(config)
    if problem is not None:
        print(f"llm-bench-exporter: {problem}", file=sys.stderr)
        return 2
    from .snapshot import RecordsInUse, lock_records

    try:
        lock = lock_records(config.records_dir)  # held until this process and its workers are gone
    except (RecordsInUse, OSError) as exc:
        print(f"llm-bench-exporter: {exc}", file=sys.stderr)
        return 2
    try:
        return run_supervised(config, args.workers)
    except OSError as exc:  # only the bind can raise here: the workers start after it
        print(f"llm-bench-exporter: cannot listen on {config.listen}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    finally:
        os.close(lock)


def add_parser(sub: Any) -> None:
    serve = sub.add_parser("serve", help="run the measuring proxy exporter", description=DESCRIPTION)
    serve.add_argument("--config", required=True, help="YAML config file (required; see examples/stack.yaml)")
    serve.add_argument("--listen", type=_listen, help="HOST:PORT to listen on (default: the config's listen, itself 127.0.0.1:9464 by default)")
    serve.add_argument("--gpu", type=_gpu, help="GPU collector: off | nvml | sim:N (default: the config's gpu, itself off by default)")
    serve.add_argument("--workers", type=_workers, default=1,
                       help="proxy processes sharing the listen port (one /metrics view of all; "
                            "a supervisor process renders it; default: 1)")
    serve.set_defaults(func=cmd_serve)
