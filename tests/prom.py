"""Helpers for tests that need Debian's prometheus and promtool."""

from __future__ import annotations

import os
import shutil

import pytest


def require_prometheus() -> None:
    """Skip without prometheus/promtool, unless CI demands them (LLMBENCH_REQUIRE_PROMETHEUS=1)."""
    missing = [b for b in ("prometheus", "promtool") if shutil.which(b) is None]
    if missing:
        msg = f"{', '.join(missing)} not installed (apt-get install -y --no-install-recommends prometheus)"
        if os.environ.get("LLMBENCH_REQUIRE_PROMETHEUS") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
