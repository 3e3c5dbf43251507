"""The event loop's own lateness, sampled all the time the proxy runs (fast while requests are
in flight), and the largest lag each request saw.

A timestamp taken on the loop is late by however long the loop was busy (or blocked)
before it got to the socket that became readable.  The probe measures exactly that: a
kernel timer (Linux ``timerfd``) becomes readable every ``PERIOD_S``, like a socket that
received data; its reader callback schedules a ``call_soon`` that stamps, once the loop has
also run the other callbacks ready in that round, how long after the oldest unread expiry
that was (a read handled late in a busy round waited that long too).  Where ``timerfd`` is missing, a loop timer's lateness stands in (coarser:
it includes the loop's own timer rounding, so it over-states an idle loop's lag).

Each sample is observed in ``llmbench_proxy_event_loop_lag_seconds`` and folded into
per-epoch maxima (``EPOCH_S`` wide), from which :meth:`LoopLag.release` gives a request, as
it ends, the largest lag seen while it was in flight: its ``timing_uncertainty_s``, an upper bound on
how late any of its timestamps can be (one epoch of slack on each side keeps it an upper
bound).

The probe samples all the time the proxy runs, but slows down to ``IDLE_PERIOD_S`` once no
request has been in flight for ``LINGER_S`` and speeds up with the next request
(:meth:`LoopLag.mark`): an idle proxy barely wakes a core.  A stall while it idles holds up no
request in flight; a request that arrives during one is charged what the probe sees from one
fast period after its arrival.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import struct
import time
from collections import deque
from collections.abc import Callable
from itertools import islice

__all__ = ["LoopLag", "PERIOD_S", "EPOCH_S", "LINGER_S", "IDLE_PERIOD_S", "LAG_BUCKETS"]

log = logging.getLogger("llmbench.proxy")

PERIOD_S = 0.002  # 500 probes a second while requests are in flight
EPOCH_S = 0.1
#: the probe slows down once no request has been in flight for this long (500 wake-ups a
#: second cost 2 % of a core and preempt a CPU-bound engine)
LINGER_S = 1.0
#: the idle probe's period: the histogram keeps being sampled, ten times a second
IDLE_PERIOD_S = 0.1
#: 50 µs .. 1 s; 1 ms, the alert's threshold, is a bound.
LAG_BUCKETS: tuple[float, ...] = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075,
    0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)
_KEEP_EPOCHS = 40_000  # a bit over an hour of epochs: the longest request (timeouts.total_s default)


class _TimeSpec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _ITimerSpec(ctypes.Structure):
    _fields_ = [("it_interval", _TimeSpec), ("it_value", _TimeSpec)]


def _libc() -> ctypes.CDLL | None:
    if not hasattr(os, "O_NONBLOCK") or os.uname().sysname != "Linux":
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)  # the process's own symbols: libc's, no ldconfig run
    except OSError:
        return None


def _arm(libc: ctypes.CDLL, fd: int, period_s: float) -> float | None:
    """Make ``fd`` fire every ``period_s`` from one period on (0: disarm); the first expiry."""
    first = time.monotonic() + period_s
    nsec = int(period_s * 1e9)
    spec = (_ITimerSpec(_TimeSpec(nsec // 1_000_000_000, nsec % 1_000_000_000),
                        _TimeSpec(int(first), int((first % 1.0) * 1e9)))
            if period_s > 0 else _ITimerSpec(_TimeSpec(0, 0), _TimeSpec(0, 0)))
    if libc.timerfd_settime(fd, 1, ctypes.byref(spec), None) != 0:  # 1: TFD_TIMER_ABSTIME
        return None
    return int(first) + int((first % 1.0) * 1e9) / 1e9


def _timerfd(period_s: float) -> tuple[int, float] | None:
    """A non-blocking CLOCK_MONOTONIC timerfd firing every ``period_s``; (fd, first expiry)."""
    libc = _libc()
    if libc is None:
        return None
    try:
        fd = libc.timerfd_create(time.CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return None
        first = _arm(libc, fd, period_s)
        if first is None:
            os.close(fd)
            return None
    except AttributeError:
        return None
    return fd, first


class LoopLag:
    """Samples the running loop's lag; ``observe`` receives each sample (seconds)."""

    def __init__(self, observe: Callable[[float], None], period_s: float = PERIOD_S) -> None:
        self._observe = observe
        self.period_s = period_s
        self._period = period_s  # the timer's period now: period_s, or IDLE_PERIOD_S when idle
        self._epochs: deque[float] = deque(maxlen=_KEEP_EPOCHS)
        self._first_epoch = 0  # absolute index of self._epochs[0]
        self._t_base = time.monotonic()
        self._fd = -1
        self._expiries = 0
        self._first_expiry = 0.0
        self._unsampled: float | None = None  # expiry read, its sample not yet taken
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0
        self.kind = "off"
        self._libc: ctypes.CDLL | None = None
        self.armed = False  # sampling fast now (else idle: no request in flight for LINGER_S)
        self._active = 0  # requests marked and not yet released
        self._idle_since = time.monotonic()

    # -- sampling ------------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Sample from now on; slowly whenever no request was in flight for ``LINGER_S``."""
        self._loop = loop
        self._idle_since = time.monotonic()
        made = _timerfd(self.period_s)
        if made is not None:
            self._fd, self._first_expiry = made
            self._libc = _libc()
            loop.add_reader(self._fd, self._on_timerfd)
            self.kind = "timerfd"
        else:
            self._due = time.monotonic() + self.period_s
            self._timer = loop.call_later(self.period_s, self._on_timer)
            self.kind = "timer"
        self.armed = True

    def stop(self) -> None:
        if self._fd >= 0 and self._loop is not None:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.armed = False
        self._loop = None  # stopped for good: a later mark() wakes nothing

    def _rearm(self, period: float) -> bool:
        """Sample every ``period`` from one period on; False where the timer could not be set."""
        assert self._loop is not None
        if self._fd >= 0 and self._libc is not None:
            first = _arm(self._libc, self._fd, period)
            if first is None:
                return False
            self._first_expiry, self._expiries = first, 0
        elif self.kind == "timer":
            if self._timer is not None:
                self._timer.cancel()
            self._due = time.monotonic() + period
            self._timer = self._loop.call_later(period, self._on_timer)
        self._period = period
        return True

    def _wake(self) -> None:
        """A request arrived while the probe idled: sample fast again, from one period on."""
        if self._loop is not None and self._rearm(self.period_s):
            self.armed = True

    def _sleep_when_idle(self, now: float) -> bool:
        """Slow down once no request was in flight for LINGER_S; True when it did now."""
        if not self.armed or self._active or now - self._idle_since < LINGER_S:
            return False
        if self.kind == "timerfd":
            self._rearm(IDLE_PERIOD_S)
        else:
            self._period = IDLE_PERIOD_S  # _on_timer schedules the next one
        self.armed = False
        return True

    def _on_timerfd(self) -> None:
        try:
            (n,) = struct.unpack("=Q", os.read(self._fd, 8))
        except (BlockingIOError, InterruptedError):
            return
        oldest = self._first_expiry + self._expiries * self._period
        self._expiries += n
        assert self._loop is not None
        # Measured once the loop has run this round's other ready callbacks: a read handled
        # later in the same round than this one waited that much longer.
        if self._unsampled is None:
            self._unsampled = oldest
            self._loop.call_soon(self._after_round)

    def _after_round(self) -> None:
        now = time.monotonic()
        oldest, self._unsampled = self._unsampled, None
        if oldest is not None:
            self._sample(now, max(0.0, now - oldest))
        self._sleep_when_idle(now)

    def _on_timer(self) -> None:
        now = time.monotonic()
        assert self._loop is not None
        self._sample(now, max(0.0, now - self._due))
        self._timer = None
        self._sleep_when_idle(now)
        self._due = now + self._period
        self._timer = self._loop.call_later(self._period, self._on_timer)

    def _sample(self, now: float, lag: float) -> None:
        epochs = self._epochs
        index = int((now - self._t_base) / EPOCH_S)
        if not epochs:
            epochs.append(0.0)
            self._first_epoch = index
        else:
            gap = index - (self._first_epoch + len(epochs) - 1)
            if gap > 0:
                epochs.extend([0.0] * min(gap, _KEEP_EPOCHS))  # maxlen drops the oldest
                self._first_epoch = index - len(epochs) + 1
        if lag > epochs[-1]:
            epochs[-1] = lag
        self._observe(lag)

    # -- per request ---------------------------------------------------------------------------

    def mark(self) -> float:
        """A request starts: remember when (monotonic seconds); the probe samples until the
        matching :meth:`release` and ``LINGER_S`` after the last one."""
        self._active += 1
        if not self.armed:
            self._wake()
        return time.monotonic()

    def pending(self, now: float) -> float:
        """How late the loop is right now: an expiry not yet read is waiting this long."""
        if self._fd >= 0:
            oldest = self._first_expiry + self._expiries * self._period
            if self._unsampled is not None:
                oldest = self._unsampled
            return max(0.0, now - oldest)
        return max(0.0, now - self._due) if self._timer is not None else 0.0

    def release(self, start: float) -> float:
        """The request that :meth:`mark` gave ``start`` is done: release it (the probe slows
        down ``LINGER_S`` after the last one) and return the largest lag sampled since
        ``start`` (one epoch of slack either side), or now pending."""
        now = time.monotonic()
        if self._active > 0:
            self._active -= 1
            if not self._active:
                self._idle_since = now
        worst = self.pending(now)
        epochs = self._epochs
        if epochs:
            first = int((start - self._t_base) / EPOCH_S) - 1  # one epoch of slack before
            count = self._first_epoch + len(epochs) - first
            if count > 0:  # newest first: the cost follows the request's duration, not the history
                worst = max(worst, max(islice(reversed(epochs), count)))
        return worst
