"""Session cells of the load driver: multi-turn chat, the history growing with the real answers.

A session cell (``load --sessions N --turns T [--think-time S] [--tools]``, or ``sessions:`` and
``turns:`` in a plan cell) runs N sessions at once, each of T turns in chat.  Each turn adds
``input_tokens`` words (the model's tokens with ``load --tokenizer``) of new user text to the history and asks for ``output_tokens``; the
request carries the whole history, the previous answers as the engine gave them, and the
header ``X-Session-ID`` (the proxy numbers the turns and records the engine's cached tokens).
Between an answer and the next turn a session waits ``think_time_s`` seconds.

With ``tools`` every request offers one function (``lookup``); an answer that calls it goes
into the history as the assistant's tool call, followed by one tool message per call (as many
words as ``output_tokens``), so the next turn carries both.  A turn that failed leaves the
history as it was (its user text is dropped) and the session goes on with its next turn, so a
round always sends sessions × turns requests.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from exporter.core.jsondepth import loads
from exporter.core.sse import SSEParser

from .plan import Cell
from .replay import TraceLine, sessions_of

__all__ = ["Answer", "Turn", "run_sessions", "replay_sessions", "request_body", "TOOL"]

Record = dict[str, Any]

#: the one function a ``tools`` session offers
TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "lookup", "description": "Look up a word and return what is known of it.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}


class Answer:
    """The assistant's message, gathered from a streamed chat answer: its text and its tool calls."""

    def __init__(self) -> None:
        self._parser = SSEParser()
        self._text: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}

    def feed(self, chunk: bytes) -> None:
        for event in self._parser.feed(chunk):
            if event.problem is None and event.data != b"[DONE]":
                self._on_event(event.data)

    def _on_event(self, data: bytes) -> None:
        try:
            doc = loads(data)
        except ValueError:
            return
        choices = doc.get("choices") if isinstance(doc, dict) else None
        for choice in choices if isinstance(choices, list) else []:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                continue
            if isinstance(delta.get("content"), str):
                self._text.append(delta["content"])
            for call in delta.get("tool_calls") or []:
                if isinstance(call, dict):
                    self._add_call(call)

    def _add_call(self, call: dict[str, Any]) -> None:
        given = call.get("index")
        index = given if isinstance(given, int) else len(self._calls)
        held = self._calls.setdefault(index, {"id": None, "type": "function",
                                              "function": {"name": "", "arguments": ""}})
        if isinstance(call.get("id"), str):
            held["id"] = call["id"]
        fn = call.get("function")
        if isinstance(fn, dict):
            for key in ("name", "arguments"):
                if isinstance(fn.get(key), str):
                    held["function"][key] += fn[key]

    def messages(self, tool_result: Callable[[], str]) -> list[dict[str, Any]]:
        """The assistant's message, then one tool message (``tool_result()``) per tool call."""
        text = "".join(self._text)
        calls = [c for _, c in sorted(self._calls.items())]
        for i, call in enumerate(calls):
            call["id"] = call["id"] or f"call-{i}"
        if not calls:
            return [{"role": "assistant", "content": text}]
        out: list[dict[str, Any]] = [{"role": "assistant", "content": text or None, "tool_calls": calls}]
        return out + [{"role": "tool", "tool_call_id": c["id"], "content": tool_result()} for c in calls]

    @property
    def tool_calls(self) -> int:
        return len(self._calls)


class Turn:
    """One turn of a session as sent: its body, its headers, its record's fields, its answer."""

    def __init__(self, session_id: str, turn: int, body: dict[str, Any]) -> None:
        self.session_id = session_id
        self.turn = turn
        self.body = body
        self.answer = Answer()

    @property
    def headers(self) -> dict[str, str]:
        return {"X-Session-ID": self.session_id}

    @property
    def fields(self) -> dict[str, Any]:
        """The record's session fields, read once the answer is in."""
        return {"session_id": self.session_id, "turn": self.turn, "tool_calls": self.answer.tool_calls}


