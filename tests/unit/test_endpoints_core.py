"""Responses, Messages, embeddings and rerank judged by the core: visible text, usage, their own end
events, error events, the fixed length; one vector per input, one result per document or top_n."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.core.analysis import RequestSpec, Result, analyze_bytes
from exporter.core.endpoints import MessagesReader, ResponsesReader, count_inputs, endpoint_of, pooling_problem
from exporter.core.usage import inject_usage


def _ev(name: str, doc: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(doc)}\n\n".encode()


def _resp(kind: str, **extra: Any) -> bytes:
    return _ev(kind, {"type": kind, "sequence_number": 0, **extra})


def _usage_response(status: str = "completed", out: int = 3, **extra: Any) -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "status": status,
            "usage": {"input_tokens": 5, "output_tokens": out, "total_tokens": 5 + out}, **extra}


RESPONSES = [
    _resp("response.created", response={"id": "resp_1", "status": "in_progress", "usage": None}),
    _resp("response.reasoning_text.delta", item_id="rs_1", delta="hmm"),
    _resp("response.output_text.delta", item_id="msg_1", delta="Hello"),
    _resp("response.output_text.delta", item_id="msg_1", delta=""),
    _resp("response.output_text.delta", item_id="msg_1", delta=" world"),
    _resp("response.output_text.done", item_id="msg_1", text="Hello world"),
    _resp("response.completed", response=_usage_response()),
]


def _judge(events: list[bytes], endpoint: str, expected: int | None = None, stream: bool = True,
           status: int = 200) -> Result:
    """Each event its own read, 0.1 s apart."""
    spec = RequestSpec(stream=stream, expected_tokens=expected, endpoint=endpoint)
    return analyze_bytes([(0.1 * (i + 1), e) for i, e in enumerate(events)], spec=spec, streaming=stream,
                         status=status)


def test_responses_stream_succeeds_without_done() -> None:
    r = _judge(RESPONSES, "responses", expected=3)
    assert r.ok, r.detail
    assert (r.prompt_tokens, r.completion_tokens) == (5, 3)
    assert r.visible_chars == len("hmmHello world")
    assert r.ttft_s == pytest.approx(0.2) and r.ttfo_s == pytest.approx(0.3)
    assert r.reasoning_s == 0.0 and r.text_events == 3
    assert r.tpot_s == pytest.approx((0.5 - 0.2) / 2)
    assert r.e2e_s == pytest.approx(0.7)


def test_responses_fixed_length_and_missing_end() -> None:
    r = _judge(RESPONSES, "responses", expected=4)
    assert r.reason == "length_mismatch"
    r = _judge(RESPONSES[:-1], "responses")
    assert r.reason == "missing_done" and "response.completed" in (r.detail or "")


@pytest.mark.parametrize(("reason", "ok"), [("max_output_tokens", True), ("content_filter", False)])
def test_responses_incomplete_ends_only_when_capped(reason: str, ok: bool) -> None:
    end = _resp("response.incomplete", response=_usage_response(
        "incomplete", incomplete_details={"reason": reason}))
    r = _judge([*RESPONSES[:-1], end], "responses", expected=3)
    assert r.ok is ok and (ok or r.reason == "missing_done")
    assert r.completion_tokens == 3


@pytest.mark.parametrize("failure", [
    _resp("response.failed", response=_usage_response("failed", error={"code": "server_error", "message": "boom"})),
    _resp("error", code="invalid_request", message="bad things"),
])
def test_responses_failed_and_error_events_are_sse_errors(failure: bytes) -> None:
    r = _judge([*RESPONSES[:3], failure, RESPONSES[-1]], "responses")
    assert r.reason == "sse_error" and r.detail in ("boom", "bad things")


def test_responses_tool_call_without_prose_is_not_empty() -> None:
    r = _judge([_resp("response.function_call_arguments.delta", item_id="fc_1", delta='{"q":'),
                _resp("response.function_call_arguments.delta", item_id="fc_1", delta='1}'),
                _resp("response.completed", response=_usage_response(out=2))], "responses")
    assert r.ok and r.ttftc_s == pytest.approx(0.1) and r.ttfo_s is None


def test_responses_not_streamed() -> None:
    doc = {**_usage_response(), "output": [
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {"type": "message", "content": [{"type": "output_text", "text": "Hello"}]}]}
    r = _judge([json.dumps(doc).encode()], "responses", expected=3, stream=False)
    assert r.ok and r.visible_chars == 7 and r.completion_tokens == 3
    failed = {**_usage_response("failed"), "output": [], "error": {"message": "nope"}}
    assert _judge([json.dumps(failed).encode()], "responses", stream=False).reason == "sse_error"


def _msg(kind: str, **extra: Any) -> bytes:
    return _ev(kind, {"type": kind, **extra})


def _delta(kind: str, key: str, text: str) -> bytes:
    return _msg("content_block_delta", index=0, delta={"type": kind, key: text})


MESSAGES = [
    _msg("message_start", message={"id": "msg_1", "type": "message", "role": "assistant", "content": [],
                                   "usage": {"input_tokens": 6, "output_tokens": 1}}),
    _msg("content_block_start", index=0, content_block={"type": "thinking", "thinking": ""}),
    _delta("thinking_delta", "thinking", "let me see"),
    _msg("ping"),
    _delta("text_delta", "text", "Hi"),
    _delta("text_delta", "text", " there"),
    _msg("content_block_stop", index=0),
    _msg("message_delta", delta={"stop_reason": "max_tokens", "stop_sequence": None}, usage={"output_tokens": 4}),
    _msg("message_stop"),
]


def test_messages_stream_takes_input_tokens_from_message_start() -> None:
    r = _judge(MESSAGES, "messages", expected=4)
    assert r.ok, r.detail
    assert (r.prompt_tokens, r.completion_tokens) == (6, 4)
    assert r.ttft_s == pytest.approx(0.3) and r.ttfo_s == pytest.approx(0.5)
    assert r.text_events == 3 and r.visible_chars == len("let me seeHi there")


def test_messages_prompt_tokens_include_the_cached_ones() -> None:
    """vLLM: message_start's usage is zeros; message_delta's has the real one, cached tokens apart."""
    start = _msg("message_start", message={"id": "m", "type": "message", "role": "assistant", "content": [],
                                           "usage": {"input_tokens": 0, "output_tokens": 0}})
    end = _msg("message_delta", delta={"stop_reason": "max_tokens"},
               usage={"input_tokens": 2, "cache_read_input_tokens": 16, "output_tokens": 4})
    r = _judge([start, *MESSAGES[2:7], end, MESSAGES[-1]], "messages", expected=4)
    assert r.ok and (r.prompt_tokens, r.completion_tokens) == (18, 4)


def test_messages_error_then_stop_is_still_a_failure() -> None:
    error = _msg("error", error={"type": "overloaded_error", "message": "Overloaded"})
    r = _judge([*MESSAGES[:5], error, MESSAGES[-1]], "messages")
    assert r.reason == "sse_error" and r.detail == "Overloaded"


def test_messages_without_stop_or_usage() -> None:
    assert _judge(MESSAGES[:-1], "messages").reason == "missing_done"
    no_usage = [e for e in MESSAGES if b"message_delta" not in e]
    assert _judge(no_usage, "messages").reason == "missing_usage"
    assert _judge(MESSAGES, "messages", expected=5).reason == "length_mismatch"


def test_messages_tool_input_is_visible() -> None:
    events = [MESSAGES[0], _delta("input_json_delta", "partial_json", '{"city": "Paris"}'),
              MESSAGES[-2], MESSAGES[-1]]
    r = _judge(events, "messages")
    assert r.ok and r.ttftc_s == pytest.approx(0.2)


def test_messages_not_streamed() -> None:
    doc = {"id": "msg_1", "type": "message", "role": "assistant", "content": [{"type": "text", "text": "Hi"}],
           "usage": {"input_tokens": 6, "output_tokens": 2}}
    r = _judge([json.dumps(doc).encode()], "messages", expected=2, stream=False)
    assert r.ok and (r.prompt_tokens, r.completion_tokens) == (6, 2)
    err = {"type": "error", "error": {"type": "invalid_request_error", "message": "no"}}
    assert _judge([json.dumps(err).encode()], "messages", stream=False).reason == "sse_error"


def _pool(doc: Any, endpoint: str, inputs: int | None, top_n: int | None = None, status: int = 200) -> Result:
    spec = RequestSpec(stream=False, endpoint=endpoint, inputs=inputs, top_n=top_n)
    body = json.dumps(doc).encode()
    return analyze_bytes([(0.01, body[:5]), (0.02, body[5:])], spec=spec, streaming=False, status=status)


def _vectors(n: int) -> dict[str, Any]:
    return {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [0.1, 0.2]} for i in range(n)],
            "usage": {"prompt_tokens": 4, "total_tokens": 4}}


def test_embeddings_one_vector_per_input() -> None:
    r = _pool(_vectors(2), "embeddings", 2)
    assert r.ok and r.pooling and r.ttft_s is None and r.e2e_s == pytest.approx(0.02)
    assert r.prompt_tokens is None or r.prompt_tokens == 4
    assert _pool(_vectors(1), "embeddings", 2).reason == "length_mismatch"
    assert _pool(_vectors(1), "embeddings", None).ok  # inputs not told: one vector is enough
    assert _pool({"data": []}, "embeddings", None).reason == "empty_text"
    assert _pool({"object": "list"}, "embeddings", 1).reason == "malformed"
    assert _pool(_vectors(2), "embeddings", 2, status=500).reason == "http_status"


@pytest.mark.parametrize("shape", ["vllm", "sglang"])
def test_rerank_reads_both_engines_answers(shape: str) -> None:
    key = "relevance_score" if shape == "vllm" else "score"
    results = [{"index": i, key: 0.5 - i / 10, "document": {"text": f"d{i}"}} for i in range(3)]

    def answer(items: list[dict[str, Any]]) -> Any:
        return {"id": "rerank-1", "results": items, "usage": {"total_tokens": 9}} if shape == "vllm" else items

    assert _pool(answer(results), "rerank", 3).ok
    assert _pool(answer(results[:2]), "rerank", 3, top_n=2).ok
    assert _pool(answer(results), "rerank", 3, top_n=2).ok  # every document is fine too
    assert _pool(answer(results[:1]), "rerank", 3, top_n=2).reason == "length_mismatch"
    assert _pool(answer([{"index": 0}]), "rerank", 1).reason == "malformed"


def test_pooling_problem_and_inputs_directly() -> None:
    assert pooling_problem("rerank", "nonsense", 1, None) == (
        "malformed", "rerank answer is neither a list nor an object with results")
    assert [count_inputs(v) for v in ("a", [1, 2, 3], ["a", "b"], [[1], [2]], [], 7)] == [1, 1, 2, 2, 0, None]
    assert [endpoint_of(p) for p in ("v1/messages", "/v1/rerank", "v1/other")] == ["messages", "rerank",
                                                                                     "completions"]


@pytest.mark.parametrize("endpoint", ["responses", "messages", "embeddings"])
def test_usage_is_never_injected_beside_completions_and_chat(endpoint: str) -> None:
    body = b'{"input": "hi", "stream": true}'
    assert inject_usage(body, RequestSpec.from_body(body, endpoint)) is None
    assert inject_usage(body, RequestSpec.from_body(body, "chat")) is not None


def test_request_spec_per_endpoint() -> None:
    spec = RequestSpec.from_body(b'{"input":["a","b"],"stream":true}', "embeddings")
    assert (spec.stream, spec.inputs, spec.expected_tokens) == (False, 2, None)
    spec = RequestSpec.from_body(b'{"query":"q","documents":["a","b","c"],"top_n":2}', "rerank")
    assert (spec.inputs, spec.top_n) == (3, 2)
    body = b'{"input":"x","stream":true,"ignore_eos":true,"max_output_tokens":5,"max_tokens":3}'
    assert RequestSpec.from_body(body, "responses").expected_tokens == 5
    assert RequestSpec.from_body(body, "messages").expected_tokens == 3
    assert RequestSpec.from_body(body, "responses").inputs is None  # a Responses input is its prompt
    assert RequestSpec.from_body(b'{"stream":true,"ignore_eos":true,"max_output_tokens":5}', "messages"
                                 ).expected_tokens is None


_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 1 << 70), st.floats(allow_nan=False),
                     st.sampled_from(["", "x", "text_delta", "response.completed", "message_stop", "error",
                                      "content_block_delta", "response.output_text.delta", "max_output_tokens"]))
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.sampled_from(["type", "delta", "text", "usage", "response", "output", "content", "error",
                                     "input_tokens", "output_tokens", "message", "results", "data", "index",
                                     "score", "embedding", "incomplete_details", "reason", "summary"]),
                    inner, max_size=5)), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(doc=_VALUES)
def test_any_document_gets_a_reading_never_an_exception(doc: Any) -> None:
    for reader in (ResponsesReader(), MessagesReader()):
        if isinstance(doc, dict):
            for got in (reader.read(doc), reader.whole(doc)):
                assert got.chars >= 0 and (got.usage is None or min(got.usage) >= 0)
    for endpoint in ("embeddings", "rerank"):
        problem = pooling_problem(endpoint, doc, 2, 1)
        assert problem is None or problem[0] in ("malformed", "length_mismatch", "empty_text")
    body = json.dumps(doc).encode()
    for endpoint in ("responses", "messages", "embeddings", "rerank"):
        r = analyze_bytes([(0.1, b"data: " + body + b"\n\n")], spec=RequestSpec(endpoint=endpoint))
        assert r.outcome in ("success", "failure")
        r = analyze_bytes([(0.1, body)], spec=RequestSpec(stream=False, endpoint=endpoint), streaming=False)
        assert r.outcome in ("success", "failure")
