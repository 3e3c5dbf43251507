"""What the simulated engines know of sessions: a prefix cache and tool calls.

The prefix cache works as vLLM's and SGLang's do, in whole blocks: a prompt's words are cut into
blocks of ``block`` tokens, each block named by a hash of every word up to its end, so two
prompts share the cached blocks of their common prefix and no more.  A request is served from
the blocks already cached (its ``cached_tokens``, reported in
``usage.prompt_tokens_details.cached_tokens``, and not prefilled again), then leaves all of its
blocks cached, and those of its text answer too (the next turn of a session starts with both).
The last prompt token is always computed, as the real engines do.  The cache
holds at most ``capacity`` blocks and forgets the least recently used first.

A chat request that offers ``tools`` (and not ``tool_choice: "none"``) and whose last message is
the user's is answered with a tool call when no tool message is in its history yet (the first
tool turn of a session), and otherwise with probability ``tool_call_rate``: tiny real models
rarely call a tool, so the simulators are where a tool turn is tested end to end.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Any

__all__ = ["PrefixCache", "prompt_words", "tool_name", "tool_call_wanted"]


def prompt_words(body: dict[str, Any]) -> list[str]:
    """The prompt's tokens: whitespace-separated words of the prompt, or of every message's content."""
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = " ".join(p for p in prompt if isinstance(p, str))
    if isinstance(prompt, str):
        return prompt.split()
    words: list[str] = []
    for msg in body.get("messages") or []:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, str):
            words += content.split()
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    words += part["text"].split()
    return words


class PrefixCache:
    """Cached prompt blocks (hash chains), least recently used forgotten first."""

    def __init__(self, block: int, capacity: int) -> None:
        self.block = block
        self.capacity = max(1, capacity)
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def serve(self, words: list[str]) -> int:
        """The tokens of ``words`` found cached; then every block of them is cached."""
        if self.block <= 0:
            return 0
        cached, hit, h = 0, True, 0
        usable = len(words) - 1  # the last token is always computed
        for end in range(self.block, usable + 1, self.block):
            h = hash((h, *words[end - self.block:end]))
            if hit and h in self._blocks:
                cached = end
                self._blocks.move_to_end(h)
            else:
                hit = False
                self._blocks[h] = None
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)
        return cached


def tool_name(body: dict[str, Any]) -> str | None:
    """The first offered function's name, when the request offers tools and allows a call."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools or body.get("tool_choice") == "none":
        return None
    fn = tools[0].get("function") if isinstance(tools[0], dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    return name if isinstance(name, str) and name else "tool"


def tool_call_wanted(body: dict[str, Any], rng: random.Random, rate: float) -> str | None:
    """The function to call in the answer to this chat request, or None for a text answer."""
    name = tool_name(body)
    messages = body.get("messages")
    if name is None or not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        return None
    first = not any(isinstance(m, dict) and m.get("role") == "tool" for m in messages)
    return name if first or rng.random() < rate else None
