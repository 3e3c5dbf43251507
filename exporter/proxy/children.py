"""The supervisor's worker processes: each one's exit learnt as it happens, never polled.

Every child has a thread of its own blocked in ``waitpid(pid, 0)`` (what asyncio's
``ThreadedChildWatcher`` does): the kernel wakes it when the child exits, and it hands the exit
to the supervisor's event loop (:meth:`Children.on_exit`).  Shutdown (:meth:`Children.stop`)
waits on those threads, up to a deadline, then kills what is left and waits for it.  No timer,
no sleep loop: an idle supervisor is not woken, and a death is known at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping

__all__ = ["Children", "describe_exit", "UNKNOWN_EXIT"]

#: exit code (as :func:`os.waitstatus_to_exitcode` gives it), for a child another reaper took
UNKNOWN_EXIT = 255

ExitCallback = Callable[[int, int], None]
WaitPid = Callable[[int, int], tuple[int, int]]
Kill = Callable[[int, int], None]


def describe_exit(code: int) -> str:
    """``status 1``, or ``killed by SIGKILL`` for a negative code."""
    if code >= 0:
        return f"status {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


class Children:
    """Child processes by pid (the value: the worker's index), each reaped as it exits."""

    def __init__(self, pids: Mapping[int, int], *, waitpid: WaitPid = os.waitpid, kill: Kill = os.kill) -> None:
        self.index: dict[int, int] = dict(pids)
        self._waitpid = waitpid
        self._kill = kill
        self.exited: dict[int, int] = {}  # pid -> exit code, as each is reaped
        self._lock = threading.Lock()
        self._target: tuple[asyncio.AbstractEventLoop, ExitCallback] | None = None
        self._threads = {pid: threading.Thread(target=self._reap, args=(pid,), name=f"reap-{pid}", daemon=True)
                         for pid in self.index}
        for thread in self._threads.values():
            thread.start()

    def on_exit(self, loop: asyncio.AbstractEventLoop, callback: ExitCallback) -> None:
        """From now on call ``callback(pid, exit code)`` on ``loop`` for each child that exits,
        and at once for each that already did."""
        with self._lock:
            self._target = (loop, callback)
            done = list(self.exited.items())
        for pid, code in done:
            self._notify(loop, callback, pid, code)

    def detach(self) -> None:
        """Tell no loop of exits any more (they are still reaped and kept in :attr:`exited`)."""
        with self._lock:
            self._target = None

    def send(self, sig: int) -> None:
        """Send ``sig`` to each child still running."""
        with self._lock:
            running = [pid for pid in self.index if pid not in self.exited]
        for pid in running:
            with contextlib.suppress(ProcessLookupError):
                self._kill(pid, sig)

    def stop(self, timeout_s: float, sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` (SIGTERM) to each child still running and wait for all of them, ``timeout_s`` in all;
        then SIGKILL those left, and wait for them."""
        self.send(sig)
        deadline = time.monotonic() + timeout_s
        for pid, thread in self._threads.items():
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    self._kill(pid, signal.SIGKILL)
                thread.join()

    # -- the reapers ---------------------------------------------------------------------------

    def _reap(self, pid: int) -> None:
        if hasattr(signal, "pthread_sigmask"):  # signals are the main thread's to handle
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGCHLD})
        try:
            _, status = self._waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
        except ChildProcessError:  # reaped by someone else: gone, how is not known
            code = UNKNOWN_EXIT
        with self._lock:
            self.exited[pid] = code
            target = self._target
        if target is not None:
            self._notify(*target, pid, code)

    @staticmethod
    def _notify(loop: asyncio.AbstractEventLoop, callback: ExitCallback, pid: int, code: int) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody to tell
            loop.call_soon_threadsafe(callback, pid, code)
