"""``evidence``: export Prometheus windows, re-decode captures, summarize rounds."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    print("evidence: not implemented yet", file=sys.stderr)
    return 2
