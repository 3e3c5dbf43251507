"""Literal response transcripts in each engine's real wire format, with their verdicts."""

from __future__ import annotations

from dataclasses import dataclass


def sse(*events: str, eol: str = "\n") -> bytes:
    return "".join(f"data: {e}{eol}{eol}" for e in events).encode()


def _vllm_text(t: str, finish: str = "null") -> str:
    fin = "null" if finish == "null" else f'"{finish}"'
    return ('{"id":"cmpl-abc","object":"text_completion","created":1700000000,"model":"m","choices":'
            f'[{{"index":0,"text":"{t}","logprobs":null,"finish_reason":{fin},"stop_reason":null}}]}}')


def _vllm_usage(p: int, c: int) -> str:
    return ('{"id":"cmpl-abc","object":"text_completion","created":1700000000,"model":"m","choices":[],'
            f'"usage":{{"prompt_tokens":{p},"total_tokens":{p + c},"completion_tokens":{c}}}}}')


def _sgl_text(t: str, finish: str = "null", usage: str = "null") -> str:
    fin = "null" if finish == "null" else f'"{finish}"'
    return ('{"id":"a1","object":"text_completion","created":1700000000,"model":"default","choices":'
            f'[{{"index":0,"text":"{t}","logprobs":null,"finish_reason":{fin},"matched_stop":null}}],'
            f'"usage":{usage}}}')


def _chat(delta: str, finish: str = "null", engine_id: str = "chatcmpl-1") -> str:
    fin = "null" if finish == "null" else f'"{finish}"'
    return (f'{{"id":"{engine_id}","object":"chat.completion.chunk","created":1700000000,"model":"m",'
            f'"choices":[{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":{fin}}}]}}')


VLLM_ERROR = '{"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}'
SGL_ERROR = '{"error": {"object": "error", "message": "bad", "type": "BadRequestError", "param": null, "code": 400}}'


@dataclass(frozen=True)
class Case:
    name: str
    body: bytes
    reason: str | None  # None = success
    completion_tokens: int | None = None
    expected: int | None = None
    status: int = 200
    streaming: bool = True


