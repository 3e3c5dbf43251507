"""Decode truth: every gap between visible-text arrivals, per token, and every channel.

Pure and incremental.  The analyzer calls :meth:`DecodeTrack.text` once per visible-text event
(the hot path: a few appends and comparisons, nothing computed) and :meth:`DecodeTrack.usage`
for each usage object it reads; :meth:`DecodeTrack.summary` does all the arithmetic once, at the
request's end.

* An arrival is one read from the upstream: the events it held share its stamp, so events with
  the same stamp are one arrival (a late reader makes fewer, longer gaps, never zero ones).
* A gap runs from one arrival to the next and is shared by all the tokens of the later one's
  events: each of them is one observation of ``gap / tokens``.  The first arrival makes no gap.
* Tokens per event, the first source that covers every arrival after the first: the token ids
  the engine sent (vLLM ``return_token_ids``), else usage streamed per chunk (the increase of
  ``completion_tokens`` since the previous usage), else ``completion_tokens`` spread evenly over
  the text events (integers: event k of E gets ``floor((k+1)c/E) - floor(kc/E)``).  An arrival
  whose events carry no token makes no observation (its raw gap still counts as a stall).
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate
from operator import truediv
from typing import Any

from .stats import sorted_percentile

__all__ = ["DecodeTrack", "Gaps", "DECODE_FIELDS", "CONTENT", "REASONING", "TOOL", "channel_mask", "spec_counts",
           "reasoning_tokens", "DEFAULT_STALL_S"]

#: Default raw gap (seconds) over which a gap between two arrivals is a decode stall.
DEFAULT_STALL_S = 0.5

#: Channels of one chat event's visible text (bits of :func:`channel_mask`).
CONTENT, REASONING, TOOL = 1, 2, 4

#: The record fields :meth:`DecodeTrack.summary` gives, in the record's order.
DECODE_FIELDS: tuple[str, ...] = (
    "itl_p50_s", "itl_p95_s", "itl_p99_s", "itl_max_s", "text_events", "tokens_per_event", "decode_stalls",
    "merged_reads", "ttst_s", "ttfo_s", "reasoning_s", "reasoning_tokens", "ttftc_s", "spec_draft_tokens",
    "spec_accepted_tokens",
)


def _has_text(value: Any) -> bool:
    if isinstance(value, str):
        return value != ""
    if isinstance(value, list):
        return any(isinstance(p, dict) and isinstance(t := p.get("text"), str) and t for p in value)
    return False


def channel_mask(choices: list[Any]) -> int:
    """Which channels a chat event's choices carry text on: :data:`CONTENT` (``delta.content``),
    :data:`REASONING` (``reasoning`` / ``reasoning_content``), :data:`TOOL` (a tool-call name or
    arguments fragment).  A completions event (no ``delta``) gives 0.  Per event on chat streams:
    strings and nulls (the usual members) are told apart without a call."""
    mask = 0
    for choice in choices:
        delta = choice.get("delta") if type(choice) is dict else None
        if type(delta) is not dict:
            continue
        value = delta.get("content")
        if value if type(value) is str else value is not None and _has_text(value):
            mask |= CONTENT
        for key in ("reasoning", "reasoning_content"):
            value = delta.get(key)
            if value if type(value) is str else value is not None and _has_text(value):
                mask |= REASONING
                break
        calls = delta.get("tool_calls")
        if calls:
            mask |= _tool_mask(calls)
    return mask


def _tool_mask(calls: Any) -> int:
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and (_has_text(fn.get("name")) or _has_text(fn.get("arguments"))):
                return TOOL
    return 0


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def reasoning_tokens(usage: Any, doc: dict[str, Any]) -> int | None:
    """``usage.completion_tokens_details.reasoning_tokens``, else SGLang's ``reasoning_tokens`` (in the
    usage object or beside it on the usage chunk); None where the engine does not say."""
    if isinstance(usage, dict):
        details = usage.get("completion_tokens_details")
        if isinstance(details, dict) and (n := _count(details.get("reasoning_tokens"))) is not None:
            return n
        if (n := _count(usage.get("reasoning_tokens"))) is not None:
            return n
    return _count(doc.get("reasoning_tokens"))


def spec_counts(doc: dict[str, Any]) -> tuple[int, int] | None:
    """(draft tokens, accepted draft tokens) of one request's speculative decoding, where the engine
    reports it: vLLM's ``metrics.speculative_decoding`` (``num_draft_tokens``,
    ``num_accepted_draft_tokens``) on its final usage chunk, or SGLang's
    ``sglext.spec_tokens_details`` (``spec_num_proposed_drafts``, ``spec_num_correct_drafts``; a list of
    them, one per choice, when the request asked for several: their sums)."""
    metrics = doc.get("metrics")
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if isinstance(spec, dict):
        drafts, accepted = _count(spec.get("num_draft_tokens")), _count(spec.get("num_accepted_draft_tokens"))
    else:
        ext = doc.get("sglext")
        spec = ext.get("spec_tokens_details") if isinstance(ext, dict) else None
        listed = spec if isinstance(spec, list) else [spec]  # a list: one per choice (n > 1)
        parts = [p for p in listed if isinstance(p, dict)]
        if not parts or len(parts) != len(listed):
            return None
        counts = [(_count(p.get("spec_num_proposed_drafts")), _count(p.get("spec_num_correct_drafts"))) for p in parts]
        if any(d is None or a is None for d, a in counts):
            return None
        drafts, accepted = sum(d or 0 for d, _ in counts), sum(a or 0 for _, a in counts)
    if drafts is None or accepted is None or accepted > drafts:
        return None
    return drafts, accepted


def _spread(events: Sequence[int], total: int) -> list[int]:
    """``total`` tokens spread evenly over the events (integers), summed per arrival."""
    n_events = sum(events)
    out: list[int] = []
    k = 0
    for n in events:
        out.append((k + n) * total // n_events - k * total // n_events)
        k += n
    return out


class Gaps:
    """One request's per-token gaps: ``values`` ascending; ``cum[i]`` the tokens whose gap is at most
    ``values[i]`` (None: one token each); ``total`` the sum over tokens."""

    __slots__ = ("values", "cum", "total")

    def __init__(self, values: list[float], cum: list[int] | None, total: float) -> None:
        self.values = values
        self.cum = cum
        self.total = total

    @classmethod
    def of(cls, raw: list[float], tokens: Sequence[int]) -> Gaps | None:
        """From the raw gaps and the tokens of the arrival each ends at (0: no observation)."""
        if tokens.count(1) == len(tokens):  # one token an arrival: the raw gaps themselves
            return cls(sorted(raw), None, sum(raw)) if raw else None
        if 0 in tokens:  # arrivals that carried no token make no observation
            kept = [(g, n) for g, n in zip(raw, tokens) if n > 0]
            if not kept:
                return None
            raw, tokens = [g for g, _ in kept], [n for _, n in kept]
        per = list(map(truediv, raw, tokens))  # C-level loops: this runs on the event loop at the end
        order = sorted(range(len(per)), key=per.__getitem__)
        return cls(list(map(per.__getitem__, order)), list(accumulate(map(tokens.__getitem__, order))), sum(raw))

    @property
    def count(self) -> int:
        return len(self.values) if self.cum is None else self.cum[-1]

    def count_le(self, bound: float) -> int:
        """Tokens whose gap is at most ``bound``."""
        i = bisect_right(self.values, bound)
        return i if self.cum is None or i == 0 else self.cum[i - 1]

    def percentile(self, q: float) -> float | None:
        return sorted_percentile(self.values, q, self.cum)

    def pairs(self) -> list[tuple[float, int]]:
        """(gap, tokens) pairs, smallest gap first (for tests and readers; the metrics use count_le)."""
        if self.cum is None:
            return [(v, 1) for v in self.values]
        return [(v, c - p) for v, c, p in zip(self.values, self.cum, [0, *self.cum])]


class DecodeTrack:
    """Stamps and token counts of one response's visible-text arrivals, kept in flat arrays."""

    __slots__ = ("stamps", "events", "ids", "used", "_ids_ok", "_used_ok", "_cum", "_last", "_chat", "text_events",
                 "second_t", "content_t", "reasoning_first", "reasoning_last", "tool_t", "reasoning_tokens", "spec")

    def __init__(self) -> None:
        self.stamps = array("d")  # one per arrival
        self.events = array("q")  # visible-text events per arrival
        self.ids = array("q")  # token ids per arrival, while every event has them
        self.used: list[int] = []  # usage increase per arrival, while every event has one (any size)
        self._ids_ok = True
        self._used_ok = True
        self._cum = 0  # completion_tokens of the latest usage read
        self._last = math.nan  # the latest arrival's stamp
        self._chat: bool | None = None  # the first text event had a delta (channels are read)
        self.text_events = 0
        self.second_t: float | None = None
        self.content_t: float | None = None
        self.reasoning_first: float | None = None
        self.reasoning_last: float | None = None
        self.tool_t: float | None = None
        self.reasoning_tokens: int | None = None
        self.spec: tuple[int, int] | None = None

    def text(self, now: float, choices: Any, completion: int | None) -> None:
        """One visible-text event at ``now`` (``choices``: its non-empty list); ``completion``: the usage
        on the same document."""
        new = self._arrive(now)
        first = choices[0]
        if self._ids_ok:
            got = first.get("token_ids") if type(first) is dict else None
            if type(got) is not list:
                self._ids_ok = False
            elif new:
                self.ids.append(len(got))
            else:
                self.ids[-1] += len(got)
        if self._used_ok:
            if completion is None:
                self._used_ok = False
            else:
                if new:
                    self.used.append(completion - self._cum)
                else:
                    self.used[-1] += completion - self._cum
                self._cum = completion
        if self._chat is None:
            self._chat = any(isinstance(c, dict) and isinstance(c.get("delta"), dict) for c in choices)
        if self._chat:
            self._channels(now, channel_mask(choices))

    def channel_text(self, now: float, mask: int) -> None:
        """One visible-text event of an endpoint whose events say their channel (Responses, Messages):
        no token ids, no usage per event."""
        self._ids_ok = self._used_ok = False
        self._arrive(now)
        self._channels(now, mask)

    def _arrive(self, now: float) -> bool:
        """Count one visible-text event at ``now``: a new arrival (True) unless the last event came in
        the same read (same stamp), which then holds one more event."""
        self.text_events += 1
        if self.text_events == 2:
            self.second_t = now
        if now != self._last:
            self._last = now
            self.stamps.append(now)
            self.events.append(1)
            return True
        self.events[-1] += 1
        return False

    def _channels(self, now: float, mask: int) -> None:
        if mask & CONTENT and self.content_t is None:
            self.content_t = now
        if mask & REASONING:
            if self.reasoning_first is None:
                self.reasoning_first = now
            self.reasoning_last = now
        if mask & TOOL and self.tool_t is None:
            self.tool_t = now

    def usage(self, completion: int, raw: Any, doc: dict[str, Any]) -> None:
        """A usage object (after :meth:`text` read the same document's)."""
        self._cum = completion
        n = reasoning_tokens(raw, doc)
        if n is not None:
            self.reasoning_tokens = n

    def _tokens(self, completion_tokens: int | None) -> Sequence[int] | None:
        """Tokens per arrival from the first source that gives every arrival after the first one."""
        n = len(self.stamps)
        for source, ok in ((self.ids, self._ids_ok), (self.used, self._used_ok)):
            if ok and len(source) == n and min(source[1:]) >= 1:
                return source
        if completion_tokens is not None and completion_tokens > 0:
            if completion_tokens == self.text_events and len(self.events) == self.events.count(1):
                return self.events  # one token an event, one event an arrival
            return _spread(self.events, completion_tokens)
        return None

    def summary(self, t0: float, completion_tokens: int | None, stall_s: float) -> tuple[dict[str, Any], Gaps | None]:
        """The record's decode fields, and the per-token gaps."""
        out: dict[str, Any] = dict.fromkeys(DECODE_FIELDS)
        out["ttfo_s"] = None if self.content_t is None else self.content_t - t0
        out["ttftc_s"] = None if self.tool_t is None else self.tool_t - t0
        if self.reasoning_first is not None and self.reasoning_last is not None:
            out["reasoning_s"] = self.reasoning_last - self.reasoning_first
        out["reasoning_tokens"] = self.reasoning_tokens
        if self.spec is not None:
            out["spec_draft_tokens"], out["spec_accepted_tokens"] = self.spec
        out["ttst_s"] = None if self.second_t is None else self.second_t - t0
        stamps = self.stamps
        if len(stamps) < 2:
            return out, None
        out["text_events"] = self.text_events
        out["merged_reads"] = len(self.events) - self.events.count(1)
        raw = [b - a for a, b in zip(stamps, stamps[1:])]
        out["decode_stalls"] = len([g for g in raw if g > stall_s])
        tokens = self._tokens(completion_tokens)
        if tokens is None:
            return out, None
        out["tokens_per_event"] = sum(tokens) / self.text_events
        gaps = Gaps.of(raw, tokens[1:])
        if gaps is not None:
            out["itl_p50_s"] = gaps.percentile(50)
            out["itl_p95_s"] = gaps.percentile(95)
            out["itl_p99_s"] = gaps.percentile(99)
            out["itl_max_s"] = gaps.values[-1]
        return out, gaps
