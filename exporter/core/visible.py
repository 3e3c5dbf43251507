"""What one parsed document says: visible text, usage, an error.

Every function here looks a fixed number of levels into the document and never recurses into
what the upstream sent, so any parsed JSON (however nested) gives an answer in bounded time
and stack.
"""

from __future__ import annotations

import reprlib
from typing import Any

__all__ = ["visible_chars", "usage_tokens", "cached_tokens", "error_message", "has_float_tokens"]

_SHORT = reprlib.Repr()
_SHORT.maxlevel = 2
_SHORT.maxstring = 200
_SHORT.maxother = 200


def _text_len(value: Any) -> int:
    """A string, or a list of content parts ``[{"type": "text", "text": "..."}]``."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(len(t) for p in value if isinstance(p, dict) and isinstance(t := p.get("text"), str))
    return 0


def _message_chars(msg: dict[str, Any]) -> int:
    n = _text_len(msg.get("content"))
    reasoning = msg.get("reasoning")
    reasoning_content = msg.get("reasoning_content")
    n += _text_len(reasoning)
    # Some servers send both spellings with the same text: count it once.  Only strings are
    # compared, so the comparison never walks a nested structure.
    if not (isinstance(reasoning_content, str) and reasoning_content == reasoning):
        n += _text_len(reasoning_content)
    calls = msg.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                n += _text_len(fn.get("name")) + _text_len(fn.get("arguments"))
    return n


def visible_chars(choices: Any) -> int:
    """Characters of visible text in a ``choices`` list (stream chunk or full response).

    Completions ``text``; chat ``delta``/``message`` ``content``, ``reasoning`` /
    ``reasoning_content`` and tool-call name and argument fragments.  Role-only chunks,
    empty strings and ``choices: []`` give 0.
    """
    if not isinstance(choices, list):
        return 0
    n = 0
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        n += _text_len(choice.get("text"))
        for key in ("delta", "message"):
            msg = choice.get(key)
            if isinstance(msg, dict):
                n += _message_chars(msg)
    return n


def usage_tokens(obj: Any) -> tuple[int, int] | None:
    """(prompt_tokens, completion_tokens) of a usage object when both are integers."""
    if not isinstance(obj, dict):
        return None
    p, c = obj.get("prompt_tokens"), obj.get("completion_tokens")
    if type(p) is int and type(c) is int:
        return p, c
    return None


def cached_tokens(obj: Any) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` when it is a non-negative integer: the prompt
    tokens the engine took from its prefix cache (vLLM with ``--enable-prompt-tokens-details``,
    SGLang with ``--enable-cache-report``); None where the engine does not say."""
    details = obj.get("prompt_tokens_details") if isinstance(obj, dict) else None
    n = details.get("cached_tokens") if isinstance(details, dict) else None
    return n if type(n) is int and n >= 0 else None


def has_float_tokens(obj: Any) -> bool:
    """A usage object whose token counts came back as floats: orjson reads an integer over
    64 bits as a float, so the standard library must read the document again."""
    return isinstance(obj, dict) and (
        type(obj.get("prompt_tokens")) is float or type(obj.get("completion_tokens")) is float)


def _short(value: Any) -> str:
    if isinstance(value, str):
        return value[:200]
    return _SHORT.repr(value)[:200]


def error_message(obj: dict[str, Any]) -> str | None:
    """The message of an error document (``{"error": ...}`` or ``"object": "error"``), at most
    200 characters; None when the document is not an error."""
    err = obj.get("error")
    if err:
        if isinstance(err, dict):
            return _short(err.get("message") or err.get("type") or "error")
        return _short(err)
    if obj.get("object") == "error":
        return _short(obj.get("message") or "error")
    return None
