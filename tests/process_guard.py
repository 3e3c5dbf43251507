"""The guard that keeps tests under ``tests/unit`` from starting processes (README "Testing": a
test that starts one is marked ``slow`` or lives in ``tests/e2e``); ``tests/unit/conftest.py``
wraps each test's set-up, call and tear-down in :func:`guarded_phase`.

For every test there not marked ``slow``, each way Python starts a process is replaced by one
that raises :class:`ProcessStart` instead: ``subprocess`` (and with it ``asyncio``'s
subprocesses and ``os.popen``), ``multiprocessing``'s fork, spawn and forkserver, ``os.fork``,
``os.forkpty`` (``pty``), ``os.posix_spawn[p]``, ``os.system`` and ``os.spawn*``.  A fork through
any other binding of ``os.fork`` is seen by an ``os.register_at_fork`` hook.  Every attempt is
also noted, so that code that catches the exception does not hide it: the test fails, naming
what it tried to start.  ``tests/unit/test_suite_split.py`` checks the guard, and scans the
files for the same calls where a test is skipped (no ``promtool``, say).

Imports nothing of the project: the test of the guard runs it in a directory of its own.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Generator, Iterator
from typing import Any

import pytest

__all__ = ["ProcessStart", "no_process_starts", "guarded_phase"]


class ProcessStart(RuntimeError):
    """A test under tests/unit that is not marked ``slow`` tried to start a process."""


_seen: list[str] | None = None  # the attempts of the guarded phase running now; None: no guard


def _note(what: str) -> None:
    if _seen is not None:
        _seen.append(what)


os.register_at_fork(before=lambda: _note("a fork (os.fork by another name)"))


def _refuse(what: str, describe: Callable[..., str] = lambda *a, **k: "") -> Callable[..., Any]:
    def refused(*args: Any, **kwargs: Any) -> Any:
        shown = f"{what}({describe(*args, **kwargs)})"
        _note(shown)
        raise ProcessStart(f"{shown}: a test under tests/unit starts no process (mark it slow or move "
                           "it to tests/e2e)")
    return refused


def _argv(args: Any, *_: Any, **__: Any) -> str:
    """The program of a ``fork_exec``/``posix_spawn`` call: its first argument, the argv."""
    try:
        return " ".join(os.fsdecode(a) for a in args)[:200]
    except TypeError:
        return repr(args)[:200]


@contextlib.contextmanager
def no_process_starts() -> Iterator[list[str]]:
    """Every way to start a process raises :class:`ProcessStart` meanwhile; yields the list of
    attempts (a caller that expects some clears it)."""
    import _posixsubprocess

    global _seen
    outer, _seen = _seen, []
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(subprocess, "_fork_exec", _refuse("subprocess", _argv))
        mp.setattr(_posixsubprocess, "fork_exec", _refuse("_posixsubprocess.fork_exec", _argv))
        for name in ("posix_spawn", "posix_spawnp"):
            if hasattr(os, name):
                mp.setattr(os, name, _refuse(f"os.{name}", lambda path, *a, **k: os.fsdecode(path)))
        for name in ("fork", "forkpty"):
            if hasattr(os, name):
                mp.setattr(os, name, _refuse(f"os.{name}"))
        mp.setattr(os, "system", _refuse("os.system", lambda command: command))
        yield _seen
    finally:
        mp.undo()
        _seen = outer


def guarded_phase(item: pytest.Item, phase: str) -> Generator[None, Any, Any]:
    """A hook wrapper's body: the phase runs under :func:`no_process_starts` unless the test is
    marked ``slow``, and fails when it tried to start a process (even one whose exception it
    caught)."""
    if item.get_closest_marker("slow") is not None:
        return (yield)
    with no_process_starts() as seen:
        result = yield
    if seen:
        pytest.fail(f"{item.nodeid} started a process in its {phase} ({'; '.join(seen)}), but is not "
                    "marked slow: tests under tests/unit start no process", pytrace=False)
    return result
