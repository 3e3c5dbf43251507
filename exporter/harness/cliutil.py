"""What the harness's commands share on the command line: one-line errors (exit 2), checked
output directories and listen sockets, finite numbers, and help that shows every default."""

from __future__ import annotations

import argparse
import math
import socket
import sys
from pathlib import Path

from exporter.paths import OutDirError, make_dir

__all__ = ["UserError", "fail", "ensure_out_dir", "bind_listen", "finite_float", "positive_float",
           "positive_int", "non_negative_int", "non_negative_float", "probability", "HelpFormatter"]


class UserError(Exception):
    """A mistake of the user's: printed as one line, exit status 2."""


def fail(command: str, message: object) -> int:
    print(f"llm-bench-exporter {command}: {message}", file=sys.stderr)
    return 2


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def ensure_out_dir(path: str | Path, option: str = "--out") -> Path:
    """Create ``path`` (and parents) and check that a file can be written in it."""
    try:
        return make_dir(path, option)
    except OutDirError as exc:
        raise UserError(str(exc)) from None


def bind_listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; a busy port or an unknown host is a UserError."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {_reason(exc)}") from None
    return sock


def finite_float(text: str) -> float:
    """An argparse type: a finite number (``nan`` and ``inf`` are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def probability(text: str) -> float:
    value = finite_float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text!r}")
    return value


def _int(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _int(text, 1)


def non_negative_int(text: str) -> int:
    return _int(text, 0)


class HelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help unless the help already says its default;
    an option without a default must say in its help what happens without it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        if "default" in text or unset or not action.option_strings:
            return text
        return text + " (default: %(default)s)"
