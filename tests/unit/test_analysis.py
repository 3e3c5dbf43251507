from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.core.analysis import RequestSpec, StreamAnalyzer, analyze_bytes, visible_chars
from exporter.core.sse import SSEParser

from tests.transcripts import CASES, Case, sse


def _judge(case: Case, cuts: list[int] | None = None, step: float = 0.01):
    body = case.body
    points = sorted(set(c for c in (cuts or []) if 0 < c < len(body)))
    pieces, prev = [], 0
    for c in [*points, len(body)]:
        if c > prev:
            pieces.append(body[prev:c])
        prev = c
    chunks = [(0.1 + i * step, p) for i, p in enumerate(pieces)]
    spec = RequestSpec(stream=case.streaming, expected_tokens=case.expected)
    return analyze_bytes(chunks, status=case.status, spec=spec, streaming=case.streaming)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_verdict_table(case: Case) -> None:
    result = _judge(case)
    assert result.reason == case.reason, result.detail
    assert result.outcome == ("success" if case.reason is None else "failure")
    assert result.completion_tokens == case.completion_tokens


def test_seed_empty_text_is_failure_and_counted_as_empty_200() -> None:
    case = next(c for c in CASES if c.name == "vllm_seed_empty_text_128")
    r = _judge(case)
    assert (r.status, r.done, r.usage, r.completion_tokens, r.visible_chars) == (200, True, True, 128, 0)
    assert r.reason == "empty_text" and r.empty_text_200 and r.ttft_s is None


def test_ttft_skips_empty_chunks_and_tpot_uses_usage() -> None:
    body = sse('{"choices":[{"text":""}]}', '{"choices":[{"text":"a"}]}', '{"choices":[{"text":"bc"}]}',
               '{"choices":[{"text":"d"}]}', '{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":5}}',
               "[DONE]")
    events = body.split(b"\n\n")[:-1]
    an = StreamAnalyzer(10.0, 200, RequestSpec(expected_tokens=5), streaming=True)
    for i, ev in enumerate(events):  # one event per read at t = 10.5, 11.0, 11.5 ...
        an.feed(ev + b"\n\n", 10.5 + 0.5 * i)
    r = an.finish(14.0)
    assert r.ok
    assert r.ttft_s == pytest.approx(1.0)  # the empty first chunk at 10.5 does not count
    assert r.tpot_s == pytest.approx((12.0 - 11.0) / (5 - 1))
    assert r.e2e_s == pytest.approx(4.0)
    assert r.visible_chars == 4


def test_tpot_undefined_for_single_token() -> None:
    r = analyze_bytes([(0.2, sse('{"choices":[{"text":"a"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}', "[DONE]"))])
    assert r.ok and r.tpot_s is None and r.ttft_s == pytest.approx(0.2)


def test_transport_reasons_take_precedence() -> None:
    case = next(c for c in CASES if c.name == "vllm_completions_ok")
    an = StreamAnalyzer(0.0, 200, RequestSpec(), streaming=True)
    an.feed(case.body[:40], 0.1)
    r = an.finish(0.2, "upstream_disconnect", "ServerDisconnectedError")
    assert (r.outcome, r.reason, r.detail) == ("failure", "upstream_disconnect", "ServerDisconnectedError")
    assert not r.empty_text_200
    r2 = StreamAnalyzer(0.0, 200, RequestSpec(), streaming=True).finish(0.1, "client_abort")
    assert r2.outcome == "client_abort"


def test_oversized_line_is_malformed_and_bounded() -> None:
    an = StreamAnalyzer(0.0, 200, RequestSpec(), streaming=True, max_line_bytes=1024)
    an.feed(b"data: " + b"x" * 600, 0.1)
    an.feed(b"y" * 600, 0.2)
    an.feed(b"z" * 100_000 + b"\n\ndata: [DONE]\n\n", 0.3)
    assert an._parser is not None and an._parser.pending_bytes == 0
    r = an.finish(0.4)
    assert r.reason == "malformed" and "over 1024 bytes" in (r.detail or "")


def test_request_spec() -> None:
    assert RequestSpec.from_body(b'{"stream":true,"ignore_eos":true,"max_tokens":128}') == RequestSpec(True, 128)
    assert RequestSpec.from_body(b'{"ignore_eos":true,"max_completion_tokens":7,"max_tokens":9}').expected_tokens == 7
    assert RequestSpec.from_body(b'{"stream":true,"max_tokens":128}') == RequestSpec(True, None)
    assert RequestSpec.from_body(b"\xff not json") == RequestSpec()
    assert RequestSpec.from_body(b"[1]") == RequestSpec()


def test_visible_chars_shapes() -> None:
    assert visible_chars([]) == 0
    assert visible_chars(None) == 0
    assert visible_chars([{"delta": {"role": "assistant", "content": ""}}]) == 0
    assert visible_chars([{"delta": {"reasoning": "ab", "reasoning_content": "ab"}}]) == 2
    assert visible_chars([{"message": {"content": [{"type": "text", "text": "abc"}]}}]) == 3


