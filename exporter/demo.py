"""``python -m exporter.demo``: kept for those who typed it before the demo moved to
:mod:`exporter.harness.demo`; the same as ``llm-bench-exporter demo``."""

from __future__ import annotations

import sys

from exporter.cli import main


def demo(argv: list[str] | None = None) -> int:
    return main(["demo", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(demo())
