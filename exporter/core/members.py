"""The few top-level members of a request's JSON body that the proxy reads, read cheaply.

A request body can be tens of MiB (a long prompt) and is read on the proxy's event loop, so it is
not parsed whole.  :func:`top_level_members` walks the top-level object only, skips every other
member's value and decodes just the few members the verdict needs.  Whatever the content, the
work is C-speed (``bytes`` methods; Python only per long token or per chunk of bytes):

- a string: one ``bytes.find``; when it is full of escaped quotes, chunks of it are counted or
  blanked (:func:`~exporter.core.jsondepth.blank_escapes`);
- an array or object: walked token by token while its tokens are long (chat messages), else
  summed in chunks (:func:`~exporter.core.jsondepth.structure_marks`,
  :func:`~exporter.core.jsondepth.low_point`) and the chunk where it ends halved, then walked;
- past :data:`MAX_MEMBERS` top-level members: jumps to where a wanted key could be spelled.

The body is read as the engines read it, by ``json.loads`` of its bytes: UTF-8 (a leading BOM
skipped), or UTF-16 / UTF-32 as :func:`json.detect_encoding` finds them
(:func:`~exporter.core.jsondepth.as_utf8`).  For valid JSON the result equals a full parse (the
last of duplicate keys wins, as in ``json.loads``); a body is parsed whole only when it has more
than :data:`MAX_MEMBERS` top-level members and more than ``_JUMPS`` places to jump to.  A body
that is not valid JSON gets whatever the scan could read, or nothing: the upstream answers such
a body with HTTP 400 whatever the proxy thinks of it.
"""

from __future__ import annotations

import re
from typing import Any

from exporter.core.jsondepth import (
    as_utf8,
    blank_escapes,
    loads_exact,
    low_point,
    safe_cut,
    structure_marks,
)

__all__ = ["WANTED", "POOLING_MEMBERS", "MAX_MEMBERS", "MAX_MEMBER_BYTES", "scanned_members"]

#: Members read from the request; all others are skipped unread.
WANTED = frozenset({"model", "stream", "stream_options", "ignore_eos", "max_tokens", "max_completion_tokens",
                     "return_token_ids", "max_output_tokens", "top_n", "input", "documents"})
#: Wanted members decoded only for the endpoints that need them (a Responses ``input`` is its prompt).
POOLING_MEMBERS = frozenset({"input", "documents"})
#: Top-level members the scan reads one by one before it jumps between possible wanted keys.
MAX_MEMBERS = 1024
# What any spelling of a wanted key contains: its name's start, or an escaped character.
_SPELLINGS = (b"model", b"stream", b"ignore_eos", b"max_", b"return_", b"top_n", b"input", b"documents", b"\\u00")
_JUMP_BACK = 256  # bytes before such a spelling where reading resumes (a wanted key is <= 128)
_JUMP_MEMBERS = 64  # members read after a jump
_JUMPS = 256  # jumps before the body is parsed whole
MAX_MEMBER_BYTES = 64 << 10  # a wanted member's raw value longer than this is ignored
_MAX_KEY_BYTES = 6 * 21 + 2  # the longest wanted key, every character written as an escape
_BATCH = 256  # tokens walked one by one before the walk checks that they are long ...
_MIN_TOKEN_BYTES = 1024  # ... on average this long; if not, the container is summed in chunks
_CHUNK = 1 << 20  # bytes summed at a time (the lowest depth of each chunk is all that is needed)
_EXACT = 2048  # a chunk where the container ends is halved down to this, then walked
_QUOTE_SCANS = 8  # escaped quotes passed one by one before the string is read in chunks
_PIECE = 16 << 10  # the piece of such a string whose escapes are blanked

_WS = re.compile(rb"[ \t\n\r]*")
_SCALAR = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null|NaN|-?Infinity")
_STRUCTURE = re.compile(rb'["\[\]{}]')
_MARKS = (b'"', b"[", b"]", b"{", b"}")
_NEAR = 512  # bytes the regex looks ahead for the next mark; past that, bytes.find
_BACKSLASH_OR_NOT = bytes(0x5C if c == 0x5C else 0x61 for c in range(256))


