"""Tests under ``tests/unit`` start no process; a test that does is marked ``slow`` or lives in
``tests/e2e`` (README "Testing").

Two checks hold this:

* at run time, ``tests/unit/conftest.py`` guards every test here that is not marked ``slow``
  (``tests/process_guard.py``): starting a process raises and fails the test.  The first tests
  below start processes each way under that guard; the ``slow`` one runs pytest on a bad
  example in a directory of its own and sees it fail;
* statically, :func:`unmarked_starters` finds each test function here that can reach a call
  that starts a process (directly, through a helper or fixture of its module, or through a
  function of the project or of ``tests/`` that does) and is not marked ``slow``: it also sees
  the tests that are skipped on this machine (no ``promtool``, say), which the guard cannot.
"""

from __future__ import annotations

import ast
import asyncio
import multiprocessing
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from tests.process_guard import ProcessStart, no_process_starts

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "tests" / "unit"

# -- the guard, at run time --------------------------------------------------------------------


def _child() -> None:  # pragma: no cover - never runs: the start is refused
    os._exit(0)


def _start_each_way() -> Iterator[tuple[str, object]]:
    yield "subprocess.run", lambda: subprocess.run(["true"], check=False)
    yield "subprocess.Popen", lambda: subprocess.Popen(["true"])
    yield "os.system", lambda: os.system("true")
    yield "os.popen", lambda: os.popen("true").read()
    yield "os.fork", lambda: os.fork()  # looked up when called: the guard's, not the real one
    yield "os.spawnv", lambda: os.spawnv(os.P_WAIT, "/bin/true", ["true"])
    yield "asyncio subprocess", lambda: asyncio.run(asyncio.create_subprocess_exec("true"))
    for method in ("fork", "spawn", "forkserver"):
        yield f"multiprocessing {method}", lambda m=method: multiprocessing.get_context(m).Process(target=_child).start()


@pytest.mark.parametrize("way", [name for name, _ in _start_each_way()])
def test_the_guard_refuses_every_way_to_start_a_process(way: str) -> None:
    start = dict(_start_each_way())[way]
    with no_process_starts() as attempts:  # inside this test's own guard: what it notes stays here
        with pytest.raises(ProcessStart, match="starts no process"):
            start()  # type: ignore[operator]
    assert attempts, way


def test_the_guard_notes_a_start_whose_exception_is_caught() -> None:
    with no_process_starts() as attempts:
        try:
            subprocess.run(["true"], check=False)
        except Exception:  # noqa: BLE001 - as careless code would
            pass
    assert len(attempts) == 1 and "true" in attempts[0]


def test_this_test_runs_guarded() -> None:
    """Not marked slow, so the conftest's guard is on now."""
    with pytest.raises(ProcessStart):
        subprocess.run(["true"], check=False)
    from tests import process_guard

    assert process_guard._seen is not None
    process_guard._seen.clear()  # provoked on purpose: this test is not to fail for it


BAD = '''
import subprocess

import pytest


def test_unmarked_starts_a_process():
    subprocess.run(["true"], check=True)


def test_unmarked_hides_the_start():
    try:
        subprocess.run(["true"], check=True)
    except Exception:
        pass


@pytest.mark.slow
def test_marked_slow_may():
    subprocess.run(["true"], check=True)


def test_starts_nothing():
    assert 1 + 1 == 2
'''


@pytest.mark.slow  # runs pytest in a subprocess
def test_the_guard_fails_an_unmarked_test_that_starts_a_process(tmp_path: Path) -> None:
    """A copy of tests/unit/conftest.py beside a bad example, in a directory of its own: the two
    unmarked tests that start a process fail, the slow one and the one that starts none pass."""
    unit = tmp_path / "unit"
    unit.mkdir()
    (unit / "conftest.py").write_text((UNIT / "conftest.py").read_text())
    (unit / "test_bad.py").write_text(BAD)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: starts processes\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "-q", str(unit)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "FAILED unit/test_bad.py::test_unmarked_starts_a_process" in out, out
    assert "FAILED unit/test_bad.py::test_unmarked_hides_the_start" in out, out
    assert "PASSED unit/test_bad.py::test_marked_slow_may" in out, out
    assert "PASSED unit/test_bad.py::test_starts_nothing" in out, out
    assert "2 failed, 2 passed" in out, out
    assert "started a process in its call (subprocess(true))" in out, out


# -- the scan, statically ----------------------------------------------------------------------

#: calls that start a process (dotted names after resolving the module's imports)
PRIMITIVES = {"os.fork", "os.forkpty", "os.system", "os.popen", "os.posix_spawn", "os.posix_spawnp", "pty.fork",
              "pty.spawn", "asyncio.create_subprocess_exec", "asyncio.create_subprocess_shell",
              *(f"os.spawn{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe"))}
