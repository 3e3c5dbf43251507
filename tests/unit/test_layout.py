"""The layout's promises: lazy subcommands, imports that point inward, small modules."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("exporter", "dashboards")


def _imports_in(path: Path) -> set[str]:
    mods: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods.add(node.module)
    return mods


def _run(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.slow  # a subprocess: runs in the full suite
def test_serve_imports_no_board_or_evidence_libraries() -> None:
    out = _run(
        "import sys\n"
        "from exporter.cli import build_parser\n"
        "build_parser(['serve', '--config', 'x.yaml'])\n"
        "import exporter.proxy.app, exporter.proxy.serve\n"
        "print(sorted(m for m in ('grafanalib', 'matplotlib', 'requests', 'dashboards') if m in sys.modules))\n"
    )
    assert out == "[]"


@pytest.mark.slow  # a subprocess: runs in the full suite
def test_import_cli_is_quick() -> None:
    best = min(float(_run("import time; t = time.perf_counter(); import exporter.cli; "
                          "print(time.perf_counter() - t)")) for _ in range(3))
    assert best < 0.3, f"import exporter.cli took {best:.3f} s"


@pytest.mark.parametrize("path", sorted(p for p in (ROOT / "exporter" / "core").glob("*.py")), ids=lambda p: p.name)
def test_core_is_pure(path: Path) -> None:
    """The measuring core imports no sockets, no aiohttp, no clock and nothing outward."""
    banned = {"aiohttp", "socket", "asyncio", "time", "requests", "prometheus_client"}
    bad = {m for m in _imports_in(path)
           if m.split(".")[0] in banned or m.startswith(("exporter.proxy", "exporter.harness", "dashboards"))}
    if path.name == "timefmt.py":
        bad.discard("time")  # formats a given timestamp; reads no clock
    assert not bad, f"{path.name} imports {sorted(bad)}"


def test_proxy_does_not_import_the_harness_or_the_boards() -> None:
    for path in (ROOT / "exporter" / "proxy").glob("*.py"):
        bad = {m for m in _imports_in(path) if m.startswith(("exporter.harness", "dashboards"))}
        assert not bad, f"{path.name} imports {sorted(bad)}"


def test_boards_do_not_import_the_evidence_tool_or_the_harness() -> None:
    for path in (ROOT / "dashboards").glob("*.py"):
        bad = {m for m in _imports_in(path) if m.startswith(("dashboards.evidence", "exporter.harness"))}
        assert not bad, f"{path.name} imports {sorted(bad)}"


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_modules_and_functions_stay_small() -> None:
    too_long: list[str] = []
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(ROOT)
        if text.count("\n") > 400:
            too_long.append(f"{rel}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > 60:
                    too_long.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    assert not too_long, "\n".join(too_long)
