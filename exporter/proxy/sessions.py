"""Turns of a session: the requests that carry one ``X-Session-ID`` (or AIPerf's
``X-Correlation-ID``), numbered 1, 2, ... in the order they arrive at this proxy process.

The count is per run (one ``serve`` start) and bounded in memory: a session idle for more than
``idle_s`` is forgotten (its next request starts again at turn 1), and no more than ``max``
sessions are held at once (the one idle longest is forgotten first).  Each entry is a few hundred
bytes, so the default bound (100 000 sessions) stays within tens of megabytes.  Every call is
O(1) amortized: the sessions are kept in order of their last request, and the ones that expired
are dropped from the front.

Under ``serve --workers N`` each worker holds its own count: a session whose requests reach two
workers is numbered by each of them apart (docs/sessions.md says what that means).
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["SessionTurns"]


class SessionTurns:
    """Turn numbers per session id, forgotten after ``idle_s`` idle seconds, ``max_sessions`` at most."""

    __slots__ = ("idle_s", "max_sessions", "_seen", "forgotten")

    def __init__(self, idle_s: float = 600.0, max_sessions: int = 100_000) -> None:
        self.idle_s = idle_s
        self.max_sessions = max_sessions
        self._seen: OrderedDict[str, tuple[int, float]] = OrderedDict()  # id -> (turns, last arrival)
        self.forgotten = 0  # sessions dropped for the cap (not for idling): the bound was too small

    def turn(self, session_id: str, now: float) -> int:
        """The turn of a request of ``session_id`` arriving at ``now`` (monotonic seconds)."""
        seen = self._seen
        while seen:  # the front idles longest: drop what expired
            oldest, (_, last) = next(iter(seen.items()))
            if now - last <= self.idle_s:
                break
            del seen[oldest]
        before = seen.pop(session_id, None)
        turn = 1 if before is None else before[0] + 1
        seen[session_id] = (turn, now)
        while len(seen) > self.max_sessions:
            seen.popitem(last=False)
            self.forgotten += 1
        return turn

    def __len__(self) -> int:
        return len(self._seen)
