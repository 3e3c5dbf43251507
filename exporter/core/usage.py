"""Usage for clients that do not ask for it, and the engine's output token ids.

:func:`inject_usage` adds ``stream_options.include_usage = true`` to a streaming request that
lacks it, without re-serializing the body (:func:`ask_token_ids` adds vLLM's
``return_token_ids: true`` the same way); :class:`UsageEventFilter` then leaves the
usage-only event out of what the client receives and passes every other byte unchanged.
Both are pure and incremental; neither holds more than one event.
"""

from __future__ import annotations

import json
import sys

from exporter.core.jsondepth import json_encoding, loads
from exporter.core.request import RequestSpec, top_level_members

__all__ = ["inject_usage", "ask_token_ids", "append_member", "UsageEventFilter", "is_usage_only"]

_WS = b" \t\r\n"
_BOM = b"\xef\xbb\xbf"
#: What the filter counts for each held line beyond its bytes: the object's header and list slot.
LINE_COST = sys.getsizeof(b"") + 16


def inject_usage(body: bytes, spec: RequestSpec) -> bytes | None:
    """The body with ``stream_options.include_usage = true`` for a streaming request that does
    not ask for usage; None when nothing is to be added (not streaming, already asked, not a
    completions or chat request, or not a JSON object whose ``stream_options`` is an object or
    missing).

    The new member is appended before the body's final ``}``: one copy of the body, no
    re-serialization.  The body then holds ``stream_options`` twice when the client sent it
    with ``include_usage`` false or absent; the last one wins.  vLLM
    (``vllm/entrypoints/openai/api_server.py``, ``create_completion(request: CompletionRequest,
    raw_request)``) and SGLang (``sglang/srt/entrypoints/http_server.py``,
    ``openai_v1_completions(request: CompletionRequest, raw_request)``) both take the body as
    a pydantic model parameter of a FastAPI route; FastAPI decodes it with the standard
    library's ``json.loads`` (Starlette's ``Request.json``), whose dict keeps the last
    duplicate key, before pydantic validates it.  The other keys of the client's
    ``stream_options`` are copied into the new one.
    """
    if not spec.stream or spec.wants_usage or spec.endpoint not in ("completions", "chat"):
        return None  # Responses and Messages streams carry their usage in their own events
    members = _members(body)
    if members is None:
        return None
    options = members.get("stream_options")
    if options is not None and not isinstance(options, dict):
        return None
    return append_member(body, "stream_options", {**(options or {}), "include_usage": True})


def ask_token_ids(body: bytes) -> bytes | None:
    """The body with ``return_token_ids: true`` (vLLM: each choice then carries its output token
    ids); None when the client asked already or the body is not a UTF-8 JSON object."""
    members = _members(body)
    if members is None or members.get("return_token_ids") is True:
        return None
    return append_member(body, "return_token_ids", True)


def _members(body: bytes) -> dict[str, object] | None:
    if json_encoding(body) not in ("utf-8", "utf-8-sig"):
        return None  # (a UTF-16 or UTF-32 body would need the member in its own encoding)
    return top_level_members(body)


def append_member(body: bytes, name: str, value: object) -> bytes | None:
    """``body`` (a JSON object) with ``"name": value`` appended before its final ``}``: one copy,
    no re-serialization (a duplicate key's last value wins, as the engines decode JSON); None
    when the body does not end with ``}``."""
    end = len(body)
    while end and body[end - 1] in _WS:
        end -= 1
    if not end or body[end - 1] != 0x7D:  # '}'
        return None
    inner = end - 1
    while inner and body[inner - 1] in _WS:
        inner -= 1
    sep = b"" if inner and body[inner - 1] == 0x7B else b","  # '{': an empty object
    member = json.dumps(name).encode() + b":" + json.dumps(value, separators=(",", ":")).encode()
    return b"".join((body[:end - 1], sep, member, body[end - 1:]))


