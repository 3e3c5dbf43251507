"""The packages are typed (py.typed): mypy must pass on them, strictly on the core and the
proxy; and the linter (ruff) passes on the whole tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a subprocess or a whole-tree tool: runs in the full suite
def test_mypy_passes() -> None:
    if shutil.which("mypy") is None and subprocess.run([sys.executable, "-m", "mypy", "--version"],
                                                        capture_output=True).returncode != 0:
        pytest.skip("mypy not installed (pip install -e '.[test]')")
    r = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow  # a subprocess on the whole tree: runs in the full suite
def test_ruff_passes() -> None:
    """ruff is in the test extra: missing, this fails rather than skips."""
    from ruff.__main__ import find_ruff_bin

    r = subprocess.run([find_ruff_bin(), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


def _mypy_config() -> dict[str, Any]:
    with open(ROOT / "pyproject.toml", "rb") as fh:
        mypy: dict[str, Any] = tomllib.load(fh)["tool"]["mypy"]
    return mypy


def test_the_core_and_the_proxy_get_every_flag_of_strict() -> None:
    """mypy's ``strict`` is global only, so pyproject.toml spells out its per-module flags for
    exporter.core and exporter.proxy: all of those that ``--strict`` sets, as this mypy sets them."""
    from mypy.main import process_options
    from mypy.options import PER_MODULE_OPTIONS

    _, strict = process_options(["--strict", "--config-file", "", "-c", "pass"])
    _, plain = process_options(["--config-file", "", "-c", "pass"])
    wanted = {k: getattr(strict, k) for k in PER_MODULE_OPTIONS if getattr(strict, k) != getattr(plain, k)}
    config = _mypy_config()
    section = next(o for o in config["overrides"] if o["module"] == ["exporter.core.*", "exporter.proxy.*"])
    assert "strict" not in section  # it would turn strict on for every module
    got = {k: section.get(k, config.get(k)) for k in wanted}
    assert got == wanted
    assert config.get("warn_redundant_casts") is True  # strict's global flag