PRIMITIVE_MODULES = ("subprocess.", "multiprocessing.", "_posixsubprocess.", "concurrent.futures.process.")
PRIMITIVE_METHODS = ("subprocess_exec", "subprocess_shell")  # loop.subprocess_exec(...)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


class _Module:
    """One source file: its imports, its functions and classes, and what each function calls."""

    def __init__(self, path: Path, text: str | None = None, name: str | None = None) -> None:
        self.name = name or _module_name(path)
        self.tree = ast.parse(text if text is not None else path.read_text(encoding="utf-8"))
        self.aliases: dict[str, str] = {}
        package = self.name if path.name == "__init__.py" else self.name.rpartition(".")[0]
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                for a in node.names:
                    self.aliases[a.asname or a.name] = f"{base}.{a.name}"
        #: qualified name -> (function node, class name or None)
        self.functions: dict[str, tuple[ast.AST, str | None]] = {}
        self.classes: dict[str, list[str]] = {}
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[f"{self.name}.{node.name}"] = (node, None)
            elif isinstance(node, ast.ClassDef):
                methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
                self.classes[f"{self.name}.{node.name}"] = [f"{self.name}.{node.name}.{m.name}" for m in methods]
                for m in methods:
                    self.functions[f"{self.name}.{node.name}.{m.name}"] = (m, node.name)

    def resolve(self, func: ast.expr, cls: str | None) -> str:
        """The dotted name a call's function stands for (as far as this file tells)."""
        parts: list[str] = []
        while isinstance(func, ast.Attribute):
            parts.insert(0, func.attr)
            func = func.value
        if not isinstance(func, ast.Name):
            return "?." + ".".join(parts)
        root = func.id
        if root in ("self", "cls") and cls is not None:
            return ".".join([self.name, cls, *parts])
        if root in self.aliases:
            return ".".join([self.aliases[root], *parts])
        local = f"{self.name}.{root}"
        if local in self.functions or local in self.classes:
            return ".".join([local, *parts])
        return ".".join([root, *parts])

    def calls(self, node: ast.AST, cls: str | None) -> set[str]:
        return {self.resolve(n.func, cls) for n in ast.walk(node) if isinstance(n, ast.Call)}


def _starts_directly(name: str) -> bool:
    return (name in PRIMITIVES or name.startswith(PRIMITIVE_MODULES)
            or name.rpartition(".")[2] in PRIMITIVE_METHODS)


def process_starters(modules: Iterable[_Module], known: frozenset[str] = frozenset()) -> set[str]:
    """Every function and class of ``modules`` that can start a process: it calls a primitive, or
    a function or class that can (``known``, or one of these; a class can when any of its
    methods can)."""
    calls: dict[str, set[str]] = {}
    members: dict[str, list[str]] = {}
    for mod in modules:
        for name, (node, cls) in mod.functions.items():
            calls[name] = mod.calls(node, cls)
        members.update(mod.classes)
    starters = {name for name, called in calls.items() if any(_starts_directly(c) for c in called)} | known
    while True:
        more = {cls for cls, methods in members.items() if starters.intersection(methods)}
        more |= {name for name, called in calls.items() if starters.intersection(called)}
        if more <= starters:
            return starters
        starters |= more


def _is_slow(decorators: Iterable[ast.expr]) -> bool:
    return any("slow" in ast.unparse(d) for d in decorators if "mark" in ast.unparse(d))


def _fixtures(mod: _Module) -> dict[str, str]:
    """Fixture name -> its function's qualified name."""
    return {node.name: f"{mod.name}.{node.name}" for node in mod.tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and any("fixture" in ast.unparse(d) for d in node.decorator_list)}


def unmarked_starters(test_file: _Module, starters: set[str], fixtures: dict[str, str]) -> list[str]:
    """The tests of ``test_file`` that can start a process without the ``slow`` mark, and any
    module-level statement that would start one at collection."""
    fixtures = {**fixtures, **_fixtures(test_file)}
    starters = process_starters([test_file], frozenset(starters))
    module_slow = any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
                      and "slow" in ast.unparse(n.value) for n in test_file.tree.body)
    found: list[str] = []
    for node in test_file.tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        hits = sorted(c for c in test_file.calls(node, None) if c in starters or _starts_directly(c))
        if hits:
            found.append(f"{test_file.name}:{node.lineno} (module level): {hits}")
    for name, (node, cls) in test_file.functions.items():
        short = name.rpartition(".")[2]
        if not short.startswith("test") or (cls is not None and not cls.startswith("Test")):
            continue
        assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        class_slow = cls is not None and _is_slow(next(c for c in test_file.tree.body if isinstance(c, ast.ClassDef)
                                                        and c.name == cls).decorator_list)
        if module_slow or class_slow or _is_slow(node.decorator_list):
            continue
        reached = {c for c in test_file.calls(node, cls) if c in starters or _starts_directly(c)}
        reached |= {fixtures[a.arg] for a in node.args.args if fixtures.get(a.arg) in starters}
        if reached:
            found.append(f"{name} (line {node.lineno}): {sorted(reached)}")
    return found


