"""Issue 15's fuzz findings, one test each, on literal bytes (tests/transcripts.py FINDINGS)."""

from __future__ import annotations

import json

import pytest

import exporter.core.jsondepth as jsondepth
from exporter.core.analysis import RequestSpec, StreamAnalyzer, analyze_bytes
from exporter.core.content import is_event_stream
from exporter.core.jsondepth import MAX_DEPTH, loads, loads_exact, nesting_depth_exceeds

from tests.transcripts import FINDINGS, Finding


def _judge(f: Finding, reads: int = 1):
    size = max(1, -(-len(f.body) // reads))
    chunks = [(0.1 * (i + 1), f.body[i * size:(i + 1) * size]) for i in range(reads)]
    return analyze_bytes(chunks, spec=RequestSpec(stream=f.streaming), streaming=f.streaming,
                         max_line_bytes=f.max_line, max_event_bytes=f.max_event)


@pytest.mark.parametrize("finding", FINDINGS, ids=lambda f: f.name)
@pytest.mark.parametrize("fast", [True, False], ids=["orjson", "stdlib"])
@pytest.mark.parametrize("reads", [1, 7, 64])
def test_finding_gets_its_verdict(finding: Finding, fast: bool, reads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    if not fast:
        monkeypatch.setattr(jsondepth, "_orjson", None)
    r = _judge(finding, reads)
    assert r.reason == finding.reason, r.detail


def test_f1_deep_request_bodies_give_a_spec() -> None:
    assert RequestSpec.from_body(b"[" * 1000) == RequestSpec()
    deep = b'{"model":"m","stream":true,"max_tokens":3,"ignore_eos":true,"tools":' + b"[" * 5000 + b"]" * 5000 + b"}"
    assert RequestSpec.from_body(deep) == RequestSpec(stream=True, expected_tokens=3, model="m")
    assert RequestSpec.from_body(b'{"stream":true,"x":' + b"[" * 100_000) == RequestSpec()


def test_f1_depth_bound_is_the_same_for_both_parsers(monkeypatch: pytest.MonkeyPatch) -> None:
    ok = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    deep = b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)
    in_strings = b'["' + b"[" * 2000 + b'", "\\\\", "\\"{{{"]'
    for parse in (loads, loads_exact):
        assert parse(ok) == json.loads(ok) and parse(in_strings) == json.loads(in_strings)
        with pytest.raises(ValueError, match="deeper than 512"):
            parse(deep)
    monkeypatch.setattr(jsondepth, "_orjson", None)
    with pytest.raises(ValueError):
        loads(deep)
    assert not nesting_depth_exceeds(in_strings) and nesting_depth_exceeds(deep)


def test_f2_pending_event_memory_is_bounded() -> None:
    an = StreamAnalyzer(0.0, 200, RequestSpec(), streaming=True, max_line_bytes=1024, max_event_bytes=4096)
    for i in range(3000):  # 24,000 bytes of data lines and never a blank line
        an.feed(b"data:xy\n", i * 0.001)
        assert an._parser is not None and an._parser.pending_bytes <= 4096 + 1024
    r = an.finish(5.0)
    assert r.reason == "malformed" and "over 4096 bytes" in (r.detail or "")


def test_f2_non_streaming_body_is_bounded_by_max_event_bytes() -> None:
    body = b'{"choices":[{"text":"' + b"a" * 5000 + b'"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}'
    r = analyze_bytes([(0.1, body)], spec=RequestSpec(stream=False), streaming=False, max_event_bytes=4096)
    assert r.reason == "malformed" and "over 4096" in (r.detail or "")
    assert analyze_bytes([(0.1, body)], spec=RequestSpec(stream=False), streaming=False).ok


def test_f6_content_type_is_one_case_insensitive_decision() -> None:
    for ct in ("text/event-stream", "Text/Event-Stream", "TEXT/EVENT-STREAM; charset=utf-8", " text/event-stream ;x=1"):
        assert is_event_stream(ct, False) is True
    for ct in ("application/json", "text/event-streamx", "text/plain; x=text/event-stream"):
        assert is_event_stream(ct, True) is False
    assert is_event_stream(None, True) is True and is_event_stream("", False) is False
    assert is_event_stream("  ", True) is True


def test_f6_proxy_and_load_driver_use_the_same_decision() -> None:
    import exporter.harness.load as load
    import exporter.proxy.wire.relay as relay

    assert load.is_event_stream is is_event_stream and relay.is_event_stream is is_event_stream


def _nest(depth: int, wrap) -> object:
    value: object = "x"
    for _ in range(depth):
        value = wrap(value)
    return value


def test_f1_walks_after_parsing_never_recurse() -> None:
    """Text counting, the reasoning comparison and the error message look a fixed depth in."""
    from exporter.core.visible import error_message, visible_chars

    parts = _nest(5000, lambda v: [{"type": "text", "text": v}])
    lists_a, lists_b = _nest(5000, lambda v: [v]), _nest(5000, lambda v: [v])
    delta = {"content": parts, "reasoning": lists_a, "reasoning_content": lists_b}
    assert visible_chars([{"delta": delta, "text": "ab"}]) == 2
    message = error_message({"error": {"message": lists_a}})
    assert message is not None and len(message) <= 200
    assert error_message({"error": lists_b}) is not None
