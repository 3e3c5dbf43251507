"""exporter/proxy/children.py with real processes: exits told as they happen, every child
reaped (tests/unit/test_children.py has the stand-ins and the supervisor)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from exporter.proxy.children import Children, describe_exit

SLEEP = "/bin/sleep"


def _spawn(*argv: str) -> int:
    """A child of this process that nothing else reaps."""
    return os.posix_spawn(argv[0], list(argv), dict(os.environ))


def _gone(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


async def test_each_exit_reaches_the_loop_as_it_happens() -> None:
    """Three deaths, one after another: each is told within 0.25 s (a check every 0.5 s, as
    before, would miss that bound about half the time, three times in a row once in eight)."""
    pids = [_spawn(SLEEP, "30") for _ in range(3)]
    children = Children({pid: i for i, pid in enumerate(pids)})
    loop = asyncio.get_running_loop()
    told: asyncio.Queue[tuple[int, int, float]] = asyncio.Queue()
    children.on_exit(loop, lambda pid, code: told.put_nowait((pid, code, time.monotonic())))
    try:
        for pid in pids:
            await asyncio.sleep(0.1)
            killed = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            got_pid, code, at = await asyncio.wait_for(told.get(), 10)
            assert (got_pid, code) == (pid, -signal.SIGKILL)
            assert at - killed < 0.25
    finally:
        children.detach()
        children.stop(5)
    assert all(_gone(pid) for pid in pids)  # reaped: no zombie left behind


async def test_an_exit_before_the_loop_listens_is_told_when_it_does() -> None:
    pid = _spawn("/bin/sh", "-c", "exit 3")
    children = Children({pid: 0})
    children._threads[pid].join(10)  # its reaper saw it exit on its own
    children.stop(10)  # nothing to signal
    assert children.exited == {pid: 3}
    told: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
    children.on_exit(asyncio.get_running_loop(), lambda p, c: told.set_result((p, c)))
    assert await asyncio.wait_for(told, 10) == (pid, 3)


def test_stop_waits_for_the_exits_not_for_a_timer() -> None:
    """Children that exit on SIGTERM are waited for as they exit (no 50 ms sleep between
    looks); one that ignores SIGTERM is killed at the deadline."""
    quick = [_spawn(SLEEP, "30") for _ in range(4)]
    children = Children({pid: i for i, pid in enumerate(quick)})
    time.sleep(0.1)
    t = time.monotonic()
    children.stop(10)
    assert time.monotonic() - t < 1.0
    assert children.exited == {pid: -signal.SIGTERM for pid in quick}
    stubborn = _spawn("/bin/sh", "-c", "trap '' TERM; sleep 30")
    children = Children({stubborn: 0})
    time.sleep(0.2)  # the trap is set
    t = time.monotonic()
    children.stop(0.5)
    assert 0.5 <= time.monotonic() - t < 5
    assert children.exited == {stubborn: -signal.SIGKILL} and _gone(stubborn)


def test_exits_are_described() -> None:
    assert describe_exit(0) == "status 0" and describe_exit(1) == "status 1"
    assert describe_exit(-9) == "killed by SIGKILL"
