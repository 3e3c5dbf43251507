"""Incremental Server-Sent Events parser.

Pure code, no I/O.  Bytes go in as they arrive from the network, complete events come out.
The result does not depend on how the bytes were split into reads: a read may end inside a
UTF-8 character, inside ``\\r\\n`` or inside a field name.  Lines end with ``\\n``, ``\\r\\n``
or ``\\r`` (the SSE grammar); comment lines start with ``:``; ``data:`` may or may not be
followed by one space; several ``data:`` lines of one event are joined with ``\\n``.

A line longer than ``max_line_bytes`` stops the parser (``overflow`` is set) so that memory
stays bounded; the caller judges the stream ``malformed``.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["SSEEvent", "SSEParser"]

_BOM = b"\xef\xbb\xbf"


class SSEEvent(NamedTuple):
    """One dispatched event: the ``event:`` name (or None) and the joined ``data`` bytes."""

    name: str | None
    data: bytes


class SSEParser:
    """Feed bytes with :meth:`feed`, collect events; call :meth:`close` at end of stream."""

    __slots__ = ("_buf", "_data", "_name", "_skip_lf", "_start", "max_line_bytes", "overflow")

    def __init__(self, max_line_bytes: int = 16 << 20) -> None:
        self._buf = bytearray()
        self._data: list[bytes] = []
        self._name: str | None = None
        self._skip_lf = False
        self._start: bytes | None = b""  # the stream's first bytes, until a UTF-8 BOM can be ruled out
        self.max_line_bytes = max_line_bytes
        self.overflow = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Consume one read; return the events it completed (possibly none)."""
        if self.overflow or not chunk:
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
        end = chunk.rfind(b"\n")
        if end < 0:
            self._buf += chunk
            if len(self._buf) > self.max_line_bytes:
                self._overflowed()
            return []
        if self._buf:
            self._buf += chunk[:end]
            block = bytes(self._buf)
            self._buf.clear()
        else:
            block = chunk[:end]
        rest = chunk[end + 1 :]
        if rest:
            self._buf += rest
        events: list[SSEEvent] = []
        for line in block.split(b"\n"):
            if len(line) > self.max_line_bytes:
                self._overflowed()
                return events
            self._line(line, events)
        if len(self._buf) > self.max_line_bytes:
            self._overflowed()
        return events

    def close(self) -> list[SSEEvent]:
        """End of stream: an unterminated last line and a pending event are dispatched."""
        events: list[SSEEvent] = []
        if self.overflow:
            return events
        if self._start:  # fewer than three bytes arrived, all a prefix of the BOM
            self._buf += self._start
            self._start = None
        if self._buf:
            line = bytes(self._buf)
            self._buf.clear()
            self._line(line, events)
        self._dispatch(events)
        return events

    @property
    def pending_bytes(self) -> int:
        """Bytes held for an unfinished line (bounded by ``max_line_bytes``)."""
        return len(self._buf)

    def _overflowed(self) -> None:
        self.overflow = True
        self._buf = bytearray()
        self._data.clear()

    def _line(self, line: bytes, events: list[SSEEvent]) -> None:
        if not line:
            self._dispatch(events)
            return
        if line[0] == 0x3A:  # ':' comment
            return
        field, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            self._data.append(value)
        elif field == b"event":
            self._name = value.decode("utf-8", "replace")

    def _dispatch(self, events: list[SSEEvent]) -> None:
        if self._data:
            data = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
            events.append(SSEEvent(self._name, data))
            self._data = []
        self._name = None
