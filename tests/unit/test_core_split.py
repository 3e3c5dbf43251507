"""Issue 26, item 6: the core's output does not depend on how the stream is split into reads.

The usage filter's bytes and the analyzer's result are compared, for several inputs at several
bounds, between the stream read whole and every split of it into two and three reads.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.core.analysis import RequestSpec, Result, StreamAnalyzer
from exporter.core.usage import LINE_COST, UsageEventFilter

#: Issue 26's case: a comment of 40 bytes, its CRLF, then a usage-only event.
COMMENT_THEN_USAGE = b":" + b"c" * 39 + b'\r\ndata: {"choices":[],"usage":{}}\r\n\r\n'
USAGE = b'{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}'
TEXT = b'data: {"id":"r","choices":[{"text":"ab"}]}'

INPUTS: dict[str, bytes] = {
    "comment_then_usage": COMMENT_THEN_USAGE,
    "comment_inside_usage": b"data: " + USAGE + b"\r\n: keep\r\n\r\n" + TEXT + b"\r\n\r\n",
    "bom_cr_only": b"\xef\xbb\xbf: x\r" + TEXT + b"\r\r" + b"data: " + USAGE + b"\r\rdata: [DONE]\r\r",
    "mixed_endings": TEXT + b"\n\r\n" + b"data: " + USAGE + b"\r\n\n: c\r\rdata: [DONE]\r\n\r\n",
    "multiline_usage": b'data: {"choices":[],\r\ndata: "usage":{"prompt_tokens":1,"completion_tokens":1}}\r\n\r\n'
                       + b"event: e\r\n" + TEXT + b"\r\n\r\n",
    "blank_lines": b"\r\n\r\n\n" + TEXT + b"\r\n\r\n\r\n" + b"data: " + USAGE + b"\r\n\r\n",
}
#: bounds around what each input's events hold, the per-line cost included
BOUNDS = (1, 40, 64, 65, 89, 90, 91, 120, 121, 122, 1 << 20)


def _reads(body: bytes, cuts: tuple[int, ...]) -> list[bytes]:
    points = [0, *cuts, len(body)]
    return [body[a:b] for a, b in zip(points, points[1:], strict=False)]


def _filtered(reads: list[bytes], bound: int) -> bytes:
    f = UsageEventFilter(bound)
    return b"".join(f.feed(r) for r in reads) + f.flush()


def _analyzed(reads: list[bytes], bound: int) -> Result:
    a = StreamAnalyzer(0.0, 200, RequestSpec(stream=True), streaming=True,
                       max_line_bytes=bound, max_event_bytes=bound)
    for r in reads:
        a.feed(r, 1.0)  # one arrival time: only the split differs
    return a.finish(2.0)


def _splits(body: bytes) -> list[tuple[int, ...]]:
    """Every split into two reads, every one-byte read, and every split into three whose first
    cut is next to a line end (where a read's end leaves state for the next)."""
    n = len(body)
    near_ends = sorted({c for i, b in enumerate(body) if b in b"\r\n" for c in (i, i + 1, i + 2) if 0 < c < n})
    three = [(a, b) for a in near_ends for b in range(a + 1, n)]
    return [(), *((c,) for c in range(1, n)), *three, tuple(range(1, n))]


def test_a_comment_then_a_usage_event_split_after_the_comments_cr() -> None:
    """Read whole, the usage event was passed (77 bytes); split after the comment's CR, it was
    dropped (42): the LF was counted for the comment line in one case only.  A comment line
    before an event's first field line is not held, so it does not count against the bound."""
    assert len(COMMENT_THEN_USAGE) == 77 and LINE_COST + 41 == 90
    comment = b":" + b"c" * 39 + b"\r\n"
    whole = _filtered([COMMENT_THEN_USAGE], 90)
    split = _filtered(_reads(COMMENT_THEN_USAGE, (41,)), 90)
    assert (whole, split) == (comment, comment)
    assert len(whole) == 42


def test_a_long_comment_line_is_not_held() -> None:
    f = UsageEventFilter(90)  # holds the usage event's line (32 bytes + LINE_COST), not the comment
    assert f.feed(b": " + b"c" * 1000) == b": " + b"c" * 1000  # passed on as it comes
    assert f.feed(b"\r") == b"\r" and f.feed(b'\ndata: {"choices":[],"usage":{}}\n\n') == b"\n"
    assert f.flush() == b""


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_the_usage_filter_gives_the_same_bytes_for_every_split(name: str) -> None:
    body = INPUTS[name]
    splits = _splits(body)
    for bound in BOUNDS:
        whole = _filtered([body], bound)
        bad = [cuts for cuts in splits if _filtered(_reads(body, cuts), bound) != whole]
        assert not bad, (bound, bad[:3])


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_the_analyzer_gives_the_same_result_for_every_split(name: str) -> None:
    body = INPUTS[name]
    splits = _splits(body)
    for bound in BOUNDS:
        whole = _analyzed([body], bound)
        bad = [cuts for cuts in splits if _analyzed(_reads(body, cuts), bound) != whole]
        assert not bad, (bound, bad[:3])


#: pieces an SSE stream is made of: any sequence of them is a stream to split
TOKENS = [b"\r", b"\n", b"\r\n", b":", b": c", b"data: ", b"data:", b"event: x", b"id: 1", b"\xef\xbb\xbf",
          USAGE, b'{"choices":[],', b'"usage":{}}', TEXT, b"data: [DONE]", b"c" * 30]


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.sampled_from(TOKENS), max_size=14), cuts=st.lists(st.integers(0, 400), max_size=6),
       bound=st.integers(1, 260))
def test_any_stream_any_split_any_bound(parts: list[bytes], cuts: list[int], bound: int) -> None:
    body = b"".join(parts)
    reads = _reads(body, tuple(sorted({c % (len(body) + 1) for c in cuts})))
    assert _filtered(reads, bound) == _filtered([body], bound)
    assert _analyzed(reads, bound) == _analyzed([body], bound)


def test_the_bounds_matter_for_these_inputs() -> None:
    """The comparison above is not between outputs that never change: the bounds decide."""
    assert len({_filtered([INPUTS["comment_inside_usage"]], b) for b in BOUNDS}) > 1
    assert len({_analyzed([INPUTS["mixed_endings"]], b).reason for b in BOUNDS}) > 1
