"""A grammar of both engines' streams (SPEC section 8), each stream with the verdict it must get.

:func:`generate` draws a stream's *meaning* (engine, API, text fragments, reasoning, tool calls,
usage, an error, a malformed or over-long event, ``[DONE]``, junk after it) and derives the
expected verdict from that meaning alone, by SPEC sections 3 and 4: an oracle that shares no
code with the parser.  :func:`render` spells the meaning in bytes, differently each time (line
endings, ``data:`` with or without a space, JSON spacing, indentation over several ``data:``
lines, key order, escapes, comments and other fields, a BOM), and tags the bytes of every
usage-only event so that the usage filter's expected output is known too.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

#: Limits the analyzer runs with in the differential (small, so the bounds are exercised).
MAX_LINE = 2048
MAX_EVENT = 8192

_TEXT = ["", "", "a", " world", "é", "数据", "\U0001f600", "\n", "\"q\"", "\\", "\r\n", "x" * 40, "\u2028", "\ud7ff"]


@dataclass
class Item:
    """One event of the meaning: a document, raw data bytes, or a line/event over the bounds."""

    kind: str  # text, usage, error, malformed, overlong_line, overlong_event, done, junk
    doc: Any = None
    raw: bytes = b""
    visible: int = 0
    usage: tuple[int, int] | None = None
    named_error: bool = False


@dataclass
class Stream:
    items: list[Item] = field(default_factory=list)
    expected_tokens: int | None = None

    def verdict(self) -> tuple[str | None, int, tuple[int, int] | None, bool]:
        """(reason, visible chars, usage, done) as SPEC 3/4 define them for this meaning."""
        visible, usage, done, error, malformed = 0, None, False, False, False
        for item in self.items:
            if item.kind == "done":
                done = True
                break
            visible += item.visible
            usage = item.usage or usage
            error = error or item.kind == "error"
            malformed = malformed or item.kind in ("malformed", "overlong_line", "overlong_event")
        reason = ("sse_error" if error else "malformed" if malformed else "missing_done" if not done
                  else "empty_text" if visible == 0 else "missing_usage" if usage is None
                  else "length_mismatch" if self.expected_tokens not in (None, usage[1]) else None)
        return reason, visible, usage, done


def _chunk(rng: random.Random, engine: str, chat: bool, text: str) -> tuple[dict[str, Any], int]:
    if not chat:
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
        choice["stop_reason" if engine == "vllm" else "matched_stop"] = None
        doc = {"id": "cmpl-1", "object": "text_completion", "created": 1700000000, "model": "m",
               "choices": [choice]}
        return (doc | {"usage": None} if engine == "sglang" else doc), len(text)
    kind = rng.choice(["content", "content", "reasoning", "both", "tool", "parts", "role"])
    delta: dict[str, Any] = {
        "content": {"content": text}, "reasoning": {"reasoning" if engine == "vllm" else "reasoning_content": text},
        "both": {"reasoning": text, "reasoning_content": text},
        "tool": {"tool_calls": [{"index": 0, "function": {"name": text, "arguments": text}}]},
        "parts": {"content": [{"type": "text", "text": text}, {"type": "image_url"}]},
        "role": {"role": "assistant", "content": "" if engine == "vllm" else None},
    }[kind]
    n = 0 if kind == "role" else 2 * len(text) if kind == "tool" else len(text)
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}, n


def _usage(rng: random.Random) -> tuple[int, int]:
    big = 1 << rng.choice([64, 70, 100])
    return rng.choice([rng.randrange(1, 5000), big]), rng.choice([rng.randrange(0, 600), big, 1])


def _error(rng: random.Random) -> Item:
    doc = rng.choice([
        {"error": {"message": "Internal server error", "type": "InternalServerError", "param": None, "code": 500}},
        {"error": {"object": "error", "message": "bad", "type": "BadRequestError", "param": None, "code": 400}},
        {"object": "error", "message": "oops", "type": "x", "code": 500},
        {"error": {"message": [[[["nested"]]]]}},
    ])
    return Item("error", doc, named_error=rng.random() < 0.2)


def _bad(rng: random.Random) -> Item:
    kind = rng.choice(["malformed"] * 4 + ["overlong_line", "overlong_event"])
    if kind == "overlong_line":
        return Item(kind, raw=(b":" if rng.random() < 0.5 else b"data: ") + b"x" * (MAX_LINE + 1))
    if kind == "overlong_event":
        return Item(kind, raw=b"x" * (MAX_LINE - 16))  # rendered as enough data lines to pass MAX_EVENT
    raw = rng.choice([b'{"choices": [', b"[1]", b'"x"', b"3", b"\xff\xfe", b"nul", b"{" * 600 + b"}" * 600,
                      b'{"a":' * 600 + b"1" + b"}" * 600, b"[" * 1000, b'{"x": NaN', b"{}}"])
    return Item("malformed", raw=raw)


def _junk(rng: random.Random) -> Item:
    return Item("junk", raw=rng.choice([
        b"data: {broken\n\n", b'data: {"error": "after done"}\n\n', b":" + b"y" * (MAX_LINE * 2) + b"\n",
        b"data: " + b"z" * (MAX_EVENT * 2) + b"\n\n", b"data: [DONE]\n\n", bytes(rng.randrange(256) for _ in range(30)),
    ]))


def generate(rng: random.Random) -> Stream:
    """A stream's meaning and its expected verdict."""
    engine, chat = rng.choice(["vllm", "sglang"]), rng.random() < 0.5
    stream = Stream()
    items = stream.items
    for _ in range(rng.randrange(0, 8)):
        doc, n = _chunk(rng, engine, chat, rng.choice(_TEXT))
        items.append(Item("text", doc, visible=n))
    usage = _usage(rng) if rng.random() < 0.8 else None
    if usage is not None:
        body = {"prompt_tokens": usage[0], "total_tokens": usage[0] + usage[1], "completion_tokens": usage[1]}
        if items and engine == "sglang" and rng.random() < 0.3 and not chat:
            items[-1].doc = items[-1].doc | {"usage": body}
            items[-1].usage = usage
        else:
            items.append(Item("usage", {"id": "u", "object": "x", "created": 1, "model": "m", "choices": [],
                                        "usage": body}, usage=usage))
    for make, p in ((_error, 0.1), (_bad, 0.12)):
        if rng.random() < p:
            items.insert(rng.randrange(len(items) + 1), make(rng))
    if rng.random() < 0.9:
        items.append(Item("done"))
        for _ in range(rng.choice([0, 0, 0, 1, 2])):
            items.append(_junk(rng))
    if usage is not None and rng.random() < 0.5:
        stream.expected_tokens = usage[1] if rng.random() < 0.7 else usage[1] + 1
    return stream