class _Unscannable(Exception):
    """The body is not a JSON object the scan can follow: not valid JSON."""


def _closing_quote(body: bytes, start: int) -> int:
    """Index of the first unescaped ``"`` at or after ``start`` (``body[start]`` is not escaped).

    Usually one ``find``; a few escaped quotes are passed one by one; past that, the string is
    read in chunks (1 KiB doubling up to 1 MiB): a small one has its escapes blanked
    (:func:`blank_escapes`); in a large one unescaped quotes are first counted in C
    (:func:`_unescaped_quotes`), and only the piece that holds one is blanked.
    """
    pos = start
    for _ in range(_QUOTE_SCANS):
        q = body.find(b'"', pos)
        if q < 0:
            raise _Unscannable("unterminated string")
        if q == pos or body[q - 1] != 0x5C:
            return q
        if body[q - 2] == 0x5C and _backslashes_before(body, pos, q) % 2 == 0:
            return q  # after an even run of backslashes
        pos = q + 1
    size = 1024
    while pos < len(body):
        end = safe_cut(body, pos + size)
        if end - pos <= _PIECE or _unescaped_quotes(body, pos, end):
            q = _first_unescaped(body, pos, end)
            if q >= 0:
                return q
        pos, size = end, min(size * 2, _CHUNK)
    raise _Unscannable("unterminated string")


def _backslashes_before(body: bytes, start: int, q: int) -> int:
    """Length of the run of backslashes that ends at ``q`` and starts at or after ``start``."""
    tail = body[max(start, q - 64):q]
    run = len(tail) - len(tail.rstrip(b"\\"))
    if run < len(tail) or q - 64 <= start:
        return run
    classes = body[start:q].translate(_BACKSLASH_OR_NOT)  # a long run: find where it starts in C
    return q - start - classes.rfind(b"a") - 1


def _unescaped_quotes(body: bytes, start: int, end: int) -> int:
    """How many quotes of ``body[start:end]`` (cut by :func:`safe_cut`) are not escaped: those
    after an even run of backslashes, by inclusion and exclusion of ``\\"``, ``\\\\"`` ...;
    -1 (unknown) when runs are longer than 8."""
    total, sign, needle = 0, 1, b'"'
    while True:
        found = body.count(needle, start, end)
        if not found:
            return total
        if len(needle) > 8:
            return -1
        total, sign, needle = total + sign * found, -sign, b"\\" + needle


def _first_unescaped(body: bytes, pos: int, end: int) -> int:
    """Index of the first unescaped quote in ``body[pos:end]``, or -1, a piece at a time."""
    if end - pos <= _PIECE:
        q = blank_escapes(body[pos:end]).find(b'"')
        return pos + q if q >= 0 else -1
    while pos < end:
        cut = min(safe_cut(body, pos + _PIECE), end)
        if _unescaped_quotes(body, pos, cut):
            q = blank_escapes(body[pos:cut]).find(b'"')
            if q >= 0:
                return pos + q
        pos = cut
    return -1


def _walk(body: bytes, pos: int, depth: int, tokens: int) -> tuple[int, int]:
    """Walk up to ``tokens`` strings and brackets from ``pos`` (outside strings) at nesting
    ``depth``; ``(pos, 0)`` just after the bracket that closes the container, else where it stopped."""
    search = _STRUCTURE.search
    ahead = [-1] * len(_MARKS)
    for _ in range(tokens):
        match = search(body, pos, pos + _NEAR)
        pos = match.start() if match else _next_mark(body, pos, ahead)
        c = body[pos]
        if c == 0x22:  # '"'
            q = body.find(b'"', pos + 1)
            pos = (q if q > pos + 1 and body[q - 1] != 0x5C else _closing_quote(body, pos + 1)) + 1
            continue
        pos += 1
        depth += 1 if c in b"[{" else -1
        if depth == 0:
            return pos, 0
    return pos, depth


