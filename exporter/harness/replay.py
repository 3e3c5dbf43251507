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
simulated engines without a tokenizer.

The engine counts more than the words: its tokenizer adds a BOS to a plain prompt, its chat template
wraps a chat message.  Given the engine's tokenizer (``load --tokenizer PATH``), :func:`framing`
measures that once per cell: ``lead`` tokens before the words and ``trail`` after, and a vocabulary of
words that are one token each in this tokenizer.  The prompt then holds ``input_length - lead -
trail`` words, laid out by token position (the word at position ``p`` is word ``p % block_size`` of
the block of hash id ``hash_ids[p // block_size]``, positions before ``lead`` being the engine's), so
that the engine counts exactly ``input_length`` tokens and its block ``k`` is equal in two prompts
exactly when their ``k``-th hash ids are: a trace captured from the replay has the replayed trace's
lengths and hash ids.  :func:`framing` checks that on two probe prompts and refuses a tokenizer for
which it does not hold (one that merges the words, say).

Every round (and the warm-up) replays the trace from its first line with text of its own, so that
one round's prompts are not in the engine's prefix cache when the next begins; within a round the
trace's sharing is kept exactly.

A plan cell's prompts (and an ad-hoc run's, ``--input-tokens``) are framed the same way, by the same
measurement (:meth:`Replays.prompt`): ``input_tokens - lead - trail`` one-token words, so that the
engine counts exactly ``input_tokens``; a session's added user text is ``input_tokens`` such words
(:meth:`Replays.words`: the chat template's tokens around each message come on top).  Without a
tokenizer they are ``input_tokens`` of the driver's words, one token each only for the simulated engines.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exporter.core.stats import median

if TYPE_CHECKING:
    from exporter.proxy.prompttokens import PromptTokenizer

__all__ = ["TraceFileError", "TraceLine", "read_trace", "sessions_of", "Prompts", "Framing", "framing", "Replays",
           "trace_shape", "implied_block_size", "check_blocks", "PLAIN_BLOCK"]

#: blocks of words kept per round (a few MiB): the rest are drawn again when their id comes back
_BLOCKS_KEPT = 4096
#: the block size of the probes that check the framing of a plan cell's prompts (a trace's default)
PLAIN_BLOCK = 512


class TraceFileError(ValueError):
    """A trace that cannot be replayed: one line naming the file, the line and the reason."""


@dataclass(frozen=True, slots=True)
class TraceLine:
    """One request of a trace: when (seconds after the first line), how long, which blocks."""

    offset_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    #: AIPerf's multi-turn lines: the session, and (a later turn) the seconds after the previous turn's answer
    session_id: str | None = None
    delay_s: float | None = None


def _count(doc: dict[str, Any], key: str, where: str, least: int) -> int:
    value = doc.get(key)
    if type(value) is not int or value < least:
        raise TraceFileError(f"{where}: {key} must be a whole number >= {least}, got {value!r}")
    return value


def _ms(doc: dict[str, Any], key: str, where: str) -> float:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise TraceFileError(f"{where}: {key} (ms) must be a number >= 0, got {value!r}")
    return float(value)


def _line(text: str, where: str, seen: set[str]) -> TraceLine:
    """One line; ``offset_s`` is its timestamp in ms here (-1 for a session's later turn that has none)."""
    try:
        doc = json.loads(text)
    except ValueError:
        raise TraceFileError(f"{where}: not a JSON line") from None
    if not isinstance(doc, dict):
        raise TraceFileError(f"{where}: not a JSON object")
    sid = doc.get("session_id")
    if sid is not None and (not isinstance(sid, str) or not sid):
        raise TraceFileError(f"{where}: session_id must be a non-empty string, got {sid!r}")
    later = sid is not None and sid in seen
    if sid is not None:
        seen.add(sid)
    ts = _ms(doc, "timestamp", where) if not later or doc.get("timestamp") is not None else -1.0
    delay = _ms(doc, "delay", where) / 1000.0 if later and doc.get("delay") is not None else None
    if later and ts < 0 and delay is None:
        delay = 0.0  # AIPerf's default: a later turn with neither goes out as soon as the previous answer is in
    ids = doc.get("hash_ids", [])
    if not isinstance(ids, list) or any(type(h) is not int for h in ids):
        raise TraceFileError(f"{where}: hash_ids must be a list of whole numbers")
    return TraceLine(ts, _count(doc, "input_length", where, 1), _count(doc, "output_length", where, 1), tuple(ids),
                     sid, delay)


def sessions_of(lines: Sequence[TraceLine]) -> list[list[TraceLine]]:
    """The trace's sessions in the order their first turns are due, each its turns in order; a line without
    ``session_id`` is a session of one turn."""
    out: dict[str | int, list[TraceLine]] = {}
    for i, line in enumerate(lines):
        out.setdefault(line.session_id if line.session_id is not None else i, []).append(line)
    return list(out.values())


def read_trace(path: str | Path) -> list[TraceLine]:
    """The trace's lines in timestamp order (ties in file order), offsets from the first.  A session's later
    turns (AIPerf's multi-turn lines: ``session_id``, ``delay`` and no ``timestamp``) follow its first turn
    in file order, at its offset (their ``delay_s`` says when they go)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceFileError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFileError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    seen: set[str] = set()
    parsed = [_line(t, f"{path}:{n}", seen) for n, t in enumerate(text.splitlines(), 1) if t.strip()]
    if not parsed:
        raise TraceFileError(f"{path}: no trace lines")
    starts: dict[str, float] = {}
    for line in parsed:  # a later turn without a timestamp sorts with its session's first
        if line.session_id is not None:
            starts.setdefault(line.session_id, line.offset_s)
    keyed = [(line.offset_s if line.offset_s >= 0 else starts[str(line.session_id)], line) for line in parsed]
    keyed.sort(key=lambda p: p[0])
    first = keyed[0][0]
    return [dataclasses.replace(line, offset_s=(ts - first) / 1000.0) for ts, line in keyed]


def trace_shape(options: Mapping[str, Any]) -> dict[str, Any]:
    """A trace cell's options with what its trace implies filled in: ``requests`` (its lines),
    ``input_tokens`` and ``output_tokens`` (its longest); TraceFileError for a bad trace."""
    path = options.get("trace")
    if not isinstance(path, str):
        return dict(options)
    lines = read_trace(path)
    out = dict(options)
    given = out.get("block_size")
    if given is None:
        implied = implied_block_size(lines)
        if implied is not None and implied != PLAIN_BLOCK:
            out["block_size"] = implied
    if type(out.get("block_size", PLAIN_BLOCK)) is int and out.get("block_size", PLAIN_BLOCK) > 0:
        check_blocks(lines, out.get("block_size", PLAIN_BLOCK), path, given is not None)
    if out.get("requests") is None:
        out["requests"] = len(lines)
    elif type(out["requests"]) is int and out["requests"] > len(lines):
        raise TraceFileError(f"{path}: {out['requests']} requests asked, the trace has {len(lines)} lines")
    for key, value in (("input_tokens", max(t.input_length for t in lines)),
                       ("output_tokens", max(t.output_length for t in lines))):
        if out.get(key) is None:
            out[key] = value
    return out


def implied_block_size(lines: Sequence[TraceLine]) -> int | None:
    """The block size a trace's lines were written at: ``ceil(input_length / block_size)`` ids a line, as AIPerf's
    loader and ``evidence trace`` have them.  Of the sizes every line fits, 512 (the default) when it is one,
    else the largest power of two, else the smallest; None when no size fits every line."""
    lo, hi = 1, None
    for line in lines:
        n = len(line.hash_ids)
        if n:
            lo = max(lo, -(-line.input_length // n))
            if n > 1:
                top = (line.input_length - 1) // (n - 1)
                hi = top if hi is None else min(hi, top)
    if hi is None or lo > hi:
        return None
    if lo <= PLAIN_BLOCK <= hi:
        return PLAIN_BLOCK
    power = 1 << hi.bit_length() - 1
    return power if power >= lo else lo


def check_blocks(lines: Sequence[TraceLine], block_size: int, path: str, given: bool) -> None:
    """TraceFileError when a line has more hash ids than its ``input_length`` fills at ``block_size``: the ids
    past them would never reach the prompt, and two lines that differ only there would be sent alike."""
    for n, line in enumerate(lines, 1):
        if len(line.hash_ids) > -(-line.input_length // block_size):
            implied = implied_block_size(lines)
            hint = f"its lines fit blocks of {implied} tokens" if implied is not None else "its lines fit no one block size"
            raise TraceFileError(f"{path}: line {n} has {len(line.hash_ids)} hash ids for input_length "
                                 f"{line.input_length}, more than blocks of {block_size} tokens"
                                 f"{' (--block-size)' if given else ''} hold: {hint} (the trace's note gives it; "
                                 "--block-size N, block_size: N in a plan)")


Words = Callable[[random.Random, int], str]


@dataclass(frozen=True, slots=True)
class Framing:
    """What the engine's tokenizer puts around a replayed prompt's words, in tokens: ``lead`` before them
    (a BOS, a chat template's head), ``trail`` after; ``vocabulary``: words of one token each (empty:
    the driver's own words, one token each for the simulated engines without a tokenizer)."""

    lead: int = 0
    trail: int = 0
    vocabulary: tuple[str, ...] = ()

    def words(self, fallback: Words) -> Words:
        vocabulary = self.vocabulary
        if not vocabulary:
            return fallback
        return lambda rng, k: " ".join(rng.choice(vocabulary) for _ in range(k))

    def fill(self, input_length: int) -> int:
        """How many words a prompt of ``input_length`` tokens holds: what the framing leaves of it."""
        return max(0, input_length - self.lead - self.trail)


class Prompts:
    """The prompts of one round of a replay: equal hash ids give equal blocks of words."""

    def __init__(self, block_size: int, salt: str, words: Words, frame: Framing = Framing()) -> None:
        self.block_size = block_size
        self.salt = salt
        self.frame = frame
        self._words = frame.words(words)
        self.block = lru_cache(maxsize=_BLOCKS_KEPT)(self._block)

    def _block(self, hash_id: int) -> tuple[str, ...]:
        return tuple(self._words(random.Random(f"{self.salt}/block/{hash_id}"), self.block_size).split())

    def text(self, line: TraceLine, index: int) -> str:
        """``line``'s prompt: the words of token positions ``lead`` .. ``input_length - trail``, block by block
        (position ``p``: word ``p % block_size`` of hash id ``hash_ids[p // block_size]``); positions past the
        ids take words of the request's own, seeded by ``index``."""
        size, pos = self.block_size, self.frame.lead
        stop = pos + self.frame.fill(line.input_length)
        words: list[str] = []
        for b, h in enumerate(line.hash_ids):
            end = min(stop, (b + 1) * size)
            if pos >= stop:
                break
            if end > pos:
                words.extend(self.block(h)[pos - b * size:end - b * size])
                pos = end
        if pos < stop:
            words.extend(self._words(random.Random(f"{self.salt}/own/{index}"), stop - pos).split())
        return " ".join(words)


def _one_token_words(tok: PromptTokenizer, candidates: Sequence[str]) -> tuple[str, ...]:
    """The candidates that this tokenizer keeps one token each, alone and in a run of words."""
    return tuple(w for w in candidates if len(tok.encode(w, False)) == 1 and len(tok.encode(f"{w} {w} {w}", False)) == 3)


def _body(text: str, chat: bool) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text}


def framing(tok: PromptTokenizer, chat: bool, block_size: int, candidates: Sequence[str]) -> Framing:
    """The engine's framing of a replayed prompt, measured with its tokenizer, and checked: two probe
    prompts whose hash ids share their first blocks are counted ``input_length`` tokens each and have
    those blocks' tokens in common.  TokenizerError (one line) when the tokenizer cannot give exact
    lengths.  (A line shorter than ``lead + trail`` cannot be matched: it gets no words at all.)"""
    from exporter.proxy.prompttokens import TokenizerError

    vocabulary = _one_token_words(tok, candidates)
    if len(vocabulary) < 8:
        raise TokenizerError(f"the tokenizer keeps only {len(vocabulary)} of the driver's words as one token each: "
                             "the prompts cannot have exact lengths with it (leave out --tokenizer)")

    def ids(text: str) -> list[int]:
        got = tok.prompt_ids(_body(text, chat), chat)
        if got is None:
            raise TokenizerError("the tokenizer has no chat template: chat prompts cannot be framed with it")
        return got

    a, b = ids(vocabulary[0]), ids(vocabulary[1])
    lead = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
    frame = Framing(lead, len(a) - lead - 1, vocabulary)
    blocks = 2 - (-(frame.lead + frame.trail) // block_size)  # two blocks of words at least
    shared = blocks * block_size
    probes = [TraceLine(0.0, shared + 3, 1, (*range(blocks), blocks)), TraceLine(0.0, shared + 2, 1, tuple(range(blocks)))]
    prompts = Prompts(block_size, "framing", lambda rng, k: "", frame)
    got = [ids(prompts.text(line, i)) for i, line in enumerate(probes)]
    if len(a) != len(b) or [len(g) for g in got] != [p.input_length for p in probes] \
            or got[0][:shared - frame.trail] != got[1][:shared - frame.trail]:
        raise TokenizerError("the tokenizer does not count the driver's words one token each around its "
                             f"{'chat template' if chat else 'special tokens'}: the prompts cannot have exact lengths "
                             "with it (leave out --tokenizer)")
    return frame


class Replays:
    """The traces a driver replays (each read once) and how the engine frames the driver's prompts, a trace's
    and a plan cell's (measured once per chat or not and block size, with the engine's tokenizer when the
    driver has one)."""

    def __init__(self, seed: int, words: Words, candidates: Sequence[str], tokenizer: PromptTokenizer | None) -> None:
        self.seed = seed
        self.tokenizer = tokenizer
        self._words = words
        self._candidates = tuple(candidates)
        self._traces: dict[str, list[TraceLine]] = {}
        self._framings: dict[tuple[bool, int], Framing] = {}

    def lines(self, path: str) -> list[TraceLine]:
        if path not in self._traces:
            self._traces[path] = read_trace(path)
        return self._traces[path]

    def has_sessions(self, path: str, n: int) -> bool:
        """Whether the first ``n`` lines of a trace hold AIPerf's multi-turn lines (replayed as sessions, in chat)."""
        return any(line.session_id is not None for line in self.lines(path)[:n])

    def framing(self, chat: bool, block_size: int) -> Framing:
        """:func:`framing` with the tokenizer; nothing (a word per token) without one.  TokenizerError."""
        if self.tokenizer is None:
            return Framing()
        if (chat, block_size) not in self._framings:
            self._framings[chat, block_size] = framing(self.tokenizer, chat, block_size, self._candidates)
        return self._framings[chat, block_size]

    def ready(self, chat: bool, sessions: bool, trace: str | None) -> None:
        """Measure (and check) how a cell's prompts are framed before its first request: a plan cell's (``chat``),
        and a session cell's user text; a trace cell's are framed by :meth:`prompts`.  TokenizerError."""
        if trace is None:
            self.framing(chat, PLAIN_BLOCK)
            if sessions:
                self.framing(False, PLAIN_BLOCK)

    def prompt(self, rng: random.Random, input_tokens: int, chat: bool) -> str:
        """A plan cell's prompt: ``input_tokens`` tokens as the engine counts them (its BOS, its chat template)
        with the tokenizer; that many words without one.  TokenizerError."""
        frame = self.framing(chat, PLAIN_BLOCK)
        return frame.words(self._words)(rng, frame.fill(input_tokens))

    def words(self, rng: random.Random, k: int) -> str:
        """``k`` words of text, ``k`` tokens as the tokenizer counts them (a session's added user text)."""
        return self.framing(False, PLAIN_BLOCK).words(self._words)(rng, k)

    def asked(self, trace: str, n: int) -> float | None:
        """The median ``input_length`` of the first ``n`` lines of ``trace`` that open a session (or are one)."""
        return median([turns[0].input_length for turns in sessions_of(self.lines(trace)[:n])])

    def prompts(self, trace: str, chat: bool, block_size: int, salt: str) -> Prompts:
        """A round's prompts for a trace cell: the trace read, text of its own per ``salt``."""
        self.lines(trace)
        return Prompts(block_size, f"{self.seed}/{salt}", self._words, self.framing(chat, block_size))
