"""Issue 26: the supervisor learns of a dead worker as it dies, and shutdown waits on the
processes; neither polls (exporter/proxy/children.py, exporter/proxy/workers.py).

The processes here are stand-ins (``waitpid`` blocks until the test ends a "process"); real
ones: tests/e2e/test_children_real.py.
"""

from __future__ import annotations

import asyncio
import functools
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from exporter.proxy import workers
from exporter.proxy.children import UNKNOWN_EXIT, Children, describe_exit
from exporter.proxy.shared import SharedScenarios

from tests.helpers import make_config


class Procs:
    """A process table: ``waitpid`` blocks until :meth:`end`; ``kill`` ends the process
    (SIGTERM only where it does not ignore it)."""

    def __init__(self, *pids: int, ignore_term: tuple[int, ...] = ()) -> None:
        self.ended = {pid: threading.Event() for pid in pids}
        self.status: dict[int, int] = {}
        self.ignore_term = ignore_term
        self.signals: list[tuple[int, int]] = []

    def end(self, pid: int, *, code: int = 0, sig: int = 0) -> None:
        if self.ended[pid].is_set():  # a zombie's status stays what it was
            return
        self.status[pid] = sig if sig else code << 8  # as waitpid encodes them
        self.ended[pid].set()

    def waitpid(self, pid: int, flags: int) -> tuple[int, int]:
        assert flags == 0  # a blocking wait, not a look
        if pid not in self.ended:
            raise ChildProcessError(pid)
        self.ended[pid].wait()
        return pid, self.status[pid]

    def kill(self, pid: int, sig: int) -> None:
        if pid not in self.ended:
            raise ProcessLookupError(pid)
        self.signals.append((pid, sig))
        if sig != signal.SIGTERM or pid not in self.ignore_term:
            self.end(pid, sig=sig)

    def children(self, pids: dict[int, int] | None = None) -> Children:
        return Children(pids if pids is not None else {pid: i for i, pid in enumerate(self.ended)},
                        waitpid=self.waitpid, kill=self.kill)


async def test_each_exit_reaches_the_loop_as_it_happens() -> None:
    """Three deaths, one after another: each is told within 0.25 s (a look every 0.5 s, as
    before, would miss that bound about half the time; three times in a row, seven in eight)."""
    procs = Procs(11, 12, 13)
    children = procs.children()
    told: asyncio.Queue[tuple[int, int, float]] = asyncio.Queue()
    children.on_exit(asyncio.get_running_loop(), lambda pid, code: told.put_nowait((pid, code, time.monotonic())))
    for pid, code in ((12, 3), (11, 0), (13, -9)):
        await asyncio.sleep(0.05)
        ended = time.monotonic()
        procs.end(pid, code=max(code, 0), sig=-min(code, 0))
        got_pid, got_code, at = await asyncio.wait_for(told.get(), 10)
        assert (got_pid, got_code) == (pid, code)
        assert at - ended < 0.25
    assert children.exited == {12: 3, 11: 0, 13: -9}
    children.stop(1)
    assert procs.signals == []  # all gone: nothing to signal


async def test_an_exit_before_the_loop_listens_is_told_when_it_does() -> None:
    procs = Procs(21, 22)
    children = procs.children()
    procs.end(21, code=4)
    for thread in children._threads.values():
        thread.join(0.5)  # 21's reaper is done; 22's still waits
    told: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
    children.on_exit(asyncio.get_running_loop(), lambda p, c: told.put_nowait((p, c)))
    assert await asyncio.wait_for(told.get(), 10) == (21, 4)
    procs.end(22, code=0)
    assert await asyncio.wait_for(told.get(), 10) == (22, 0)
    children.stop(1)


async def test_no_exit_is_told_after_detach() -> None:
    procs = Procs(31)
    children = procs.children()
    told: list[int] = []
    children.on_exit(asyncio.get_running_loop(), lambda p, c: told.append(p))
    children.detach()
    procs.end(31)
    children.stop(1)
    await asyncio.sleep(0.05)
    assert told == [] and children.exited == {31: 0}


def test_stop_waits_on_the_exits_and_kills_at_the_deadline() -> None:
    procs = Procs(41, 42)
    children = procs.children()
    t = time.monotonic()
    children.stop(10)
    assert time.monotonic() - t < 1.0  # woken by the exits, not by a deadline
    assert procs.signals == [(41, signal.SIGTERM), (42, signal.SIGTERM)]
    assert children.exited == {41: -signal.SIGTERM, 42: -signal.SIGTERM}
    stubborn = Procs(43, 44, ignore_term=(44,))
    children = stubborn.children()
    t = time.monotonic()
    children.stop(0.3)
    assert 0.3 <= time.monotonic() - t < 5
    assert stubborn.signals == [(43, signal.SIGTERM), (44, signal.SIGTERM), (44, signal.SIGKILL)]
    assert children.exited == {43: -signal.SIGTERM, 44: -signal.SIGKILL}


def test_send_signals_the_running_and_stop_takes_the_signal_to_exit_by() -> None:
    """A graceful stop signals the workers (SIGTERM: drain) without waiting; they exit on SIGUSR1."""
    procs = Procs(53, 54, ignore_term=(53, 54))  # SIGTERM drains: the process goes on
    children = procs.children()
    children.send(signal.SIGTERM)
    assert procs.signals == [(53, signal.SIGTERM), (54, signal.SIGTERM)] and children.exited == {}
    children.stop(10, signal.SIGUSR1)
    assert procs.signals[2:] == [(53, signal.SIGUSR1), (54, signal.SIGUSR1)]
    assert children.exited == {53: -signal.SIGUSR1, 54: -signal.SIGUSR1}


def test_a_child_reaped_elsewhere_is_gone() -> None:
    procs = Procs()
    children = procs.children({51: 0})  # not in the table: waitpid raises ChildProcessError
    children._threads[51].join(1)
    children.stop(1)
    assert children.exited == {51: UNKNOWN_EXIT} and procs.signals == []  # gone: not signalled


def test_exits_are_described() -> None:
    assert describe_exit(0) == "status 0" and describe_exit(1) == "status 1"
    assert describe_exit(-9) == "killed by SIGKILL" and describe_exit(-200) == "killed by signal 200"


async def test_the_supervisor_stops_at_a_workers_death(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       upstream: Any, caplog: pytest.LogCaptureFixture) -> None:
    """``_supervise`` returns 1 as soon as a worker dies, with a line naming it."""
    run_dir = tmp_path / "serve"
    run_dir.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(run_dir))
    SharedScenarios.create(run_dir / "scenarios.state").close()
    monkeypatch.setattr(workers, "render_forever", functools.partial(workers.render_forever, nice=0))
    procs = Procs(61, 62)
    children = procs.children({61: 0, 62: 1})
    config = make_config(tmp_path, upstream[1].port)
    supervise = asyncio.create_task(workers._supervise(config, children, run_dir))
    for _ in range(500):  # until the renderer serves
        if (run_dir / "metrics.sock").exists():
            break
        await asyncio.sleep(0.01)
    assert (run_dir / "metrics.sock").exists() and not supervise.done()
    ended = time.monotonic()
    procs.end(62, sig=signal.SIGKILL)
    assert await asyncio.wait_for(supervise, 10) == 1
    assert time.monotonic() - ended < 2
    assert "worker 1 (pid 62) exited (killed by SIGKILL): stopping the proxy" in caplog.text
    children.stop(1)
    assert procs.signals == [(61, signal.SIGTERM)]