def _next_mark(body: bytes, pos: int, ahead: list[int]) -> int:
    """Index of the next quote or bracket at or after ``pos``, far away: one ``find`` per kind,
    kept in ``ahead`` until passed (so a walk finds each kind's places once)."""
    for kind, place in enumerate(ahead):
        if place < pos:
            found = body.find(_MARKS[kind], pos)
            ahead[kind] = found if found >= 0 else len(body)
    nearest = min(ahead)
    if nearest >= len(body):
        raise _Unscannable("unterminated container")
    return nearest


def _summed_end(body: bytes, pos: int, depth: int) -> int:
    """Index after the container being walked (at ``pos``, outside strings, nesting ``depth``):
    chunks of the body are summed by :func:`structure_marks` until one reaches depth 0."""
    in_string = False
    while pos < len(body):
        end = safe_cut(body, pos + _CHUNK)
        brackets, ends_in_string = structure_marks(body[pos:end], in_string)
        net, low = low_point(brackets)
        if depth + low <= 0:
            return _end_within(body, pos, end, depth, in_string)
        pos, depth, in_string = end, depth + net, ends_in_string
    raise _Unscannable("unterminated container")


def _end_within(body: bytes, pos: int, end: int, depth: int, in_string: bool) -> int:
    """Index after the container that ends in ``body[pos:end]``: halved down to :data:`_EXACT`
    bytes, which are walked."""
    while end - pos > _EXACT:
        half = safe_cut(body, (pos + end) // 2)
        if half >= end:
            break
        brackets, ends_in_string = structure_marks(body[pos:half], in_string)
        net, low = low_point(brackets)
        if depth + low <= 0:
            end = half
        else:
            pos, depth, in_string = half, depth + net, ends_in_string
    if in_string:
        pos = _closing_quote(body, pos) + 1
    pos, depth = _walk(body, pos, depth, end - pos + 1)
    if depth:
        raise _Unscannable("brackets and walk disagree")  # only on invalid JSON
    return pos


def _close(body: bytes, pos: int, depth: int) -> int:
    """Index just after the bracket that takes the nesting from ``depth`` to 0 (``pos`` outside
    strings; ``depth`` 0 at an opening bracket): walked while the tokens are long, else summed."""
    while True:
        start = pos
        pos, depth = _walk(body, pos, depth, _BATCH)
        if depth == 0:
            return pos
        if pos - start < _BATCH * _MIN_TOKEN_BYTES:
            return _summed_end(body, pos, depth)


def _value_end(body: bytes, i: int) -> int:
    c = body[i:i + 1]
    if c == b'"':
        return _closing_quote(body, i + 1) + 1
    if c in (b"[", b"{"):
        return _close(body, i, 0)
    match = _SCALAR.match(body, i)
    if match is None:
        raise _Unscannable("not a JSON value")
    return match.end()


def _skip_ws(body: bytes, i: int) -> int:
    match = _WS.match(body, i)
    return match.end() if match else i


def _key(raw: bytes) -> str | None:
    if b"\\" not in raw:
        return raw[1:-1].decode("utf-8", "replace")
    if len(raw) > _MAX_KEY_BYTES:
        return None
    key = loads_exact(raw)
    return key if isinstance(key, str) else None


class _TooWide(Exception):
    """Too many top-level members, and too many places where a wanted one could be."""


def _members(body: bytes, i: int, found: dict[str, bytes], count: int) -> int | None:
    """Read up to ``count`` members from the key at ``i`` into ``found``; the index of the next
    key, or None after the closing brace."""
    for _ in range(count):
        if body[i:i + 1] != b'"':
            raise _Unscannable("expected a key")
        end = _closing_quote(body, i + 1) + 1
        key = _key(body[i:end])
        i = _skip_ws(body, end)
        if body[i:i + 1] != b":":
            raise _Unscannable("expected ':'")
        i = _skip_ws(body, i + 1)
        end = _value_end(body, i)
        if key in WANTED:
            found[key] = body[i:end]
        i = _skip_ws(body, end)
        c = body[i:i + 1]
        if c == b"}":
            return None
        if c != b",":
            raise _Unscannable("expected ',' or '}'")
        i = _skip_ws(body, i + 1)
    return i


def _scan(body: bytes) -> dict[str, bytes]:
    """Raw values of the wanted top-level members (the last of duplicates).

    After :data:`MAX_MEMBERS` members the scan jumps: to a little before the next place where a
    wanted key could be spelled (:data:`_SPELLINGS`), the stretch in between summed in C, and
    reads a few members from there; after :data:`_JUMPS` such places the body is parsed whole.
    """
    i = _skip_ws(body, 0)
    if body[i:i + 1] != b"{":
        raise _Unscannable("not an object")
    i = _skip_ws(body, i + 1)
    found: dict[str, bytes] = {}
    if body[i:i + 1] == b"}":
        return found
    at: int | None = _members(body, i, found, MAX_MEMBERS)
    nearest = dict.fromkeys(_SPELLINGS, 0)  # the next place of each spelling; -1: none further
    for _ in range(_JUMPS):
        if at is None:
            return found
        for spelling, p in nearest.items():
            if 0 <= p < at:
                nearest[spelling] = body.find(spelling, at)
        ahead = [p for p in nearest.values() if p >= 0]
        if not ahead:
            return found  # no wanted key further on
        at = _key_near(body, at, min(ahead) - _JUMP_BACK)
        at = None if at is None else _members(body, at, found, _JUMP_MEMBERS)
    raise _TooWide


def _key_near(body: bytes, at: int, target: int) -> int | None:
    """The first key at or after ``target`` (or after ``at``, a key, when ``target`` is before
    it); None after the closing brace.  ``body[at:target]`` is summed, not read."""
    if target <= at:
        return at
    depth, in_string, cut = 1, False, at
    while cut < target:  # a chunk at a time, so that no copy is larger than _CHUNK
        start, cut = cut, safe_cut(body, min(cut + _CHUNK, target))
        brackets, in_string = structure_marks(body[start:cut], in_string)
        depth += low_point(brackets)[0]
    pos = _closing_quote(body, cut) + 1 if in_string else cut
    if depth > 1:
        pos = _close(body, pos, depth - 1)
    elif depth < 1:
        return None  # the object closed before: what follows is not JSON
    while True:  # at depth 1, between tokens or inside a number or literal
        match = _STRUCTURE.search(body, pos)
        if match is None:
            raise _Unscannable("unterminated object")
        pos = match.start()
        c = body[pos]
        if c == 0x22:
            end = _closing_quote(body, pos + 1) + 1
            after = _skip_ws(body, end)
            if body[after:after + 1] == b":":
                return pos
            pos = end
        elif c in b"[{":
            pos = _close(body, pos, 0)
        else:
            return None


def _parsed_members(body: bytes) -> dict[str, Any] | None:
    """The full-parse path (rare: see :func:`_scan`), by the standard library: exact integers
    at any depth, where orjson would read one over 64 bits as a float."""
    try:
        doc = loads_exact(body, errors="surrogatepass")
    except ValueError:
        return None
    return {k: v for k, v in doc.items() if k in WANTED} if isinstance(doc, dict) else None


def scanned_members(body: bytes, skip: frozenset[str] = frozenset()) -> dict[str, Any] | None:
    """The wanted members of the body's top-level object, decoded (but those in ``skip``), by the
    scan; None when it is not one."""
    text = as_utf8(body)
    if text is None:
        return None
    body = text
    try:
        raw = _scan(body)
    except _TooWide:
        return _parsed_members(body)
    except (_Unscannable, ValueError):  # not a JSON object: a full parse would not read one either
        return None
    members: dict[str, Any] = {}
    for key, value in raw.items():
        if len(value) > MAX_MEMBER_BYTES or key in skip:
            continue
        try:
            members[key] = loads_exact(value, errors="surrogatepass")
        except ValueError:
            continue
    return members