def test_sse_parser_fields() -> None:
    p = SSEParser()
    events = p.feed(b"event: error\ndata: a\ndata:b\nid: 1\nretry: 5\n\n: c\n\nfoo\n\n")
    assert [(e.name, e.data) for e in events] == [("error", b"a\nb")]


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(CASES), cuts=st.lists(st.integers(min_value=1, max_value=4000), max_size=40))
def test_rechunking_changes_nothing(case: Case, cuts: list[int]) -> None:
    whole = _judge(case)
    split = _judge(case, cuts)
    assert (split.reason, split.completion_tokens, split.prompt_tokens, split.visible_chars, split.done) == (
        whole.reason, whole.completion_tokens, whole.prompt_tokens, whole.visible_chars, whole.done)


@pytest.mark.parametrize("case", [c for c in CASES if c.streaming], ids=lambda c: c.name)
def test_every_single_byte_boundary(case: Case) -> None:
    """Byte-by-byte feeding: splits inside CRLF, UTF-8 characters and 'data:' alike."""
    r = _judge(case, list(range(1, len(case.body))))
    assert r.reason == case.reason


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_same_verdict_without_orjson(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    """The standard-library parser and orjson (the ``fast`` extra) judge alike."""
    import exporter.core.jsondepth as core

    with_fast = _judge(case)
    monkeypatch.setattr(core, "_orjson", None)
    plain = _judge(case)
    assert (plain.reason, plain.completion_tokens, plain.visible_chars) == (
        with_fast.reason, with_fast.completion_tokens, with_fast.visible_chars)


def test_loads_falls_back_for_what_orjson_refuses() -> None:
    from exporter.core.analysis import loads

    assert loads(b'{"logprob": -Infinity, "n": 123456789012345678901234567890}')["n"] == 123456789012345678901234567890
    with pytest.raises(ValueError):
        loads(b"{broken")
    with pytest.raises(ValueError):  # UnicodeDecodeError is a ValueError
        loads(b'{"text": "\xff"}')  # not UTF-8


def test_ttfe_counts_empty_text_chunks_ttft_does_not() -> None:
    """SPEC 12: ttfe_s is the first event with a non-empty ``choices`` (vLLM's bench TTFT)."""
    empty = '{"choices":[{"index":0,"text":"","finish_reason":null}]}'
    body = [sse(empty), sse(empty), sse('{"choices":[]}'), sse('{"choices":[{"text":"hi"}]}'),
            sse('{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}', "[DONE]")]
    an = StreamAnalyzer(100.0, 200, RequestSpec(), streaming=True)
    an.feed(b": keep-alive\n\n", 100.05)  # the first body byte: a comment
    for t, read in zip((100.1, 100.2, 100.5, 102.0, 102.1), body):
        an.feed(read, t)
    r = an.finish(102.2)
    assert r.ok
    assert r.ttfb_s == pytest.approx(0.05) and r.ttfe_s == pytest.approx(0.1) and r.ttft_s == pytest.approx(2.0)
    assert {"ttfb_s", "ttfe_s", "ttft_s"} <= set(r.as_dict())


def test_ttfb_and_ttfe_of_a_non_streaming_body() -> None:
    """A JSON body arrives whole: ttfe and ttft are the time it was complete, ttfb its first byte."""
    body = b'{"choices":[{"text":"hello"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}'
    r = analyze_bytes([(0.2, body[:10]), (0.7, body[10:])], spec=RequestSpec(stream=False), streaming=False, end=0.8)
    assert r.ok and (r.ttfb_s, r.ttfe_s, r.ttft_s) == (0.2, 0.8, 0.8)
    empty = analyze_bytes([(0.2, b'{"choices":[]}')], spec=RequestSpec(stream=False), streaming=False)
    assert (empty.ttfb_s, empty.ttfe_s, empty.ttft_s) == (0.2, None, None)
    none = StreamAnalyzer(0.0, None, RequestSpec(), streaming=True).finish(1.0, "connect_error")
    assert (none.ttfb_s, none.ttfe_s, none.ttft_s) == (None, None, None)


def test_a_short_answer_names_the_tokens_in_all() -> None:
    """An engine that stops at its context length answers fewer tokens than asked: the detail adds
    prompt and completion up, the figure to hold against the model's context length; a longer
    answer than asked has no such cause and gets no sum."""
    def detail(prompt: int, done: int) -> str | None:
        usage = f'{{"choices":[{{"text":"a"}}],"usage":{{"prompt_tokens":{prompt},"completion_tokens":{done}}}}}'
        r = analyze_bytes([(0.2, sse(usage, "[DONE]"))], spec=RequestSpec(stream=True, expected_tokens=128))
        assert r.reason == "length_mismatch"
        return r.detail

    assert detail(1958, 90) == ("completion_tokens 90 != requested 128 (prompt 1958 + completion 90 = 2048 tokens: "
                                "the model's context length, if it is 2048)")
    assert detail(10, 130) == "completion_tokens 130 != requested 128"
