"""JSON from the network, parsed with bounded nesting and one meaning with or without orjson.

Every document the core parses (an SSE event's data, a non-streaming body, a value of a client's
request) comes from outside.  :func:`loads` refuses a document nested deeper than
:data:`MAX_DEPTH` before any parser sees it, so neither parser recurses without bound (the
standard library's would raise ``RecursionError`` near 1,000 levels, orjson stops at 1,024), and
both judge the same documents invalid.  Where orjson and the standard library would read a valid
document differently (integers over 64 bits become floats in orjson; NaN, Infinity and lone
surrogates orjson refuses), the standard library's reading is the meaning: :func:`loads` falls
back to it on refusal, and callers that need exact integers use :func:`loads_exact`.

The depth check, and the request scan's skipping of large values, read structure at C speed
with ``bytes`` methods only: :func:`blank_escapes` hides escaped quotes, :func:`structure_marks`
keeps the brackets that stand outside strings, :func:`low_point` sums them, and
:func:`safe_cut` cuts a body into chunks without splitting an escape.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate, repeat
from operator import mul, sub
from types import ModuleType
from typing import Any

__all__ = [
    "MAX_DEPTH",
    "as_utf8",
    "blank_escapes",
    "json_encoding",
    "loads",
    "loads_exact",
    "low_point",
    "nesting_depth_exceeds",
    "loads_quick",
    "safe_cut",
    "structure_marks",
]

#: Deepest nesting accepted: far beyond any engine's output (about 6), far below a recursion limit.
MAX_DEPTH = 512

_orjson: ModuleType | None
try:  # a regular dependency; about 5x quicker per event than the standard library
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the install
    _orjson = None

_NOT_MARK = bytes(b for b in range(256) if b not in b'"[]{}')  # deleted: all but quotes and brackets
_AS_BRACKETS = bytes.maketrans(b"{}", b"[]")
_FLIPPED = bytes.maketrans(b"[]", b"][")
_BACKSLASHES = re.compile(rb"\\*")
# Balanced blocks removed in one round of low_point (each keeps the lowest depth where it stands).
_BLOCKS = (b"[" * 16 + b"]" * 16, b"[[[[]]]]", b"[]")


def safe_cut(data: bytes, i: int) -> int:
    """``i``, or just past the run of backslashes (and the byte it may escape) that ``i`` falls in:
    a cut there leaves every escape whole on one side, and the byte after it unescaped."""
    if i >= len(data):
        return len(data)
    if i <= 0 or data[i - 1] != 0x5C:
        return max(i, 0)
    run = _BACKSLASHES.match(data, i)
    return min((run.end() if run else i) + 1, len(data))


def blank_escapes(data: bytes) -> bytes:
    """``data`` with every escaped backslash and escaped quote overwritten by ``_`` (same
    length), so that its quotes are the unescaped ones.  ``data`` must come from
    :func:`safe_cut` boundaries.  Costs one ``bytes.replace`` match per escape."""
    if b"\\" not in data:
        return data
    return data.replace(b"\\\\", b"__").replace(b'\\"', b"__")


def structure_marks(data: bytes, in_string: bool = False) -> tuple[bytes, bool]:
    """The brackets of ``data`` that stand outside strings (``{}`` written as ``[]``), and whether
    ``data`` ends inside a string.  ``in_string``: it starts inside one.  ``data`` must come
    from :func:`safe_cut` boundaries.  C-speed: a few passes of bytes methods, whatever the
    content; the cost per escape or per string is that of one match of ``bytes.replace`` or
    ``bytes.split``, and only strings that contain brackets cost the latter."""
    marks = blank_escapes(data).translate(None, _NOT_MARK)  # other escapes do no harm
    if in_string:
        marks = b'"' + marks
    if b'"' in marks:
        marks = marks.replace(b'""', b"")  # an empty stretch between two quotes, inside or out
        if b'"' in marks:
            pieces = marks.split(b'"')
            return b"".join(pieces[::2]).translate(_AS_BRACKETS), len(pieces) % 2 == 0
    return marks.translate(_AS_BRACKETS), False


def low_point(brackets: bytes) -> tuple[int, int]:
    """``(net, low)`` of a sequence of ``[`` and ``]``: the depth it ends at and the lowest depth
    it reaches (``<= 0``), starting from 0.  Balanced blocks are removed first (at most 8
    rounds of ``bytes.replace``), then the remaining runs are summed in C iterators."""
    for _ in range(8):
        valleys = brackets.count(b"][")
        if valleys < 4096 or valleys < len(brackets) >> 6:
            break
        for block in _BLOCKS:
            brackets = brackets.replace(block, b"")
    runs = brackets.split(b"][")  # each run is '['*a + ']'*b; between runs the depth dips by one
    twice_opens = map(mul, map(bytes.count, runs, repeat(b"[")), repeat(2))
    depths = list(accumulate(map(sub, twice_opens, map(len, runs))))
    return depths[-1], min(0, depths[-1], min(depths[:-1], default=1) - 1)


def nesting_depth_exceeds(data: bytes, limit: int = MAX_DEPTH) -> bool:
    """True when the brackets outside strings nest deeper than ``limit``.

    Cheap for ordinary documents: with at most ``limit`` opening brackets in all, no scan is
    needed.  Otherwise C-speed (:func:`structure_marks`, :func:`low_point`), whatever the
    content.  Unbalanced input is judged by its brackets as they stand; it is invalid JSON
    either way.
    """
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    brackets, _ = structure_marks(data)
    return -low_point(brackets.translate(_FLIPPED))[1] > limit


def json_encoding(body: bytes) -> str:
    """The encoding ``json.loads`` reads ``body`` in (:func:`json.detect_encoding`): ``utf-8``,
    ``utf-8-sig`` (a BOM), or a UTF-16 / UTF-32 codec."""
    if body[:1] == b"{" and body[1:2] != b"\x00":  # what nearly every request looks like
        return "utf-8"
    return json.detect_encoding(body)


def as_utf8(body: bytes) -> bytes | None:
    """The body in UTF-8 as ``json.loads`` of bytes reads it: the body itself, without its UTF-8
    BOM, or converted from UTF-16 / UTF-32; None when it does not decode."""
    encoding = json_encoding(body)
    if encoding == "utf-8":
        return body
    if encoding == "utf-8-sig":
        return body[3:]
    try:
        return body.decode(encoding, "surrogatepass").encode("utf-8", "surrogatepass")
    except UnicodeError:
        return None


def loads_exact(data: bytes, max_depth: int = MAX_DEPTH, errors: str = "strict") -> Any:
    """The standard library's reading (exact integers), depth-bounded; ValueError when invalid.

    ``errors="surrogatepass"`` reads UTF-8-encoded lone surrogates as ``json.loads`` of bytes
    does (a request's reading, as the engines parse it)."""
    if nesting_depth_exceeds(data, max_depth):
        raise ValueError(f"JSON nested deeper than {max_depth} levels")
    try:
        return json.loads(data.decode("utf-8", errors))
    except RecursionError as exc:  # not reached below MAX_DEPTH; kept so no input can escape
        raise ValueError("JSON nested too deep") from exc


def loads_quick(data: bytes) -> Any:
    """orjson's reading, no fallback: ValueError where orjson refuses the document or is not
    installed.  The caller decides whether orjson's reading is the meaning (:func:`loads`)."""
    if _orjson is None:
        raise ValueError("orjson is not installed")
    return _orjson.loads(data)  # orjson.JSONDecodeError is a ValueError


def loads(data: bytes, max_depth: int = MAX_DEPTH) -> Any:
    """Parse one document: orjson when installed, the standard library for what orjson refuses.

    Raises ValueError (UnicodeDecodeError is one) for invalid or too deeply nested input.
    Integers over 64 bits come back as floats from orjson: use :func:`loads_exact` where a
    float in an integer field would change a verdict.
    """
    # cheap bounds first (this runs once per SSE event): depth <= length <= brackets
    if len(data) > max_depth and nesting_depth_exceeds(data, max_depth):
        raise ValueError(f"JSON nested deeper than {max_depth} levels")
    if _orjson is not None:
        try:
            return _orjson.loads(data)
        except _orjson.JSONDecodeError:
            pass
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError as exc:
        raise ValueError("JSON nested too deep") from exc
