"""The layout's promises: lazy subcommands, imports that point inward, small modules."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("exporter", "dashboards")


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports_in(path: Path, root: Path = ROOT, literal: bool = False) -> set[str]:
    """Every module ``path`` imports, relative imports resolved, TYPE_CHECKING ones included;
    ``literal``: ``import_module("...")`` and ``__import__("...")`` with a literal name too."""
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return set(_imports_of(path.read_text(encoding="utf-8"), package, literal))


@functools.lru_cache(maxsize=None)
def _imports_of(text: str, package: str, literal: bool) -> frozenset[str]:
    """:func:`_imports_in` of a file's text, parsed once for every test that asks (by its text:
    a file that changed is parsed again)."""
    mods: set[str] = set()
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                prefix = ".".join(base)
                if node.module:
                    mods.add(f"{prefix}.{node.module}")
                else:  # ``from . import x``: x is a module of the package
                    mods.update(f"{prefix}.{a.name}" for a in node.names)
            elif node.module:
                mods.add(node.module)
        elif (literal and isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and ast.unparse(node.func).endswith(("import_module", "__import__"))):
            mods.add(node.args[0].value)
    return frozenset(mods)


def _graph() -> dict[str, set[str]]:
    """Our modules and the modules of ours that each imports."""
    paths = {_module_name(p): p for p in _sources()}
    return {name: {m for m in _imports_in(path) if m in paths} for name, path in paths.items()}


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
        "print(sorted(m for m in ('grafanalib', 'matplotlib', 'requests', 'dashboards.catalogue', 'exporter.evidence')"
        " if m in sys.modules))\n"
    )
    assert out == "[]"


@pytest.mark.slow  # a subprocess: runs in the full suite
def test_import_cli_loads_no_subcommand() -> None:
    """``import exporter.cli`` stays quick by loading no subcommand's libraries (a count of
    modules, not a timing: bench/README.md has the time)."""
    out = _run("import sys; import exporter.cli\n"
               "print(sorted(m for m in ('aiohttp', 'pydantic', 'prometheus_client', 'grafanalib', 'matplotlib',"
               " 'requests', 'yaml', 'exporter.proxy', 'exporter.harness', 'exporter.evidence', 'dashboards')"
               " if m in sys.modules))")
    assert out == "[]"


@pytest.mark.parametrize("path", sorted(p for p in (ROOT / "exporter" / "core").glob("*.py")), ids=lambda p: p.name)
def test_core_is_pure(path: Path) -> None:
    """The measuring core imports no sockets, no aiohttp, no clock and nothing outward."""
    banned = {"aiohttp", "socket", "asyncio", "time", "requests", "prometheus_client"}
    bad = {m for m in _imports_in(path)
           if m.split(".")[0] in banned or m.startswith(("exporter.proxy", "exporter.harness", "dashboards"))}
    if path.name == "timefmt.py":
        bad.discard("time")  # formats a given timestamp; reads no clock
    assert not bad, f"{path.name} imports {sorted(bad)}"


def test_proxy_imports_only_the_core_and_the_boards_knobs() -> None:
    """The proxy imports neither the harness nor the evidence tool; of the boards' package only
    the mixin's knobs (the SLO the boards draw), which import nothing but the standard library."""
    for path in (ROOT / "exporter" / "proxy").rglob("*.py"):
        bad = {m for m in _imports_in(path)
               if m.startswith(("exporter.harness", "exporter.evidence", "dashboards")) and m != "dashboards.mixin"}
        assert not bad, f"{path.name} imports {sorted(bad)}"
    assert _graph()["dashboards.mixin"] == set()


def test_the_wire_imports_the_core_and_nothing_else_of_the_proxy() -> None:
    """``exporter/proxy/wire/`` is the floor of the proxy: a request's bytes between its two
    sockets, measured by the core; the rest of the proxy (config, metrics, records) stands above."""
    wire = ROOT / "exporter" / "proxy" / "wire"
    assert sorted(p.name for p in wire.glob("*.py")), "the wire package is gone"
    for path in wire.glob("*.py"):
        bad = {m for m in _imports_in(path) if m.startswith("exporter.") and not m.startswith(
            ("exporter.core", "exporter.proxy.wire"))}
        assert not bad, f"wire/{path.name} imports {sorted(bad)}"


