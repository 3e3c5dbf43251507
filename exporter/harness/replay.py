"""``load --trace FILE``: a Mooncake trace replayed open loop, at its own timestamps.

A trace line is ``{"timestamp": MS, "input_length": N, "output_length": M, "hash_ids": [...]}``
(what ``evidence trace`` writes; AIPerf's, SGLang's and GuideLLM's Mooncake traces too).  Each
request goes out at ``timestamp / speedup`` after the round's start, whatever the answers do (open
loop: a late send does not push back the next), with ``max_tokens`` = ``output_length`` and
``ignore_eos``.  Its prompt is built block by block: hash id ``h`` is always the same
``block_size`` words (drawn from a generator seeded by ``h``, the run's seed, the scenario and the
round), so equal ids give equal text and a shared prefix stays shared; the last block is cut to
what ``input_length`` leaves (a prefix of that id's words); when the ids cover fewer tokens than
``input_length``, words of the request's own fill the rest.  One word is one token for the
simulated engines; with a real tokenizer, most such words are one token too.

Every round (and the warm-up) replays the trace from its first line with text of its own, so that
one round's prompts are not in the engine's prefix cache when the next begins; within a round the
trace's sharing is kept exactly.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["TraceFileError", "TraceLine", "read_trace", "Prompts", "trace_shape"]

#: blocks of words kept per round (a few MiB): the rest are drawn again when their id comes back
_BLOCKS_KEPT = 4096


class TraceFileError(ValueError):
    """A trace that cannot be replayed: one line naming the file, the line and the reason."""


@dataclass(frozen=True, slots=True)
class TraceLine:
    """One request of a trace: when (seconds after the first line), how long, which blocks."""

    offset_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _count(doc: dict[str, Any], key: str, where: str, least: int) -> int:
    value = doc.get(key)
    if type(value) is not int or value < least:
        raise TraceFileError(f"{where}: {key} must be a whole number >= {least}, got {value!r}")
    return value


def _line(text: str, where: str) -> tuple[float, int, int, tuple[int, ...]]:
    try:
        doc = json.loads(text)
    except ValueError:
        raise TraceFileError(f"{where}: not a JSON line") from None
    if not isinstance(doc, dict):
        raise TraceFileError(f"{where}: not a JSON object")
    ts = doc.get("timestamp")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not 0 <= ts < float("inf"):
        raise TraceFileError(f"{where}: timestamp (ms) must be a number >= 0, got {ts!r}")
    ids = doc.get("hash_ids", [])
    if not isinstance(ids, list) or any(type(h) is not int for h in ids):
        raise TraceFileError(f"{where}: hash_ids must be a list of whole numbers")
    return float(ts), _count(doc, "input_length", where, 1), _count(doc, "output_length", where, 1), tuple(ids)


def read_trace(path: str | Path) -> list[TraceLine]:
    """The trace's lines in timestamp order (ties in file order), offsets from the first."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceFileError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFileError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    parsed = [_line(t, f"{path}:{n}") for n, t in enumerate(text.splitlines(), 1) if t.strip()]
    if not parsed:
        raise TraceFileError(f"{path}: no trace lines")
    parsed.sort(key=lambda p: p[0])
    first = parsed[0][0]
    return [TraceLine((ts - first) / 1000.0, n_in, n_out, ids) for ts, n_in, n_out, ids in parsed]


def trace_shape(options: Mapping[str, Any]) -> dict[str, Any]:
    """A trace cell's options with what its trace implies filled in: ``requests`` (its lines),
    ``input_tokens`` and ``output_tokens`` (its longest); TraceFileError for a bad trace."""
    path = options.get("trace")
    if not isinstance(path, str):
        return dict(options)
    lines = read_trace(path)
    out = dict(options)
    if out.get("requests") is None:
        out["requests"] = len(lines)
    elif type(out["requests"]) is int and out["requests"] > len(lines):
        raise TraceFileError(f"{path}: {out['requests']} requests asked, the trace has {len(lines)} lines")
    for key, value in (("input_tokens", max(t.input_length for t in lines)),
                       ("output_tokens", max(t.output_length for t in lines))):
        if out.get(key) is None:
            out[key] = value
    return out


class Prompts:
    """The prompts of one round of a replay: equal hash ids give equal blocks of words."""

    def __init__(self, block_size: int, salt: str, words: Callable[[random.Random, int], str]) -> None:
        self.block_size = block_size
        self.salt = salt
        self._words = words
        self.block = lru_cache(maxsize=_BLOCKS_KEPT)(self._block)

    def _block(self, hash_id: int) -> tuple[str, ...]:
        return tuple(self._words(random.Random(f"{self.salt}/block/{hash_id}"), self.block_size).split())

    def text(self, line: TraceLine, index: int) -> str:
        """``line``'s prompt: ``input_length`` words, block by block; ``index`` seeds its own words."""
        words: list[str] = []
        for h in line.hash_ids:
            if len(words) >= line.input_length:
                break
            words.extend(self.block(h)[:line.input_length - len(words)])
        if len(words) < line.input_length:
            words.extend(self._words(random.Random(f"{self.salt}/own/{index}"), line.input_length - len(words)).split())
        return " ".join(words)
