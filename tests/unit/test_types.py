"""The packages are typed (py.typed): mypy must pass on them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a subprocess or a whole-tree tool: runs in the full suite
def test_mypy_passes() -> None:
    if shutil.which("mypy") is None and subprocess.run([sys.executable, "-m", "mypy", "--version"],
                                                        capture_output=True).returncode != 0:
        pytest.skip("mypy not installed (pip install -e '.[test]')")
    r = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