#: this file: its first tests start processes on purpose, each under the guard that refuses them
GUARD_TESTS = "tests.unit.test_suite_split"


#: a file whose text holds none of these, nor the name of a starter found so far, defines no starter
TOKENS = ("subprocess", "multiprocessing", "fork", "spawn", "system(", "popen(", "pty")


def _project_modules() -> list[_Module]:
    """The files under tests/unit and tests/conftest.py, and every file of the project and of
    tests/ that can define a process starter (read as text first: parsing them all costs more)."""
    paths = [*(ROOT / "exporter").rglob("*.py"), *(ROOT / "dashboards").rglob("*.py"),
             *(ROOT / "tests").glob("*.py"), *UNIT.glob("*.py")]
    texts = {p: p.read_text(encoding="utf-8") for p in sorted(paths)}
    parsed = {p: _Module(p, t) for p, t in texts.items() if p.parent == UNIT or p.name == "conftest.py"}
    tokens = set(TOKENS)
    while new := [p for p, t in texts.items() if p not in parsed and any(tok in t for tok in tokens)]:
        parsed.update((p, _Module(p, texts[p])) for p in new)
        top = {n for m in parsed.values() for n in (*m.classes, *(f for f, (_, c) in m.functions.items() if c is None))}
        tokens |= {name.rpartition(".")[2] for name in process_starters(parsed.values()) & top}
    return list(parsed.values())


@pytest.fixture(scope="module")
def project() -> tuple[set[str], dict[str, str], list[_Module]]:
    modules = _project_modules()
    starters = process_starters(modules)
    conftest = next(m for m in modules if m.name == "tests.conftest")
    return starters, _fixtures(conftest), modules


def test_the_scan_knows_the_projects_process_starters(project: tuple[set[str], dict[str, str], list[_Module]]) -> None:
    starters, fixtures, _ = project
    assert {"exporter.harness.stack.Child", "exporter.harness.stack.LocalStack", "exporter.harness.stack.start_prometheus",
            "tests.helpers.run_live_stack", "tests.conftest.live_stack"} <= starters
    assert not {"exporter.harness.stack.free_port", "exporter.harness.stack.wait_http", "tests.helpers.make_config",
                "tests.helpers.require_prometheus"} & starters
    assert fixtures["live_stack"] == "tests.conftest.live_stack"


def test_no_unmarked_test_under_tests_unit_starts_a_process(
        project: tuple[set[str], dict[str, str], list[_Module]]) -> None:
    starters, fixtures, modules = project
    found = [hit for m in modules if m.name.startswith("tests.unit.test_") and m.name != GUARD_TESTS
             for hit in unmarked_starters(m, starters, fixtures)]
    assert not found, "\n".join(found)


def test_the_scan_finds_a_bad_example(tmp_path: Path, project: tuple[set[str], dict[str, str], list[_Module]]) -> None:
    """A bad example, in a file of its own: every way to reach a start is found, the marked and
    the harmless tests are not."""
    starters, fixtures, _ = project
    bad = tmp_path / "test_bad.py"
    bad.write_text(BAD + textwrap.dedent('''
        import os
        from exporter.harness.stack import Child, free_port


        def _helper():
            return os.fork()


        @pytest.fixture
        def proc():
            return subprocess.Popen(["sleep", "9"])


        def test_through_a_helper():
            _helper()


        def test_through_a_fixture(proc):
            pass


        def test_through_the_project(tmp_path):
            Child("x", ["true"], tmp_path)


        def test_through_the_conftest(live_stack):
            pass


        def test_a_free_port_is_no_process():
            free_port()
    '''))
    found = unmarked_starters(_Module(bad, name="tests.unit.test_bad"), starters, fixtures)
    names = sorted(hit.split(" ")[0].rpartition(".")[2] for hit in found)
    assert names == ["test_through_a_fixture", "test_through_a_helper", "test_through_the_conftest",
                     "test_through_the_project", "test_unmarked_hides_the_start", "test_unmarked_starts_a_process"]