CASES: list[Case] = [
    Case("vllm_completions_ok",
         sse(_vllm_text("Hello"), _vllm_text(" world", "length"), _vllm_usage(12, 2), "[DONE]"),
         None, 2, expected=2),
    Case("vllm_seed_empty_text_128",  # the seed's failure: 200, [DONE], usage 128, no text
         sse(*[_vllm_text("") for _ in range(4)], _vllm_text("", "length"), _vllm_usage(1024, 128), "[DONE]"),
         "empty_text", 128, expected=128),
    Case("vllm_empty_first_chunk_then_text",
         sse(_vllm_text(""), _vllm_text("a"), _vllm_text("b", "length"), _vllm_usage(3, 3), "[DONE]"),
         None, 3, expected=3),
    Case("vllm_sse_error_then_done",
         sse(_vllm_text("a"), VLLM_ERROR, "[DONE]"), "sse_error"),
    Case("vllm_old_error_object",
         sse('{"object":"error","message":"oops","type":"x","code":500}', "[DONE]"), "sse_error"),
    Case("vllm_no_usage",
         sse(_vllm_text("a"), _vllm_text("b", "length"), "[DONE]"), "missing_usage"),
    Case("vllm_length_mismatch",
         sse(_vllm_text("a"), _vllm_text("b", "length"), _vllm_usage(3, 2), "[DONE]"),
         "length_mismatch", 2, expected=128),
    Case("vllm_missing_done",
         sse(_vllm_text("a"), _vllm_usage(3, 1)), "missing_done", 1),
    Case("malformed_json",
         sse(_vllm_text("a"), '{"id": "x", "choices": [', "[DONE]"), "malformed"),
    Case("sglang_completions_ok",
         sse(_sgl_text("Hi"), _sgl_text(" there", "length"),
             '{"id":"a1","object":"text_completion","created":1700000000,"model":"default","choices":[],'
             '"usage":{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2}}', "[DONE]"),
         None, 2, expected=2),
    Case("sglang_usage_on_last_chunk",
         sse(_sgl_text("Hi"), _sgl_text(" there", "length",
             '{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2}'), "[DONE]"),
         None, 2),
    Case("sglang_usage_null_only", sse(_sgl_text("Hi"), _sgl_text("!", "stop"), "[DONE]"), "missing_usage"),
    Case("sglang_error", sse(SGL_ERROR, "[DONE]"), "sse_error"),
    Case("vllm_chat_role_then_content",
         sse(_chat('{"role":"assistant","content":""}'), _chat('{"content":"Hi"}'),
             _chat('{"content":"!"}', "stop"), _vllm_usage(9, 2), "[DONE]"), None, 2),
    Case("vllm_chat_role_only_empty",
         sse(_chat('{"role":"assistant","content":""}'), _chat('{}', "length"), _vllm_usage(9, 4), "[DONE]"),
         "empty_text", 4),
    Case("vllm_chat_reasoning_only",
         sse(_chat('{"role":"assistant","content":""}'), _chat('{"reasoning":"think"}'),
             _vllm_usage(9, 1), "[DONE]"), None, 1),
    Case("sglang_chat_reasoning_content_and_finish_chunk",
         sse(_chat('{"role":"assistant","content":null,"reasoning_content":null}'),
             _chat('{"content":null,"reasoning_content":"hmm"}'),
             _chat('{"content":"ok","reasoning_content":null}'),
             _chat('{"content":null,"reasoning_content":null}', "stop"),
             '{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
             '"usage":{"prompt_tokens":4,"total_tokens":7,"completion_tokens":3,"reasoning_tokens":1}}',
             "[DONE]"), None, 3),
    Case("chat_tool_call_without_prose",
         sse(_chat('{"role":"assistant","content":null}'),
             _chat('{"tool_calls":[{"index":0,"id":"t1","type":"function","function":{"name":"get","arguments":""}}]}'),
             _chat('{"tool_calls":[{"index":0,"function":{"arguments":"{\\"a\\":1}"}}]}', "tool_calls"),
             _vllm_usage(9, 6), "[DONE]"), None, 6),
    Case("crlf_and_spaced_json",
         sse('{ "choices": [ { "text": "x" } ], "usage": { "prompt_tokens": 1, "completion_tokens": 1 } }',
             "[DONE]", eol="\r\n"), None, 1),
    Case("cr_only_line_endings",
         sse('{"choices":[{"text":"x"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}', "[DONE]", eol="\r"),
         None, 1),
    Case("comments_no_space_multiline_data",
         b": keep-alive\n\ndata:{\"choices\":[{\"text\":\n"
         b"data:\"h\\u00e9\"}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\n"
         b": ping\ndata:[DONE]\n\n", None, 1),
    Case("utf8_text_and_done_without_blank_line",
         "data: {\"choices\":[{\"text\":\"数据\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\ndata: [DONE]\n".encode(),
         None, 2),
    Case("utf8_bom_at_stream_start",
         b"\xef\xbb\xbf" + sse('{"choices":[{"text":"x"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}', "[DONE]"),
         None, 1),
    Case("http_500", b'{"object":"error","message":"boom"}', "http_status", status=500, streaming=False),
    Case("non_streaming_ok",
         b'{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"hello"}],'
         b'"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}', None, 1, streaming=False),
    Case("non_streaming_chat_empty",
         b'{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":""}}],'
         b'"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}', "empty_text", 5, streaming=False),
    Case("non_streaming_garbage", b"<html>oops</html>", "malformed", streaming=False),
    Case("empty_body_stream", b"", "missing_done"),
]


# -- the fuzz campaign's findings (issue 15), as literal bytes -----------------------------------

_DEEP = b"[" * 1000  # refused by orjson; the standard library recursed on it
_VALID_DEEP_TEXT = b'{"choices":[{"text":"a","delta":{"content":[{"text":' + b"[" * 500 + b"]" * 500 + b"}]}}]}"


