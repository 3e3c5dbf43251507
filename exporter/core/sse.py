"""Incremental Server-Sent Events parser.

Pure code, no I/O.  Bytes go in as they arrive from the network, complete events come out.
The result does not depend on how the bytes were split into reads: a read may end inside a
UTF-8 character, inside ``\\r\\n`` or inside a field name.  Lines end with ``\\n``, ``\\r\\n``
or ``\\r`` (the SSE grammar); comment lines start with ``:``; ``data:`` may or may not be
followed by one space; several ``data:`` lines of one event are joined with ``\\n``.

Memory is bounded per stream, in bytes held: a line longer than ``max_line_bytes`` is skipped
(its bytes are dropped as they arrive) and an event whose data (its ``data:`` values joined with
``\\n``) grows past ``max_event_bytes`` is dropped; a line or an event of exactly the bound is
kept.  The data of an event is joined as it comes, so what is held is the data itself, not one
object per line (:meth:`SSEParser.held_bytes`).  Each loss is reported in order, among the
events, as an :class:`SSEEvent` whose ``problem`` is set, and parsing goes on: a later event (an
error, ``[DONE]``) is still seen.  A skipped field line also drops the event it belongs to, which
can no longer be known whole; a skipped comment line loses nothing else.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

__all__ = ["SSEEvent", "SSEParser"]

_BOM = b"\xef\xbb\xbf"
#: A multi-line event's data is joined in a buffer that is frozen into a block at this size, so
#: that the buffer's growth slack (an eighth of its length) stays small whatever the event's size.
_BLOCK = 64 << 10


class SSEEvent(NamedTuple):
    """One dispatched event: the ``event:`` name (or None) and the joined ``data`` bytes.

    When ``problem`` is set the event is a notice that bytes were lost to a bound (``data`` is
    empty): the stream cannot be judged whole, which the analyzer calls ``malformed``.
    """

    name: str | None
    data: bytes
    problem: str | None = None


class SSEParser:
    """Feed bytes with :meth:`feed`, collect events; call :meth:`close` at end of stream."""

    __slots__ = ("_buf", "_blocks", "_tail", "_size", "_name", "_skip_lf", "_skip_line", "_skip_event", "_start",
                 "max_line_bytes", "max_event_bytes", "problems")

    def __init__(self, max_line_bytes: int = 16 << 20, max_event_bytes: int = 16 << 20) -> None:
        self._buf = bytearray()
        self._blocks: list[bytes] = []  # the pending event's data, joined: its first line, then blocks
        self._tail = bytearray()  # the data after the blocks (from the second line on), being joined
        self._size = 0  # bytes of the pending event's data, joined
        self._name: str | None = None
        self._skip_lf = False
        self._skip_line = False  # dropping the rest of an over-long line
        self._skip_event = False  # dropping the rest of an event that lost bytes
        self._start: bytes | None = b""  # the stream's first bytes, until a UTF-8 BOM can be ruled out
        self.max_line_bytes = max_line_bytes
        self.max_event_bytes = max_event_bytes
        self.problems = 0

    @property
    def overflow(self) -> bool:
        """True once any line or event went over its bound."""
        return self.problems > 0

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Consume one read; return the events it completed (possibly none)."""
        if not chunk:
            return []
        if self._start is not None:  # a leading U+FEFF is not part of the stream (SSE spec)
            head = self._start + chunk
            if len(head) < 3 and _BOM.startswith(head):
                self._start = head
                return []
            self._start = None
            chunk = head[3:] if head.startswith(_BOM) else head
            if not chunk:
                return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if b"\r" in chunk:
            # A trailing CR may be the first half of a CRLF split across reads: treat it as
            # the line end now and drop a LF that starts the next read.
            self._skip_lf = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        events: list[SSEEvent] = []
        end = chunk.rfind(b"\n")
        if end < 0:
            self._hold(chunk, events)
            return events
        if self._skip_line:  # the over-long line ends here
            self._skip_line = False
            first = chunk.find(b"\n")
            block = chunk[first + 1:end]
            lines = block.split(b"\n") if first < end else []
        elif self._buf:
            self._buf += chunk[:end]
            block = bytes(self._buf)
            self._buf.clear()
            lines = block.split(b"\n")
        else:
            lines = chunk[:end].split(b"\n")
        limit = self.max_line_bytes
        for line in lines:
            if len(line) > limit:
                self._lost_line(line[:1], events)
            else:
                self._line(line, events)
        if end + 1 < len(chunk):
            self._hold(chunk[end + 1:], events)
        return events

    def close(self) -> list[SSEEvent]:
        """End of stream: an unterminated last line and a pending event are dispatched."""
        events: list[SSEEvent] = []
        if self._start:  # fewer than three bytes arrived, all a prefix of the BOM
            self._buf += self._start
            self._start = None
        if self._buf and not self._skip_line:
            line = bytes(self._buf)
            self._buf.clear()
            self._line(line, events)
        self._skip_line = False
        self._dispatch(events)
        return events

    @property
    def pending_bytes(self) -> int:
        """Bytes held: an unfinished line plus the pending event's data (both bounded)."""
        return len(self._buf) + self._size

    def held_bytes(self) -> int:
        """Memory the parser holds between reads, object headers and buffer slack included (as
        :func:`sys.getsizeof` counts it): at most ``max_line_bytes * 9 / 8 + max_event_bytes``
        plus about 0.15 % of it and 8 KiB (see ``docs/robustness.md``)."""
        blocks = self._blocks
        return (sys.getsizeof(self._buf) + sys.getsizeof(self._tail) + sys.getsizeof(blocks)
                + sum(map(sys.getsizeof, blocks)))

    # -- internals -------------------------------------------------------------------------

    def _hold(self, rest: bytes, events: list[SSEEvent]) -> None:
        """Keep the start of an unfinished line, unless it is already over the bound."""
        if not rest or self._skip_line:
            return
        if len(self._buf) + len(rest) > self.max_line_bytes:
            head = bytes(self._buf[:1]) or rest[:1]
            self._buf.clear()
            self._skip_line = True
            self._lost_line(head, events)
        else:
            self._buf += rest

    def _lost_line(self, head: bytes, events: list[SSEEvent]) -> None:
        self.problems += 1
        events.append(SSEEvent(None, b"", f"SSE line over {self.max_line_bytes} bytes"))
        if head != b":":  # a field line: its event cannot be known whole
            self._drop_event()

    def _drop_event(self) -> None:
        self._blocks = []
        self._tail = bytearray()
        self._size = 0
        self._skip_event = True

    def _over_event(self, events: list[SSEEvent]) -> None:
        self.problems += 1
        events.append(SSEEvent(None, b"", f"SSE event over {self.max_event_bytes} bytes"))
        self._drop_event()

    def _join(self, value: bytes, events: list[SSEEvent]) -> None:
        """A second or later ``data:`` line: joined to the event's data as it comes."""
        size = self._size + 1 + len(value)
        if size > self.max_event_bytes:
            self._over_event(events)
            return
        self._size = size
        tail = self._tail
        tail += b"\n"
        if len(value) >= _BLOCK:  # a long value is kept as it is, not copied
            self._blocks.append(bytes(tail))
            self._blocks.append(value)
            tail.clear()
            return
        tail += value
        if len(tail) >= _BLOCK:
            self._blocks.append(bytes(tail))
            tail.clear()

    def _line(self, line: bytes, events: list[SSEEvent]) -> None:
        if not line:
            self._dispatch(events)
            return
        if line[0] == 0x3A or self._skip_event:  # ':' comment, or the rest of a dropped event
            return
        field, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            if self._blocks:
                self._join(value, events)
            elif len(value) > self.max_event_bytes:
                self._over_event(events)
            else:
                self._blocks.append(value)
                self._size = len(value)
        elif field == b"event":
            self._name = value.decode("utf-8", "replace")

    def _dispatch(self, events: list[SSEEvent]) -> None:
        blocks = self._blocks
        if blocks:
            tail = self._tail
            if tail:
                data = b"".join((*blocks, tail))
                self._tail = bytearray()
            else:
                data = blocks[0] if len(blocks) == 1 else b"".join(blocks)
            events.append(SSEEvent(self._name, data))
            self._blocks = []
        if self._size or self._skip_event:
            self._size = 0
            self._skip_event = False
        self._name = None
