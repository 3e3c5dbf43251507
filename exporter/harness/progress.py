"""What ``load`` shows while it runs: requests done of planned, per cell, on stderr.

Warm-up requests are counted openly and apart: ``8/8 requests (+2 warm-up)``, as the round tables
count the rounds' requests only (warm-ups are labelled ``warmup`` and left out of every table).

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
                 clock: Callable[[], float] = time.monotonic, every_s: float = LINE_EVERY_S,
                 warmup: int = 0) -> None:
        self.label = label
        self.planned = planned  # the rounds' requests, as the tables count them
        self.warmup = warmup  # warm-up requests planned, counted apart
        self.warming = False  # the requests finishing now are warm-ups
        self.warm_done = 0
        self.warm_failed = 0
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.clock = clock
        self.every_s = every_s
        self.stage = ""  # "warm-up" or "round 2/3"
        self.done = 0
        self.failed = 0
        self.started = self.last_line = clock()
        self.closed = False

    def _warm(self) -> str:
        """The warm-ups, apart from the rounds' count: ``warm-up 1/2`` while they run, then ``(+2 warm-up)``."""
        if not self.warmup:
            return ""
        failed = f", {self.warm_failed} failed" if self.warm_failed else ""
        if self.warming:
            return f", warm-up {self.warm_done}/{self.warmup}{failed}"
        return f" (+{self.warm_done} warm-up{failed})"

    def text(self, now: float) -> str:
        stage = f", {self.stage}" if self.stage and not self.warming else ""
        return (f"{self.label}: {self.done}/{self.planned} requests{self._warm()}{stage}, {self.failed} failed, "
                f"{now - self.started:.0f} s")

    def _bar(self, now: float) -> None:
        fill = int(_BAR * min(self.done, self.planned) / max(1, self.planned))
        stage = f" {self.stage}" if self.stage and not self.warming else ""
        self.stream.write(f"\r{self.label} [{'#' * fill}{'.' * (_BAR - fill)}] {self.done}/{self.planned}"
                          f"{self._warm()}{stage}, {self.failed} failed, {now - self.started:.0f} s ")
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
        """One request finished (a warm-up while :attr:`warming`)."""
        if self.warming:
            self.warm_done += 1
            self.warm_failed += 0 if ok else 1
        else:
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
