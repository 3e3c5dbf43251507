"""llm-bench-exporter: a strict measuring proxy for LLM serving benchmarks, and its tools.

Subcommands are imported lazily: ``serve`` loads the proxy only, never grafanalib,
matplotlib or requests, and ``import exporter.cli`` costs next to nothing.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from . import __version__

__all__ = ["main", "build_parser", "COMMANDS", "EPILOG"]

#: subcommand -> (module with ``add_parser(sub)``, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("exporter.proxy.serve", "run the measuring proxy exporter"),
    "sim": ("exporter.harness.sim", "run a simulated vLLM or SGLang engine"),
    "load": ("exporter.harness.load_cli", "drive load against an OpenAI-compatible base URL"),
    "demo": ("exporter.harness.demo", "the whole stack on one machine with simulated engines"),
    "dashboards": ("dashboards.__main__", "write the Grafana dashboards' JSON (and the Prometheus rules)"),
    "model-check": ("exporter.harness.model_check",
                    "each model file's size and SHA-256, each safetensors header's tensor count"),
}


#: where the rest of the tools are: the ``evidence`` command is a program of its own
EPILOG = ("Reports are the `evidence` command's (installed beside this one, in the same bin/ directory, "
          "e.g. .venv/bin/evidence): evidence export pulls a Prometheus window into CSV/JSON, PNG and "
          "EVIDENCE.md; evidence summarize and evidence compare turn the proxy's records into round tables "
          "and verdicts.  See `evidence --help` and docs/quickstart.md.")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; only the subcommand named in ``argv`` is imported (all of them when None)."""
    parser = argparse.ArgumentParser(prog="llm-bench-exporter", description=__doc__.splitlines()[0],
                                     epilog=EPILOG, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--version", action="version", version=f"llm-bench-exporter {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    chosen = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    for name, (module, help_text) in COMMANDS.items():
        if chosen is None or name == chosen:
            importlib.import_module(module).add_parser(sub)
        else:
            sub.add_parser(name, help=help_text)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