def is_usage_only(data: bytes) -> bool:
    """An event's data is a usage-only chunk: a JSON object with ``choices == []`` and a
    ``usage`` object."""
    try:
        doc = loads(data)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("choices") == [] and isinstance(doc.get("usage"), dict)


def _is_usage_event(lines: list[bytes]) -> bool:
    """The lines of one event (terminators included) form a usage-only event without a name."""
    data: list[bytes] = []
    for line in lines:
        line = line.rstrip(b"\r\n")
        if line[:1] == b":":
            continue
        field, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if field == b"event":
            return False
        if field == b"data":
            data.append(value)
    return bool(data) and _is_usage_data(b"\n".join(data))


def _is_usage_data(data: bytes) -> bool:
    """:func:`is_usage_only`, parsed only where the bytes name a ``"usage"`` member at all (nearly
    every event of a stream names none: its JSON is not read twice).  An engine that wrote the key
    with escapes would have its usage chunk pass through, not be cut."""
    return b'"usage"' in data and is_usage_only(data)


class UsageEventFilter:
    """Pass an SSE stream through, leaving out the usage-only events.

    :meth:`feed` returns the bytes to send the client now; :meth:`flush`, at the end of the
    stream, the rest.  Dropped are exactly the events whose data is a usage-only chunk (see
    :func:`is_usage_only`) and that carry no ``event:`` name: their field lines and their
    terminating blank line.  Every other byte passes unchanged and in order: comment lines
    (also those inside a dropped event), other events, ``[DONE]``, blank lines, line endings
    ``\\n``, ``\\r\\n`` and ``\\r`` (also a CRLF split across reads), a leading BOM.  Bytes are
    held only while they may belong to a usage-only event: the current event, at most
    ``max_event_bytes`` of memory (its lines as received, terminators included, plus
    :data:`LINE_COST` per line; the blank line that ends it is not held); past that the event
    passes through unjudged.  A comment line before the event's first field line is never held:
    it goes out as it comes and does not count.  The output does not depend on how the stream
    is split into reads.
    """

    __slots__ = ("_max", "_line", "_line_len", "_line_out", "_block", "_size", "_passing", "_cr_dest",
                 "_start")

    def __init__(self, max_event_bytes: int = 16 << 20) -> None:
        self._max = max_event_bytes
        self._line = bytearray()  # the current line's bytes not yet placed
        self._line_len = 0  # bytes of the current line before its terminator, placed or not
        self._line_out = False  # the current line is a comment before any held line: it goes out
        self._block: list[bytes] = []  # held lines of the current event, terminators included
        self._size = 0
        self._passing = False  # the current event is too big to hold: it passes through
        self._cr_dest: str | None = None  # where a line that ended in a read-final CR went
        self._start: bytes | None = b""  # the stream's first bytes until a BOM is ruled out

    def feed(self, data: bytes) -> bytes:
        if (self._start is None and self._cr_dest is None and not self._passing and not self._block
                and not self._line and not self._line_len and data.endswith(b"\n\n")):
            whole = self._whole_events(data)
            if whole is not None:
                return whole
        out = bytearray()
        if self._start is not None:
            head = self._start + data
            if len(head) < 3 and _BOM.startswith(head):
                self._start = head
                return b""
            self._start = None
            if head.startswith(_BOM):
                out += _BOM
                head = head[3:]
            data = head
        if self._cr_dest is not None and data:
            if data[:1] == b"\n":  # the second half of a CRLF: it goes where its line went
                self._place_lf(out)
                data = data[1:]
            self._cr_dest = None
        pos = 0
        n = len(data)
        cr = data.find(b"\r")
        lf = data.find(b"\n")
        while pos < n:
            if 0 <= cr < pos:
                cr = data.find(b"\r", pos)
            if 0 <= lf < pos:
                lf = data.find(b"\n", pos)
            if cr < 0 and lf < 0:
                self._partial(data[pos:], out)
                break
            if cr < 0 or 0 <= lf < cr:
                end = lf + 1
            elif cr + 1 < n:
                end = cr + 2 if data[cr + 1] == 0x0A else cr + 1
            else:  # a CR that ends the read: its LF may come next
                end = cr + 1
                self._cr_dest = "pending"
            self._partial(data[pos:end], out, complete=True)
            pos = end
        return bytes(out)

    def flush(self) -> bytes:
        out = bytearray()
        if self._start:
            out += self._start
            self._start = None
        if self._line_len:
            self._end_line(out)
        if self._block:
            self._end_event(out)
        self._reset()
        return bytes(out)

    def held_bytes(self) -> int:
        """Memory held between reads, object headers and buffer slack included (as
        :func:`sys.getsizeof` counts it): at most ``max_event_bytes`` plus an eighth of the
        current line (a growing buffer's slack) and a few hundred bytes."""
        block = self._block
        return sys.getsizeof(self._line) + sys.getsizeof(block) + sum(map(sys.getsizeof, block))

    # -- internals -------------------------------------------------------------------------

    def _whole_events(self, data: bytes) -> bytes | None:
        """What :meth:`feed` gives for a read of whole events of one ``data: `` line each (LF line
        ends, each within the bound), as an engine streams them, with no line pending: the read
        without its usage-only events; None for anything else (the line by line path, same result)."""
        if b"\r" in data:
            return None
        events = data[:-2].split(b"\n\n")
        limit = self._max - LINE_COST - 1
        for event in events:
            if event[:6] != b"data: " or b"\n" in event or len(event) > limit:
                return None
        kept = [event for event in events if not _is_usage_data(event[6:])]
        if len(kept) == len(events):
            return data
        return b"".join(event + b"\n\n" for event in kept)

    def _reset(self) -> None:
        self._block = []
        self._size = 0
        self._passing = False

    def _let_through(self, out: bytearray) -> None:
        """The current event is too big to hold: what is held goes out, the rest passes."""
        out += b"".join(self._block)
        out += self._line
        self._line.clear()
        self._block = []
        self._passing = True

    def _place_lf(self, out: bytearray) -> None:
        if self._cr_dest == "out":
            out += b"\n"
        elif self._cr_dest == "held" and self._block:
            self._block[-1] += b"\n"
            self._size += 1  # counted as if it had come with its CR: the split changes nothing
            if self._size > self._max:
                self._let_through(out)

    def _partial(self, piece: bytes, out: bytearray, complete: bool = False) -> None:
        """Bytes of the current line; ``complete`` when they end with its terminator."""
        if not (self._line_len or self._line or self._block) and piece[:1] == b":":
            self._line_out = True  # its first byte: a comment that starts no event is not held
        self._line_len += len(piece.rstrip(b"\r\n")) if complete else len(piece)
        if self._passing or self._line_out:
            out += piece
        else:
            self._line += piece
            if self._line_len and self._size + len(self._line) + LINE_COST > self._max:
                self._let_through(out)  # too big to judge (a blank line is never held)
        if complete:
            self._end_line(out)

    def _end_line(self, out: bytearray) -> None:
        line = bytes(self._line)
        blank = self._line_len == 0
        self._line.clear()
        self._line_len = 0
        dest = "out"
        if self._line_out:
            self._line_out = False  # (already out)
        elif self._passing:
            if blank:
                self._reset()
        elif blank:
            dest = self._end_event(out, line)
        else:
            self._block.append(line)
            self._size += len(line) + LINE_COST
            dest = "held"
        if self._cr_dest == "pending":
            self._cr_dest = dest

    def _end_event(self, out: bytearray, blank: bytes = b"") -> str:
        """The current event is complete: drop it (keeping its comments) or pass it."""
        block = self._block
        self._reset()
        if block and _is_usage_event(block):
            out += b"".join(line for line in block if line[:1] == b":")
            return "drop"
        out += b"".join(block)
        out += blank
        return "out"
