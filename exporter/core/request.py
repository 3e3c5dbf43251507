"""What a client's request asks for, read cheaply from its raw body.

A request body can be tens of MiB (a long prompt) and is read on the proxy's event loop, so it is
not parsed whole.  :func:`top_level_members` walks the top-level object only, skips every other
member's value (a long string with one ``bytes.find``, a nested array or object bracket by
bracket, iteratively) and decodes just the few members the verdict needs.  For valid JSON the
result equals a full parse (the last of duplicate keys wins, as in ``json.loads``); a scan that
meets something it cannot follow, runs past :data:`SCAN_STEPS` or meets a long string full of
escaped quotes falls back to a full, depth-bounded parse.  A body that is not valid JSON gets whatever the scan could read: the
upstream answers such a body with HTTP 400 whatever the proxy thinks of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from exporter.core.jsondepth import loads, loads_exact

__all__ = ["RequestSpec", "top_level_members", "MAX_MODEL_CHARS", "SCAN_STEPS"]

#: Members read from the request; all others are skipped unread.
WANTED = frozenset({"model", "stream", "stream_options", "ignore_eos", "max_tokens", "max_completion_tokens"})
#: A model name longer than this (characters) is not recorded.
MAX_MODEL_CHARS = 1024
#: Nested tokens the scan walks before it gives up and parses the body whole.
SCAN_STEPS = 50_000
_MAX_MEMBER_BYTES = 64 << 10  # a wanted member's raw value longer than this is ignored
_MAX_ESCAPED_STRING = 256 << 10  # see _string_end

_WS = re.compile(rb"[ \t\n\r]*")
_SCALAR = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null")
_STRUCTURE = re.compile(rb'["\[\]{}]')


class _Unscannable(Exception):
    """The scan cannot follow the body (or ran out of steps): parse it whole instead."""


def _string_end(body: bytes, i: int) -> int:
    """Index after the string that opens at ``body[i] == '"'``.

    Usually one ``find``.  When the first quote found is escaped, a window of the string (from
    its start, growing 4x at a time: linear in the string's length) is copied with every
    escaped backslash and escaped quote blanked out, and its first quote is the end.  A string
    with escaped quotes that runs past :data:`_MAX_ESCAPED_STRING` is left to a full parse
    (orjson is quicker than any pure-Python walk of such a string).
    """
    q = body.find(b'"', i + 1)
    if q < 0:
        raise _Unscannable("unterminated string")
    if body[q - 1] != 0x5C:  # no backslash before it: the end
        return q + 1
    size = 4096
    while True:
        window = body[i + 1:i + 1 + size].replace(b"\\\\", b"__").replace(b'\\"', b"__")
        q = window.find(b'"')
        if q >= 0:
            return i + 2 + q
        if i + 1 + size >= len(body) or size >= _MAX_ESCAPED_STRING:
            raise _Unscannable("unterminated string, or a long one with escaped quotes")
        size *= 4


def _container_end(body: bytes, i: int, steps: list[int]) -> int:
    """Index after the array or object that opens at ``body[i]``, bracket by bracket."""
    depth = 0
    pos = i
    while True:
        steps[0] -= 1
        if steps[0] < 0:
            raise _Unscannable("too many nested tokens")
        match = _STRUCTURE.search(body, pos)
        if match is None:
            raise _Unscannable("unterminated container")
        pos = match.start()
        c = body[pos]
        if c == 0x22:  # '"'
            pos = _string_end(body, pos)
            continue
        pos += 1
        depth += 1 if c in b"[{" else -1
        if depth == 0:
            return pos


def _value_end(body: bytes, i: int, steps: list[int]) -> int:
    c = body[i:i + 1]
    if c == b'"':
        return _string_end(body, i)
    if c in (b"[", b"{"):
        return _container_end(body, i, steps)
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
    if len(raw) > 64:
        return None
    key = loads_exact(raw)
    return key if isinstance(key, str) else None


def _scan(body: bytes) -> dict[str, bytes]:
    """Raw values of the wanted top-level members (the last of duplicates)."""
    steps = [SCAN_STEPS]
    i = _skip_ws(body, 0)
    if body[i:i + 1] != b"{":
        raise _Unscannable("not an object")
    i = _skip_ws(body, i + 1)
    found: dict[str, bytes] = {}
    if body[i:i + 1] == b"}":
        return found
    while True:
        if body[i:i + 1] != b'"':
            raise _Unscannable("expected a key")
        end = _string_end(body, i)
        key = _key(body[i:end])
        i = _skip_ws(body, end)
        if body[i:i + 1] != b":":
            raise _Unscannable("expected ':'")
        i = _skip_ws(body, i + 1)
        end = _value_end(body, i, steps)
        if key in WANTED:
            found[key] = body[i:end]
        i = _skip_ws(body, end)
        c = body[i:i + 1]
        if c == b"}":
            return found
        if c != b",":
            raise _Unscannable("expected ',' or '}'")
        i = _skip_ws(body, i + 1)


def _parsed_members(body: bytes) -> dict[str, Any] | None:
    """The full-parse path; integers as the standard library reads them."""
    try:
        doc = loads(body)
        if isinstance(doc, dict) and any(type(doc.get(k)) is float for k in WANTED):
            doc = loads_exact(body)  # orjson reads an integer over 64 bits as a float
    except ValueError:
        return None
    return {k: v for k, v in doc.items() if k in WANTED} if isinstance(doc, dict) else None


def top_level_members(body: bytes) -> dict[str, Any] | None:
    """The wanted members of the body's top-level object, decoded; None when it is not one."""
    try:
        raw = _scan(body)
    except (_Unscannable, ValueError):
        return _parsed_members(body)
    members: dict[str, Any] = {}
    for key, value in raw.items():
        if len(value) > _MAX_MEMBER_BYTES:
            continue
        try:
            members[key] = loads_exact(value)
        except ValueError:
            continue
    return members


def _positive_int(value: Any) -> int | None:
    return value if type(value) is int and value > 0 else None


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What the client asked for, as far as the verdict and usage injection need it."""

    stream: bool = True
    expected_tokens: int | None = None  # set only when ignore_eos fixes the length
    model: str | None = None  # the request's "model" when a string of at most MAX_MODEL_CHARS
    wants_usage: bool = False  # stream_options.include_usage is true

    @classmethod
    def from_body(cls, body: bytes) -> RequestSpec:
        """Read the spec from a raw request body; any bytes at all give a spec, never an error."""
        members = top_level_members(body) if body else None
        if members is None:
            return cls()
        expected = None
        if members.get("ignore_eos") is True:
            expected = _positive_int(members.get("max_completion_tokens")) or _positive_int(
                members.get("max_tokens"))
        model = members.get("model")
        options = members.get("stream_options")
        return cls(
            stream=members.get("stream") is True,
            expected_tokens=expected,
            model=model if isinstance(model, str) and len(model) <= MAX_MODEL_CHARS else None,
            wants_usage=isinstance(options, dict) and options.get("include_usage") is True,
        )
