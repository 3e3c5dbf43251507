"""Issue 19: per-stream memory is bounded in bytes held, measured with tracemalloc.

The bound used to count payload bytes: 24 MiB of ``data:xy`` lines held 131 MiB in one
StreamAnalyzer (one bytes object and one list slot per line).  The data of an event is now joined
as it comes, and the usage filter counts each held line's overhead.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import pytest

from exporter.core.analysis import RequestSpec, StreamAnalyzer
from exporter.core.sse import SSEParser
from exporter.core.usage import UsageEventFilter

READ = 64 << 10  # one read of the upstream, as aiohttp hands it over
BOUND = 256 << 10  # the bound under test: past it, what a line costs would show many times over
LINES = b"data:xy\n" * (READ // 8)  # short data lines, never a blank line
SLACK = 32 << 10  # what may be held beyond the bound: buffer slack, object headers


def _held(feed: Callable[[bytes], object], chunk: bytes, reads: int) -> tuple[int, int]:
    """(most memory held after a read, peak during the reads), beyond what was held before."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        held = 0
        for _ in range(reads):
            feed(chunk)
            held = max(held, tracemalloc.get_traced_memory()[0] - base)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return held, peak


def test_an_event_of_short_lines_holds_its_data_not_an_object_per_line() -> None:
    """8-byte lines: their joined data just under the bound, held at about the bound (an object per
    line held 14 times as much), and handed out whole at the blank line."""
    bound = BOUND
    parser = SSEParser(max_event_bytes=bound)
    reads = bound // (3 * (READ // 8))  # each line adds "xy" and its "\n" to the joined data
    held, peak = _held(parser.feed, LINES, reads)
    assert parser.pending_bytes <= bound and not parser.overflow
    assert held <= bound + SLACK, held
    assert peak <= held + 8 * READ, (peak, held)  # a read's lines, split, while it is parsed
    assert abs(parser.held_bytes() - held) <= SLACK  # held_bytes() measures what is held
    (event,) = parser.feed(b"\n")
    assert event.data == b"\n".join([b"xy"] * (reads * READ // 8)) and event.problem is None
    assert parser.held_bytes() <= 1024


def test_a_stream_analyzer_past_the_bound_holds_at_most_the_bound() -> None:
    bound = BOUND
    an = StreamAnalyzer(0.0, 200, RequestSpec(), streaming=True, max_event_bytes=bound)
    held, _ = _held(lambda chunk: an.feed(chunk, 0.1), LINES, 3 * bound // READ)
    assert held <= bound + SLACK, held
    r = an.finish(1.0)
    assert r.reason == "malformed" and r.detail == f"SSE event over {bound} bytes"


@pytest.mark.slow
def test_the_issue_case_24_mib_of_data_lines_at_the_default_bound() -> None:
    """The issue's own figures: 24 MiB fed to one StreamAnalyzer with the default 16 MiB bound."""
    an = StreamAnalyzer(0.0, 200, RequestSpec(), streaming=True)
    held, _ = _held(lambda chunk: an.feed(chunk, 0.1), LINES, (24 << 20) // READ)
    assert held <= (16 << 20) + SLACK, held


def test_the_usage_filter_holds_at_most_its_bound() -> None:
    """Short lines held by the usage filter: memory, not payload, reaches the bound; the event
    then passes through unchanged, and a later usage-only event is still left out."""
    bound = BOUND
    f = UsageEventFilter(bound)
    out: list[bytes] = []
    reads = bound // READ
    held, _ = _held(lambda chunk: out.append(f.feed(chunk)), LINES, reads)
    out_bytes = sum(map(len, out))
    assert held - out_bytes <= bound + SLACK, (held, out_bytes)
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\n'
    rest = f.feed(b"\n" + usage + b"data: [DONE]\n\n") + f.flush()
    assert b"".join(out) + rest == LINES * reads + b"\ndata: [DONE]\n\n"


def test_long_and_short_lines_join_exactly_whatever_the_reads() -> None:
    """Values around the 64 KiB block size, short ones between: the data joined as SSE says."""
    values = [b"a", b"b" * (100 << 10), b"", b"c" * ((64 << 10) - 1), b"d" * (64 << 10), b"e" * 70_000, b"f"]
    body = b"".join(b"data: " + v + b"\r\n" for v in values) + b"\r\n"
    want = b"\n".join(values)
    for size in (len(body), 4096, 65536, 1000):
        parser = SSEParser(max_event_bytes=len(want))
        events = [e for i in range(0, len(body), size) for e in parser.feed(body[i:i + size])]
        assert [e.data for e in events] == [want] and events[0].problem is None
    parser = SSEParser(max_event_bytes=len(want) - 1)
    assert [e.problem for e in parser.feed(body)] == [f"SSE event over {len(want) - 1} bytes"]