def test_no_module_reaches_into_another_modules_private_names() -> None:
    """In the proxy, ``obj._name`` is read or written only by the module that defines ``_name``:
    one module's private state is not another's interface (the libraries' internals it relies on
    are declared in valuefiles.py and wire/writer.py, and exercised by test_internals.py)."""
    # prometheus_client's: its multiprocess merge (valuefiles.py), a histogram child's buckets and sum
    # (decodemetrics.observe_weighted, held to one observe per value by test_decode_metrics.py)
    declared = {"_accumulate_metrics", "_multiprocess_mode", "_read_metrics", "_exit", "_buckets", "_sum"}
    found = []
    for path in sorted((ROOT / "exporter" / "proxy").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        own = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
               and n.value.id in ("self", "cls")}
        own |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        own |= {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        for n in ast.walk(tree):
            if (isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__")
                    and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))
                    and n.attr not in own and n.attr not in declared):
                found.append(f"{path.relative_to(ROOT)}:{n.lineno}: .{n.attr}")
    assert not found, found


def test_dashboards_import_nothing_of_the_exporter() -> None:
    """Between the two packages imports go one way: exporter -> dashboards (the catalogue)."""
    for path in (ROOT / "dashboards").rglob("*.py"):
        bad = {m for m in _imports_in(path) if m.split(".")[0] == "exporter"}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def _imports_of_the_other(tree: Path, other: str, root: Path = ROOT) -> list[str]:
    """``path: module`` for every import, in the Python files under ``tree``, of a module of the
    top-level package ``other`` (``import_module("...")`` with a literal name included)."""
    found = []
    for path in sorted(tree.rglob("*.py")):
        mods = _imports_in(path, root, literal=True)
        found += [f"{path.relative_to(root)}: {m}" for m in sorted(mods) if m.split(".")[0] == other]
    return found


def test_tests_and_bench_import_nothing_of_each_other() -> None:
    """What both need is the product's (exporter/: a real engine's harness is
    exporter/harness/real_*.py); the fuzz campaign is the tests' (tests/fuzz/)."""
    assert _imports_of_the_other(ROOT / "tests", "bench") == []
    assert _imports_of_the_other(ROOT / "bench", "tests") == []


def test_the_import_check_sees_each_spelling(tmp_path: Path) -> None:
    bad = tmp_path / "bench"
    bad.mkdir()
    (bad / "a.py").write_text("import tests.helpers\nfrom tests.transcripts import CASES\n"
                              "import importlib\nimportlib.import_module('tests.vllm_engine')\n"
                              "from exporter.harness import stack\n")
    assert _imports_of_the_other(bad, "tests", root=tmp_path) == [
        "bench/a.py: tests.helpers", "bench/a.py: tests.transcripts", "bench/a.py: tests.vllm_engine"]
    assert _imports_of_the_other(bad, "bench", root=tmp_path) == []


def test_evidence_lives_in_the_exporter() -> None:
    assert not (ROOT / "dashboards" / "evidence").exists()
    assert (ROOT / "exporter" / "evidence" / "cli.py").exists()


def test_no_two_modules_import_each_other() -> None:
    """Not even for types: a pair that imports each other knows each other's insides."""
    graph = _graph()
    pairs = sorted({tuple(sorted((a, b))) for a, deps in graph.items() for b in deps
                    if a != b and a in graph.get(b, set()) and not b.startswith(a + ".") and not a.startswith(b + ".")})
    assert not pairs, pairs


#: the rooms, lowest first: a module imports only from its own room or lower ones
ROOMS = ("exporter.core", "dashboards.mixin", "exporter.proxy", "dashboards", "exporter.evidence",
         "exporter.harness", "exporter.cli", "exporter.demo")


def _room(module: str) -> int | None:
    """The rank of the most specific room ``module`` is in."""
    rooms = [room for room in ROOMS if module == room or module.startswith(room + ".")]
    return ROOMS.index(max(rooms, key=len)) if rooms else None


def test_rooms_import_downward() -> None:
    """harness -> evidence -> proxy -> core, with the boards beside: docs/architecture.md's drawing."""
    upward = sorted((a, b) for a, deps in _graph().items() for b in deps
                    if _room(a) is not None and _room(b) is not None and _room(b) > _room(a))  # type: ignore[operator]
    assert not upward, upward


def test_architecture_names_every_module() -> None:
    """docs/architecture.md's drawing is redrawn when a module comes or goes."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    drawing = text[text.index("```"):text.index("```", text.index("```") + 3)]
    missing = sorted(str(p.relative_to(ROOT)) for p in _sources()
                     if p.name != "__init__.py" and p.name != "__main__.py"
                     and not re.search(rf"\b{re.escape(p.stem)}\b", drawing))
    assert not missing, missing


def test_user_docs_cite_no_spec_sections() -> None:
    """Users have no SPEC: the README, docs/ and every --help stand on their own."""
    texts = {p: p.read_text(encoding="utf-8") for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
    texts.update({p: p.read_text(encoding="utf-8") for p in _sources()})
    bad = [str(p.relative_to(ROOT)) for p, text in texts.items() if "SPEC" in text]
    assert not bad, bad


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
