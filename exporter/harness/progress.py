"""What ``load`` shows while it runs: requests done of planned, per cell, on stderr.

On a terminal a bar redrawn in place; otherwise (a log file, CI) one line whenever
:data:`LINE_EVERY_S` seconds have passed since the last line, whether requests finished or
not (:meth:`Progress.heartbeat` runs every second), and a last line when the cell ends.
The clock and the stream are parameters, so that tests need no wall-clock waits.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["Progress", "LINE_EVERY_S"]

#: seconds between progress lines when stderr is not a terminal
LINE_EVERY_S = 10.0
_BAR = 30


class Progress:
    """Requests done of planned for one cell (or one round when run alone)."""

    def __init__(self, label: str, planned: int, *, stream: TextIO | None = None, tty: bool | None = None,
                 clock: Callable[[], float] = time.monotonic, every_s: float = LINE_EVERY_S) -> None:
        self.label = label
        self.planned = planned
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.clock = clock
        self.every_s = every_s
        self.stage = ""  # "warm-up" or "round 2/3"
        self.done = 0
        self.failed = 0
        self.started = self.last_line = clock()
        self.closed = False

    def text(self, now: float) -> str:
        stage = f", {self.stage}" if self.stage else ""
        return (f"{self.label}: {self.done}/{self.planned} requests{stage}, {self.failed} failed, "
                f"{now - self.started:.0f} s")

    def _bar(self, now: float) -> None:
        fill = int(_BAR * min(self.done, self.planned) / max(1, self.planned))
        self.stream.write(f"\r{self.label} [{'#' * fill}{'.' * (_BAR - fill)}] {self.done}/{self.planned}"
                          f"{' ' + self.stage if self.stage else ''}, {self.failed} failed, "
                          f"{now - self.started:.0f} s ")
        self.stream.flush()

    def _line(self, now: float) -> None:
        self.stream.write(self.text(now) + "\n")
        self.stream.flush()
        self.last_line = now

    def _show(self, force: bool = False) -> None:
        now = self.clock()
        if self.tty:
            self._bar(now)
        elif force or now - self.last_line >= self.every_s:
            self._line(now)

    def tick(self, ok: bool) -> None:
        """One request finished."""
        self.done += 1
        self.failed += 0 if ok else 1
        self._show()

    def heartbeat(self) -> None:
        """Called every second while the cell runs: a line when one is due."""
        if not self.closed:
            self._show()

    def close(self) -> None:
        """The cell ended (done, or stopped by a rule): the last state, once."""
        if self.closed:
            return
        self.closed = True
        if self.tty:
            self._bar(self.clock())
            self.stream.write("\n")
            self.stream.flush()
        else:
            self._line(self.clock())