def request_body(model: str | None, max_tokens: int, **content: Any) -> dict[str, Any]:
    """A streamed request of ``load``: ``content`` (its ``prompt``, or chat ``messages``), ``max_tokens``
    with ``ignore_eos``, usage in the stream."""
    return {"model": model, **content, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}


class _Session:
    """One conversation: its id and its history."""

    def __init__(self, session_id: str, cell: Cell, model: str | None) -> None:
        self.id = session_id
        self.cell = cell
        self.model = model
        self.history: list[dict[str, Any]] = []

    def turn(self, n: int, user_text: str) -> Turn:
        cell = self.cell
        messages = [*self.history, {"role": "user", "content": user_text}]
        body = request_body(self.model, cell.output_tokens, messages=messages)
        if cell.tools:
            body.update(tools=[TOOL], tool_choice="auto")
        return Turn(self.id, n, body)  # a list of its own; the messages in it are never changed

    def answered(self, turn: Turn, record: Record, tool_result: Callable[[], str]) -> None:
        """A successful turn joins the history with its answer (and tool messages); a failed one does not."""
        if record.get("outcome") == "success":
            self.history += [turn.body["messages"][-1], *turn.answer.messages(tool_result)]


Send = Callable[[Turn, float], Awaitable[Record]]


async def run_sessions(cell: Cell, round_: int, send: Send, words: Callable[[int], str],
                       model: str | None, clock: Callable[[], float]) -> list[Record]:
    """The cell's sessions at once, each of its turns in order; ``send(turn, ready)`` sends one
    (``ready``: when the session was ready to send it) and returns its record.  ``words(n)``:
    ``n`` words of new text."""
    assert cell.sessions is not None
    records: list[Record] = []
    tag = uuid.uuid4().hex[:8]

    async def session(i: int) -> None:
        conv = _Session(f"s{round_}-{i}-{tag}", cell, model)
        for n in range(1, cell.turns + 1):
            if n > 1 and cell.think_time_s:
                await asyncio.sleep(cell.think_time_s)
            turn = conv.turn(n, words(cell.input_tokens))
            record = await send(turn, clock())
            records.append(record)
            conv.answered(turn, record, lambda: words(cell.output_tokens))

    await asyncio.gather(*(session(i) for i in range(cell.sessions)))
    return records


async def replay_sessions(lines: Sequence[TraceLine], text: Callable[[TraceLine, int], str], round_: int,
                          speedup: float, send: Send, model: str | None, clock: Callable[[], float],
                          start: float) -> list[Record]:
    """A trace's sessions (AIPerf's multi-turn Mooncake lines, :func:`.replay.sessions_of`) replayed at once:
    a session's first turn at its timestamp over ``speedup``; each later turn ``delay_s / speedup`` after
    the previous turn's answer (or at its own timestamp, once that answer is in), in chat, with
    ``X-Session-ID``.  Each turn adds a user message of ``text(line, index)`` (its ``input_length``: what
    the turn added) to the history, which keeps the answers as the engine gave them, as a session cell's
    does; a failed turn leaves the history as it was.  A line without ``session_id`` is a session of one."""
    records: list[Record] = []
    tag = uuid.uuid4().hex[:8]
    index = {id(line): i for i, line in enumerate(lines)}

    async def session(k: int, turns: list[TraceLine]) -> None:
        history: list[dict[str, Any]] = []
        for n, line in enumerate(turns, 1):
            due = start + line.offset_s / speedup
            if n > 1:
                due = clock() + line.delay_s / speedup if line.delay_s is not None else max(due, clock())
            await asyncio.sleep(max(0.0, due - clock()))
            user = {"role": "user", "content": text(line, index[id(line)])}
            turn = Turn(f"r{round_}-{k}-{tag}", n, request_body(model, line.output_length, messages=[*history, user]))
            record = await send(turn, due)
            records.append(record)
            if record.get("outcome") == "success":
                history += [user, *turn.answer.messages(lambda: "")]

    await asyncio.gather(*(session(k, turns) for k, turns in enumerate(sessions_of(lines))))
    return records
