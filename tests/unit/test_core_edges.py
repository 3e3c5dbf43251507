"""Issue 19: three edges an outside fuzz campaign found, each on literal bytes."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.core.analysis import RequestSpec, analyze_bytes
from exporter.core.timefmt import iso
from exporter.core.usage import UsageEventFilter, inject_usage

USAGE_64 = b'{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}'  # 64 bytes
TEXT = b'data: {"choices":[{"text":"a"}]}\n\n'
DONE = b"data: [DONE]\n\n"


def _reason(body: bytes, max_event: int, streaming: bool = True) -> str | None:
    return analyze_bytes([(0.1, body)], spec=RequestSpec(stream=streaming), streaming=streaming,
                         max_event_bytes=max_event).reason


def test_an_event_of_exactly_max_event_bytes_is_kept() -> None:
    """As a line of exactly max_line_bytes and a body of exactly max_event_bytes are."""
    assert len(USAGE_64) == 64
    body = TEXT + b"data: " + USAGE_64 + b"\n\n" + DONE
    assert _reason(body, 64) is None  # was malformed: the bound counted a "\n" per line
    assert _reason(body, 63) == "malformed"
    line = len(b"data: " + USAGE_64)
    r = analyze_bytes([(0.1, body)], spec=RequestSpec(), max_line_bytes=line)
    assert r.ok and analyze_bytes([(0.1, body)], spec=RequestSpec(), max_line_bytes=line - 1).reason == "malformed"
    doc = b'{"choices":[{"text":"a"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}'
    assert _reason(doc, len(doc), streaming=False) is None
    assert _reason(doc, len(doc) - 1, streaming=False) == "malformed"


def test_the_bound_counts_the_joined_data_of_several_lines() -> None:
    """Data lines of 14 and 50 bytes join to 65 bytes (with their "\\n")."""
    cut = USAGE_64.index(b",") + 1  # '{"choices":[],' then the rest: a newline there is whitespace
    body = TEXT + b"data: " + USAGE_64[:cut] + b"\ndata: " + USAGE_64[cut:] + b"\n\n" + DONE
    assert _reason(body, 65) is None
    assert _reason(body, 64) == "malformed"


EVENT_74 = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\r\n\r\n'


def _filtered(body: bytes, cuts: list[int], bound: int) -> bytes:
    f = UsageEventFilter(bound)
    points = [0, *cuts, len(body)]
    return b"".join(f.feed(body[a:b]) for a, b in zip(points, points[1:])) + f.flush()


def test_the_usage_filter_does_not_depend_on_where_a_read_splits_a_crlf() -> None:
    """Issue 19's case (bound 73, reads split after byte 71 and byte 73), then every split into
    one, two or three reads, at bounds around what the event holds (72 bytes + 49 for its line)."""
    assert len(EVENT_74) == 74
    n = len(EVENT_74)
    for bound in (73, 120, 121, 122):
        whole = _filtered(EVENT_74, [], bound)
        assert _filtered(EVENT_74, [71, 73], bound) == whole, bound  # was empty against the whole
        outputs = {_filtered(EVENT_74, [a, b], bound) for a in range(1, n) for b in range(a, n)}
        outputs |= {_filtered(EVENT_74, [a], bound) for a in range(1, n)}
        assert outputs == {whole}, bound
        assert whole == (b"" if bound >= 121 else EVENT_74), bound  # held and left out, or passed


BOM_BODY = b'\xef\xbb\xbf{"stream":false,"ignore_eos":true,"max_tokens":5}'


def test_a_request_body_with_a_utf8_bom_is_read_as_the_engines_read_it() -> None:
    assert json.loads(BOM_BODY) == {"stream": False, "ignore_eos": True, "max_tokens": 5}
    assert RequestSpec.from_body(BOM_BODY) == RequestSpec(stream=False, expected_tokens=5)


def test_usage_is_injected_into_a_body_with_a_bom() -> None:
    body = b'\xef\xbb\xbf {"model":"m","stream":true}'
    spec = RequestSpec.from_body(body)
    assert spec == RequestSpec(stream=True, model="m")
    injected = inject_usage(body, spec)
    assert injected is not None and injected.startswith(b"\xef\xbb\xbf")
    assert json.loads(injected) == {"model": "m", "stream": True, "stream_options": {"include_usage": True}}


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"])
def test_utf16_and_utf32_bodies_are_read_but_not_rewritten(encoding: str) -> None:
    """json.loads of bytes reads these too; usage is not injected (it would need their encoding)."""
    body = '{"stream":true,"ignore_eos":true,"max_tokens":5,"model":"é"}'.encode(encoding)
    assert json.loads(body)["max_tokens"] == 5
    spec = RequestSpec.from_body(body)
    assert spec == RequestSpec(stream=True, expected_tokens=5, model="é")
    assert inject_usage(body, spec) is None


def test_lone_surrogates_read_as_json_loads_reads_them() -> None:
    body = b'{"stream":true,"model":"a\xed\xa0\x80"}'  # a UTF-8-encoded lone surrogate
    assert json.loads(body)["model"] == "a\ud800"
    assert RequestSpec.from_body(body) == RequestSpec(stream=True, model="a\ud800")


@settings(max_examples=300, deadline=None)
@given(times=st.lists(st.one_of(st.floats(min_value=0, max_value=4e9),
                                st.integers(0, 4_000_000_000).map(float),
                                st.integers(0, 4_000_000_000).map(lambda s: s - 1e-7)), min_size=1, max_size=6))
def test_iso_spells_every_time_as_strftime_does_whatever_came_before(times: list[float]) -> None:
    """The record's time strings: the last second's spelling is kept, never a stale one."""
    for t in times:
        whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))
        assert iso(t) == whole + "Z"
        assert iso(t, ms=True) == f"{whole}.{int(t % 1 * 1000):03d}Z"
