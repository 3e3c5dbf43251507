"""SPEC 13: usage injected into the request, the usage-only event left out of the client's stream."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.core.request import RequestSpec
from exporter.core.usage import UsageEventFilter, inject_usage

USAGE = b'{"id":"u","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}'
# Each block: its lines and whether the usage filter drops its field lines and blank line.
BLOCKS: dict[str, tuple[list[bytes], bool]] = {
    "usage": ([b"data: " + USAGE], True),
    "usage_nospace": ([b"data:" + USAGE], True),
    "usage_multiline": ([b'data: {"choices":[],', b'data: "usage":{"prompt_tokens":1,"completion_tokens":1}}'], True),
    "usage_with_comment_and_id": ([b": inside", b"id: 9", b"data: " + USAGE], True),
    "sglang_usage_chunk": ([b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,'
                            b'"reasoning_tokens":0},"model":"m"}'], True),
    "named_usage": ([b"event: usage", b"data: " + USAGE], False),
    "text": ([b'data: {"choices":[{"text":"hi"}],"usage":null}'], False),
    "usage_on_text_chunk": ([b'data: {"choices":[{"text":"a"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}'],
                            False),
    "usage_null": ([b'data: {"choices":[],"usage":null}'], False),
    "error": ([b'data: {"error":{"message":"x"}}'], False),
    "bad_json": ([b'data: {"choices":[],"usage":{'], False),
    "done": ([b"data: [DONE]"], False),
    "comment": ([b": keep-alive"], False),
    "blank": ([], False),
}


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """(a stream, the same stream without its usage-only events), line endings mixed."""
    names = draw(st.lists(st.sampled_from(sorted(BLOCKS)), max_size=10))
    parts: list[tuple[bytes, bool]] = []
    if draw(st.booleans()) and draw(st.booleans()):
        parts.append((b"\xef\xbb\xbf", False))
    last_cr = False
    for i, name in enumerate(names):
        lines, drop = BLOCKS[name]
        ends_stream = i == len(names) - 1 and draw(st.booleans())
        for text in [*lines, *([] if ends_stream and lines else [b""])]:
            eol = draw(st.sampled_from([b"\n", b"\r\n", b"\r"]))
            if last_cr and not text and eol == b"\n":
                eol = b"\r\n"  # a lone LF after a CR would be the CR's own line end
            parts.append((text + eol, drop and text[:1] != b":"))
            last_cr = eol == b"\r"
    return b"".join(p for p, _ in parts), b"".join(p for p, d in parts if not d)


def _through(body: bytes, cuts: list[int], max_event: int = 16 << 20) -> bytes:
    f = UsageEventFilter(max_event)
    points = sorted({c % (len(body) + 1) for c in cuts})
    pieces = [body[a:b] for a, b in zip([0, *points], [*points, len(body)])]
    return b"".join(f.feed(p) for p in pieces) + f.flush()


@settings(max_examples=200, deadline=None)
@given(stream=streams(), cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30))
def test_filter_drops_exactly_the_usage_only_events(stream: tuple[bytes, bytes], cuts: list[int]) -> None:
    body, expected = stream
    assert _through(body, cuts) == expected


@settings(max_examples=50, deadline=None)
@given(stream=streams(), cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30))
def test_filter_passes_an_event_over_its_bound_unchanged(stream: tuple[bytes, bytes], cuts: list[int]) -> None:
    body, _ = stream
    assert _through(body, cuts, max_event=16) == body  # every event is over 16 bytes: nothing is held back


def test_every_single_byte_split() -> None:
    body = b": c\r\n\r\ndata: " + USAGE + b"\r\r" + b'data: {"choices":[{"text":"a"}]}\r\n\r\ndata: ' + USAGE + b"\r\n\r\ndata: [DONE]\r\n\r\n"
    expected = b': c\r\n\r\ndata: {"choices":[{"text":"a"}]}\r\n\r\ndata: [DONE]\r\n\r\n'
    assert _through(body, list(range(len(body)))) == expected


def test_inject_keeps_the_body_and_other_options() -> None:
    body = b'{"model":"m","prompt":"p","stream":true,"stream_options":{"continuous_usage_stats":true}} \n'
    spec = RequestSpec.from_body(body)
    new = inject_usage(body, spec)
    assert new is not None and new.startswith(body[:-3])
    assert json.loads(new) == {"model": "m", "prompt": "p", "stream": True,
                               "stream_options": {"continuous_usage_stats": True, "include_usage": True}}
    assert RequestSpec.from_body(new).wants_usage


def test_inject_only_where_usage_is_missing() -> None:
    cases = {
        b'{"stream":true,"stream_options":{"include_usage":true}}': False,
        b'{"stream":false}': False,
        b'{"prompt":"x"}': False,
        b'{"stream":true,"stream_options":"bad"}': False,
        b'{"stream":true,"stream_options":{"include_usage":false}}': True,
        b'{"stream":true,"stream_options":null}': True,
        b'{"stream":true}': True,
    }
    for body, injected in cases.items():
        new = inject_usage(body, RequestSpec.from_body(body))
        assert (new is not None) == injected, body
        if new is not None:
            assert json.loads(new)["stream_options"]["include_usage"] is True
    assert inject_usage(b"{ }", RequestSpec(stream=True)) == b'{ "stream_options":{"include_usage":true}}'
    assert inject_usage(b"[1]", RequestSpec(stream=True)) is None