@dataclass(frozen=True)
class Finding:
    """One finding: bytes in, the verdict they must get; limits the analyzer runs with."""

    name: str
    body: bytes
    reason: str | None
    streaming: bool = True
    max_line: int = 16 << 20
    max_event: int = 16 << 20


_USAGE_OK = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\n'
_TEXT_OK = b'data: {"choices":[{"text":"a"}]}\n\n'

FINDINGS: list[Finding] = [
    # F1: nesting about 1,000 deep, in an event, a non-streaming body, and walked after parsing.
    Finding("f1_deep_event", _TEXT_OK + b"data: " + _DEEP + b"\n\n" + _USAGE_OK + b"data: [DONE]\n\n", "malformed"),
    Finding("f1_deep_body", _DEEP, "malformed", streaming=False),
    Finding("f1_deep_unterminated_last_event", _TEXT_OK + _USAGE_OK + b"data: " + _DEEP, "malformed"),
    Finding("f1_nested_content_parts_walked",
            b"data: " + _VALID_DEEP_TEXT + b"\n\n" + _USAGE_OK + b"data: [DONE]\n\n", None),
    Finding("f1_nested_error_message",
            _TEXT_OK + b'data: {"error":{"message":' + b"[" * 500 + b"]" * 500 + b"}}\n\n" + b"data: [DONE]\n\n",
            "sse_error"),
    Finding("f1_nested_reasoning_compared",
            b'data: {"choices":[{"delta":{"content":"a","reasoning":' + b"[" * 500 + b"]" * 500
            + b',"reasoning_content":' + b"[" * 500 + b"]" * 500 + b"}}]}\n\n" + _USAGE_OK + b"data: [DONE]\n\n",
            None),
    Finding("f1_valid_but_deeper_than_512", _TEXT_OK + b'data: {"choices":[],"x":' + b"[" * 1000 + b"]" * 1000
            + b"}\n\n" + _USAGE_OK + b"data: [DONE]\n\n", "malformed"),
    # F2: data lines without a blank line: the pending event is bounded by max_event_bytes.
    Finding("f2_event_over_max_event_bytes", _TEXT_OK + b"data:xy\n" * 2000 + b"\n" + _USAGE_OK + b"data: [DONE]\n\n",
            "malformed", max_event=1024),
    # F3: an over-long line is skipped; a later error event is still seen (sse_error before malformed).
    Finding("f3_long_comment_then_error", b":" + b"x" * 1024 + b'\ndata: {"error":"x"}\n\n', "sse_error",
            max_line=1024),
    Finding("f3_long_line_then_done_and_text", b"data: " + b"x" * 2000 + b"\n\n" + _TEXT_OK + _USAGE_OK
            + b"data: [DONE]\n\n", "malformed", max_line=1024),
    # F4: one rule after [DONE]: nothing after it changes the verdict.
    Finding("f4_long_comment_after_done", _TEXT_OK + _USAGE_OK + b"data: [DONE]\n\n:" + b"x" * 2000 + b"\n\n", None,
            max_line=1024),
    Finding("f4_bad_json_after_done", _TEXT_OK + _USAGE_OK + b"data: [DONE]\n\ndata: {broken\n\n", None),
    Finding("f4_error_after_done", _TEXT_OK + _USAGE_OK + b'data: [DONE]\n\ndata: {"error":"late"}\n\n', None),
    Finding("f4_long_event_after_done", _TEXT_OK + _USAGE_OK + b"data: [DONE]\n\n" + b"data:xy\n" * 2000, None,
            max_event=1024),
    # F5: integers over 64 bits (orjson reads them as floats): success with and without orjson.
    Finding("f5_usage_over_64_bits", _TEXT_OK
            + b'data: {"choices":[],"usage":{"prompt_tokens":123456789012345678901234567890,'
              b'"completion_tokens":18446744073709551616}}\n\n' + b"data: [DONE]\n\n", None),
    Finding("f5_usage_float_is_not_integer", _TEXT_OK
            + b'data: {"choices":[],"usage":{"prompt_tokens":1.0,"completion_tokens":2}}\n\ndata: [DONE]\n\n',
            "missing_usage"),
]
