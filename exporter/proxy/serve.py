"""``llm-bench-exporter serve``: load the config, build the app, run it."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

from .config import ConfigError, load_config, parse_gpu, parse_listen

__all__ = ["add_parser", "cmd_serve"]

log = logging.getLogger("llmbench")


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


def _event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed: a cheaper hop per request and per read."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def cmd_serve(args: argparse.Namespace) -> int:
    from aiohttp import web

    from .app import create_app

    try:
        config = load_config(args.config, listen=args.listen, gpu=args.gpu)
    except ConfigError as exc:
        print(f"llm-bench-exporter: {exc}", file=sys.stderr)
        return 2
    host, port = parse_listen(config.listen)
    try:
        app = create_app(config)
    except OSError as exc:
        print(f"llm-bench-exporter: records_dir {config.records_dir}: {exc}", file=sys.stderr)
        return 2
    log.info("proxy on http://%s:%d, engines: %s", host, port,
             ", ".join(f"{e.name} -> {e.display_url}" for e in config.engines))
    try:
        web.run_app(app, host=host, port=port, access_log=None, handler_cancellation=True,
                    print=None, loop=_event_loop())
    except OSError as exc:
        print(f"llm-bench-exporter: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


def add_parser(sub: Any) -> None:
    serve = sub.add_parser("serve", help="run the measuring proxy exporter",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    serve.add_argument("--config", required=True, help="YAML config file")
    serve.add_argument("--listen", type=_listen, help="HOST:PORT (overrides the config's listen)")
    serve.add_argument("--gpu", type=_gpu, help="off | nvml | sim:N (overrides the config's gpu)")
    serve.set_defaults(func=cmd_serve)
