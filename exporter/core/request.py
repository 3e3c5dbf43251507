"""What a client's request asks for, read cheaply from its raw body (:mod:`exporter.core.members`
reads the few top-level members it needs, never the prompt)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exporter.core.endpoints import POOLING, fixed_length, pooling_counts
from exporter.core.jsondepth import MAX_DEPTH, loads_quick, nesting_depth_exceeds
from exporter.core.members import MAX_MEMBER_BYTES, MAX_MEMBERS, POOLING_MEMBERS, WANTED, scanned_members

__all__ = ["MAX_MEMBERS", "MAX_MODEL_CHARS", "RequestSpec", "WANTED", "top_level_members", "scanned_members"]

#: A model name longer than this (characters) is not recorded.
MAX_MODEL_CHARS = 1024
#: a body up to this size is parsed whole by orjson (none of its members can be over MAX_MEMBER_BYTES)
QUICK_BYTES = MAX_MEMBER_BYTES


def _has_float(value: Any) -> bool:
    """A float anywhere in ``value`` (walked with a list, not recursion: members nest up to
    :data:`MAX_DEPTH`)."""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, float):
            return True
        if isinstance(v, dict):
            todo.extend(v.values())
        elif isinstance(v, list):
            todo.extend(v)
    return False


def _quick_members(body: bytes, skip: frozenset[str]) -> dict[str, Any] | None:
    """A small body's wanted members from orjson's whole parse, where that reading is surely the
    scan's (a valid UTF-8 object no deeper than :data:`MAX_DEPTH`, no wanted member over
    ``MAX_MEMBER_BYTES``, no float in a wanted member: orjson reads an integer over 64 bits as
    one); None: the scan decides."""
    if len(body) > QUICK_BYTES or (len(body) > MAX_DEPTH and nesting_depth_exceeds(body, MAX_DEPTH)):
        return None
    try:
        doc = loads_quick(body)
    except ValueError:  # NaN, a lone surrogate, a BOM, UTF-16, invalid: the scan's reading
        return None
    if not isinstance(doc, dict):
        return None
    members = {k: v for k, v in doc.items() if k in WANTED and k not in skip}
    return None if any(_has_float(v) for v in members.values()) else members


def top_level_members(body: bytes, skip: frozenset[str] = frozenset()) -> dict[str, Any] | None:
    """The wanted members of the body's top-level object, decoded (but those in ``skip``); None when
    it is not one."""
    quick = _quick_members(body, skip)
    return quick if quick is not None else scanned_members(body, skip)


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What the client asked for, as far as the verdict and usage injection need it."""

    stream: bool = True
    expected_tokens: int | None = None  # set only when ignore_eos fixes the length
    model: str | None = None  # the request's "model" when a string of at most MAX_MODEL_CHARS
    wants_usage: bool = False  # stream_options.include_usage is true
    endpoint: str = "completions"  # exporter.core.endpoints.ENDPOINTS' names
    inputs: int | None = None  # embeddings: inputs; rerank: documents (None: not told, or over 64 KiB)
    top_n: int | None = None  # rerank: the results asked

    @classmethod
    def from_body(cls, body: bytes, endpoint: str = "completions") -> RequestSpec:
        """Read the spec from a raw request body; any bytes at all give a spec, never an error."""
        pooling = endpoint in POOLING
        members = top_level_members(body, frozenset() if pooling else POOLING_MEMBERS) if body else None
        if members is None:
            return cls(endpoint=endpoint, stream=not pooling)
        model = members.get("model")
        options = members.get("stream_options")
        inputs, top_n = pooling_counts(endpoint, members)
        return cls(
            stream=members.get("stream") is True and not pooling,
            expected_tokens=fixed_length(endpoint, members),
            model=model if isinstance(model, str) and len(model) <= MAX_MODEL_CHARS else None,
            wants_usage=isinstance(options, dict) and options.get("include_usage") is True,
            endpoint=endpoint, inputs=inputs, top_n=top_n,
        )
