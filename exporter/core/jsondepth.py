"""JSON from the network, parsed with bounded nesting and one meaning with or without orjson.

Every document the core parses (an SSE event's data, a non-streaming body, a value of a client's
request) comes from outside.  :func:`loads` refuses a document nested deeper than
:data:`MAX_DEPTH` before any parser sees it, so neither parser recurses without bound (the
standard library's would raise ``RecursionError`` near 1,000 levels, orjson stops at 1,024), and
both judge the same documents invalid.  Where orjson and the standard library would read a valid
document differently (integers over 64 bits become floats in orjson; NaN, Infinity and lone
surrogates orjson refuses), the standard library's reading is the meaning: :func:`loads` falls
back to it on refusal, and callers that need exact integers use :func:`loads_exact`.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate, count
from operator import sub
from types import ModuleType
from typing import Any

__all__ = ["MAX_DEPTH", "loads", "loads_exact", "nesting_depth_exceeds"]

#: Deepest nesting accepted: far beyond any engine's output (about 6), far below a recursion limit.
MAX_DEPTH = 512

_orjson: ModuleType | None
try:  # a regular dependency; about 5x quicker per event than the standard library
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the install
    _orjson = None

# Bytes that are neither brackets nor quotes, deleted before counting depth.
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
_QUOTED = re.compile(rb'"[^"]*"')
# After the deletion: an opening bracket counts 2, a closing one 0 (depth = 2*opens - position).
_STEP = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")


def nesting_depth_exceeds(data: bytes, limit: int = MAX_DEPTH) -> bool:
    """True when the brackets outside strings nest deeper than ``limit``.

    Cheap for ordinary documents: with at most ``limit`` opening brackets in all, no scan is
    needed.  Otherwise escapes and strings are removed and the depth is accumulated in C
    iterators (linear in the number of brackets).  Unbalanced input is judged by its brackets
    as they stand; it is invalid JSON either way.
    """
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    bare = data.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    brackets = _QUOTED.sub(b"", bare).replace(b'"', b"").translate(_STEP)
    if not brackets:
        return False
    return max(map(sub, accumulate(brackets), count(1))) > limit


def loads_exact(data: bytes, max_depth: int = MAX_DEPTH) -> Any:
    """The standard library's reading (exact integers), depth-bounded; ValueError when invalid."""
    if nesting_depth_exceeds(data, max_depth):
        raise ValueError(f"JSON nested deeper than {max_depth} levels")
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError as exc:  # not reached below MAX_DEPTH; kept so no input can escape
        raise ValueError("JSON nested too deep") from exc


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
