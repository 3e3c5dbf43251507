"""``llm-bench-exporter`` command line: serve, sim, load, demo, dashboards."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from dashboards import __main__ as dashboards_cli

from . import __version__, demo, load, sim
from .config import ConfigError, load_config, parse_gpu, parse_listen

__all__ = ["main"]

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
    """uvloop when installed (the ``fast`` extra): a cheaper hop per request and per read."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def cmd_serve(args: argparse.Namespace) -> int:
    from aiohttp import web

    from .proxy import create_app

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llm-bench-exporter", description=__doc__)
    parser.add_argument("--version", action="version", version=__version__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the measuring proxy exporter")
    serve.add_argument("--config", required=True, help="YAML config file")
    serve.add_argument("--listen", type=_listen, help="HOST:PORT (overrides the config)")
    serve.add_argument("--gpu", type=_gpu, help="off | nvml | sim:N (overrides the config)")
    serve.set_defaults(func=cmd_serve)
    for add_parser in (sim.add_parser, load.add_parser, demo.add_parser, dashboards_cli.add_parser):
        add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