def _json(rng: random.Random, doc: Any) -> list[bytes]:
    """A document's text as one or more data values (indented JSON spans several lines)."""
    if isinstance(doc, dict) and rng.random() < 0.3:
        keys = list(doc)
        rng.shuffle(keys)
        doc = {k: doc[k] for k in keys}
    style = rng.randrange(4)
    ascii_only = rng.random() < 0.5
    if style == 0:
        text = json.dumps(doc, separators=(",", ":"), ensure_ascii=ascii_only)
    elif style == 1:
        text = json.dumps(doc, ensure_ascii=ascii_only)
    elif style == 2:
        text = " " + json.dumps(doc, ensure_ascii=ascii_only) + " \t"
    else:
        text = json.dumps(doc, indent=rng.randrange(0, 3), ensure_ascii=ascii_only)
    return [line.encode("utf-8", "surrogatepass") for line in text.split("\n")]


def _lines(rng: random.Random, item: Item) -> list[bytes]:
    if item.kind == "done":
        values = [b"[DONE]"]
    elif item.kind == "overlong_line":
        return [item.raw]
    elif item.kind == "overlong_event":
        values = [item.raw] * (MAX_EVENT // len(item.raw) + 1)
    elif item.kind == "malformed":
        values = [item.raw]
    else:
        values = _json(rng, item.doc)
    lines = [rng.choice([b"data:", b"data: "]) + v for v in values]
    if item.named_error:
        lines.insert(0, b"event: error")
    for extra in (b": keep-alive", b"id: 7", b"retry: 100", b"foo: bar"):
        if rng.random() < 0.05:
            lines.insert(rng.randrange(len(lines) + 1), extra)
    return lines


class _Writer:
    """Joins lines with random terminators; a CR never meets a following LF by accident."""

    def __init__(self, rng: random.Random, eol: bytes | None) -> None:
        self.rng, self.eol = rng, eol
        self.parts: list[tuple[bytes, bool]] = []  # (bytes, dropped by the usage filter)
        self.last_cr = False

    def line(self, text: bytes, drop: bool = False, end: bool = True) -> None:
        eol = b"" if not end else self.eol or self.rng.choice([b"\n", b"\r\n", b"\r"])
        if self.last_cr and not text and eol == b"\n":
            eol = b"\r\n"
        self.parts.append((text + eol, drop))
        self.last_cr = eol == b"\r"


def render(rng: random.Random, stream: Stream) -> tuple[bytes, bytes]:
    """(the stream's bytes, the same without its usage-only events) in a random spelling."""
    w = _Writer(rng, rng.choice([b"\n", b"\r\n", b"\r", None]))
    if rng.random() < 0.05:
        w.parts.append((b"\xef\xbb\xbf", False))
    for i, item in enumerate(stream.items):
        if item.kind == "junk":
            w.parts.append((item.raw, False))
            w.last_cr = False
            continue
        if rng.random() < 0.1:
            w.line(b": ping")
            w.line(b"")
        drop = item.kind == "usage"
        for text in _lines(rng, item):
            w.line(text, drop and text[:1] != b":")
        last = i == len(stream.items) - 1
        if last and rng.random() < 0.2:  # the stream ends without the blank line
            continue
        w.line(b"", drop)
    whole = b"".join(p for p, _ in w.parts)
    kept = b"".join(p for p, drop in w.parts if not drop)
    return whole, kept


def cuts(rng: random.Random, body: bytes) -> list[bytes]:
    """The body split into reads at random places (sometimes byte by byte)."""
    if len(body) < 400 and rng.random() < 0.1:
        return [body[i:i + 1] for i in range(len(body))]
    points = sorted({rng.randrange(1, len(body)) for _ in range(rng.randrange(0, 12))} if len(body) > 1 else set())
    return [body[a:b] for a, b in zip([0, *points], [*points, len(body)]) if b > a]
