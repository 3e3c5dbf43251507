"""The endpoints beside completions and chat: what their answers say, read one document at a time.

* Responses (``/v1/responses``), streamed: each event's data has a ``type``.  Visible text is
  ``response.output_text.delta`` (answer), ``response.reasoning_text.delta`` and
  ``response.reasoning_summary_text.delta`` (reasoning), ``response.function_call_arguments.delta``
  (a tool call); ``response.completed`` ends the stream with the usage (``input_tokens``,
  ``output_tokens``) in its ``response``, and so does ``response.incomplete`` when its reason is
  ``max_output_tokens`` (SGLang caps an answer so); ``response.failed`` and ``error`` are errors.
  Not streamed: one ``response`` object, its ``output`` items holding the text.
* Messages (``/v1/messages``, Anthropic), streamed: ``content_block_delta`` carries visible text
  (``text_delta`` answer, ``thinking_delta`` reasoning, ``input_json_delta`` a tool call's input);
  ``message_start`` the input tokens (SGLang gives them only there), ``message_delta`` the output
  tokens; ``message_stop`` ends the stream; an ``error`` event is an error, whatever follows it.
  Not streamed: one ``message`` object, its ``content`` blocks holding the text.
* Embeddings and rerank are never streamed; :func:`pooling_problem` judges their one document.

Pure, and bounded like :mod:`exporter.core.visible`: a fixed number of levels into a document.
"""

from __future__ import annotations

from typing import Any

from .decode import CONTENT, REASONING, TOOL

__all__ = ["ENDPOINTS", "POOLING", "GENERATIONS", "endpoint_of", "Reading", "ResponsesReader", "MessagesReader",
           "reader_for", "pooling_problem", "count_inputs", "fixed_length", "pooling_counts", "OWN_END"]

#: route (below the engine's prefix) -> endpoint
ENDPOINTS: dict[str, str] = {
    "v1/completions": "completions", "v1/chat/completions": "chat", "v1/responses": "responses",
    "v1/messages": "messages", "v1/embeddings": "embeddings", "v1/rerank": "rerank",
}
#: endpoints that answer one document and never generate text
POOLING = frozenset({"embeddings", "rerank"})
#: endpoints whose streams end with their own last event (no ``data: [DONE]``)
OWN_END = frozenset({"responses", "messages"})
#: endpoints that generate text
GENERATIONS = frozenset({"completions", "chat", "responses", "messages"})


def endpoint_of(route: str) -> str:
    """The endpoint of a route such as ``v1/responses`` or ``/v1/responses`` (completions if unknown)."""
    return ENDPOINTS.get(route.lstrip("/"), "completions")


def _text(value: Any) -> int:
    return len(value) if isinstance(value, str) else 0


def _items(value: Any) -> list[Any]:
    """A list member, or none (whatever else the upstream sent there)."""
    return value if isinstance(value, list) else []


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _message(obj: dict[str, Any], default: str) -> str:
    err = obj.get("error")
    if isinstance(err, dict):
        err = err.get("message") or err.get("type")
    text = err if isinstance(err, str) and err else obj.get("message")
    return (text if isinstance(text, str) and text else default)[:200]


class Reading:
    """What one document said: visible characters, their channels (:mod:`exporter.core.decode`'s bits),
    (prompt, completion) tokens, whether it ended the answer, an error."""

    __slots__ = ("chars", "mask", "usage", "end", "error")

    def __init__(self, chars: int = 0, mask: int = 0, usage: tuple[int, int] | None = None, end: bool = False,
                 error: str | None = None) -> None:
        self.chars = chars
        self.mask = mask
        self.usage = usage
        self.end = end
        self.error = error


_NOTHING = Reading()
_RESPONSE_DELTAS = {"response.output_text.delta": CONTENT, "response.reasoning_text.delta": REASONING,
                    "response.reasoning_summary_text.delta": REASONING,
                    "response.function_call_arguments.delta": TOOL}


def _response_usage(response: Any) -> tuple[int, int] | None:
    usage = response.get("usage") if isinstance(response, dict) else None
    if not isinstance(usage, dict):
        return None
    p, c = _count(usage.get("input_tokens")), _count(usage.get("output_tokens"))
    return None if p is None or c is None else (p, c)


def _incomplete_end(response: Any) -> bool:
    details = response.get("incomplete_details") if isinstance(response, dict) else None
    return isinstance(details, dict) and details.get("reason") == "max_output_tokens"


class ResponsesReader:
    """OpenAI Responses: one event's data, or (``whole``) the one response object."""

    end_name = "response.completed"

    def read(self, obj: dict[str, Any]) -> Reading:
        kind = obj.get("type")
        mask = _RESPONSE_DELTAS.get(kind) if isinstance(kind, str) else None
        if mask is not None:
            n = _text(obj.get("delta"))
            return Reading(n, mask) if n else _NOTHING
        if kind == "response.completed":
            return Reading(usage=_response_usage(obj.get("response")), end=True)
        if kind == "response.incomplete":
            response = obj.get("response")
            return Reading(usage=_response_usage(response), end=_incomplete_end(response))
        if kind in ("response.failed", "error"):
            response = obj.get("response")
            return Reading(error=_message(response if isinstance(response, dict) and "error" in response else obj,
                                          str(kind)))
        return _NOTHING

    def whole(self, obj: dict[str, Any]) -> Reading:
        status = obj.get("status")
        if status == "failed" or obj.get("error"):
            return Reading(error=_message(obj, "response failed"))
        chars, mask = 0, 0
        for item in _items(obj.get("output")):
            if not isinstance(item, dict):
                continue
            kind = item.get("type")
            if kind == "function_call":
                n = _text(item.get("name")) + _text(item.get("arguments"))
                chars, mask = chars + n, mask | (TOOL if n else 0)
            for part in _items(item.get("content")) or _items(item.get("summary")):
                n = _text(part.get("text")) if isinstance(part, dict) else 0
                chars, mask = chars + n, mask | ((CONTENT if kind == "message" else REASONING) if n else 0)
        done = status == "completed" or (status == "incomplete" and _incomplete_end(obj))
        return Reading(chars, mask, _response_usage(obj), end=done)


_MESSAGE_DELTAS = {"text_delta": ("text", CONTENT), "thinking_delta": ("thinking", REASONING),
                   "input_json_delta": ("partial_json", TOOL)}


class MessagesReader:
    """Anthropic Messages: the input tokens of ``message_start`` kept for ``message_delta``'s usage."""

    end_name = "message_stop"

    def __init__(self) -> None:
        self.input_tokens: int | None = None

    def _usage(self, usage: Any) -> tuple[int, int] | None:
        if not isinstance(usage, dict):
            return None
        p = _count(usage.get("input_tokens"))
        if p is not None:  # Anthropic's input_tokens leave out the cached ones: the prompt is all three
            self.input_tokens = p + sum(_count(usage.get(k)) or 0
                                        for k in ("cache_read_input_tokens", "cache_creation_input_tokens"))
        c = _count(usage.get("output_tokens"))
        return None if c is None or self.input_tokens is None else (self.input_tokens, c)

    def read(self, obj: dict[str, Any]) -> Reading:
        kind = obj.get("type")
        if kind == "content_block_delta":
            delta = obj.get("delta")
            if not isinstance(delta, dict):
                return _NOTHING
            kind = delta.get("type")
            key, mask = _MESSAGE_DELTAS.get(kind, ("", 0)) if isinstance(kind, str) else ("", 0)
            n = _text(delta.get(key)) if key else 0
            return Reading(n, mask) if n else _NOTHING
        if kind == "message_start":
            message = obj.get("message")
            if isinstance(message, dict):
                self._usage(message.get("usage"))  # the output tokens here are a placeholder
            return _NOTHING
        if kind == "message_delta":
            return Reading(usage=self._usage(obj.get("usage")))
        if kind == "message_stop":
            return Reading(end=True)
        if kind == "error" or "error" in obj:
            return Reading(error=_message(obj, "error"))
        return _NOTHING

    def whole(self, obj: dict[str, Any]) -> Reading:
        if obj.get("type") == "error" or obj.get("error"):
            return Reading(error=_message(obj, "error"))
        chars, mask = 0, 0
        for block in _items(obj.get("content")):
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                n, bit = _text(block.get("text")), CONTENT
            elif kind == "thinking":
                n, bit = _text(block.get("thinking")), REASONING
            elif kind == "tool_use":
                n, bit = _text(block.get("name")) + (1 if block.get("input") is not None else 0), TOOL
            else:
                continue
            chars, mask = chars + n, mask | (bit if n else 0)
        return Reading(chars, mask, self._usage(obj.get("usage")), end=True)


def reader_for(endpoint: str) -> ResponsesReader | MessagesReader | None:
    """The reader of an endpoint whose documents differ from completions' and chat's."""
    if endpoint == "responses":
        return ResponsesReader()
    if endpoint == "messages":
        return MessagesReader()
    return None


def count_inputs(value: Any) -> int | None:
    """Inputs of an embeddings request's ``input``: a string or a list of token ids is one; a list of
    them one each (None: not a shape the engines take)."""
    if isinstance(value, str):
        return 1
    if not isinstance(value, list):
        return None
    if value and all(type(v) is int for v in value):
        return 1
    return len(value)


def _positive_int(value: Any) -> int | None:
    return value if type(value) is int and value > 0 else None


#: the member that fixes the length, where it is not max_completion_tokens (else max_tokens)
_LENGTH_KEY = {"responses": "max_output_tokens", "messages": "max_tokens"}


def fixed_length(endpoint: str, members: dict[str, Any]) -> int | None:
    """The completion tokens a request fixed (``ignore_eos: true`` with its endpoint's length member)."""
    if members.get("ignore_eos") is not True or endpoint in POOLING:
        return None
    key = _LENGTH_KEY.get(endpoint)
    if key is not None:
        return _positive_int(members.get(key))
    return _positive_int(members.get("max_completion_tokens")) or _positive_int(members.get("max_tokens"))


def pooling_counts(endpoint: str, members: dict[str, Any]) -> tuple[int | None, int | None]:
    """(inputs, top_n): an embeddings request's inputs, or a rerank request's documents and top_n."""
    if endpoint == "embeddings":
        return count_inputs(members.get("input")), None
    if endpoint == "rerank":
        docs = members.get("documents")
        return (len(docs) if isinstance(docs, list) else None), _positive_int(members.get("top_n"))
    return None, None


def _scored(item: Any) -> bool:
    if not isinstance(item, dict) or type(item.get("index")) is not int:
        return False
    score = item.get("relevance_score", item.get("score"))
    return isinstance(score, (int, float)) and not isinstance(score, bool)


def pooling_problem(endpoint: str, doc: Any, inputs: int | None, top_n: int | None) -> tuple[str, str] | None:
    """(reason, detail) when an embeddings or rerank answer is not what was asked, else None: one
    vector per input; one result per document, or ``top_n`` of them, each with an index and a score.
    vLLM's rerank answers ``{"results": [...]}``, SGLang's a bare list."""
    if endpoint == "embeddings":
        data = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(data, list):
            return "malformed", "embeddings answer without a data list"
        if not all(isinstance(d, dict) and isinstance(d.get("embedding"), (list, str)) for d in data):
            return "malformed", "an embeddings item without its embedding"
        want = inputs
        what = "vectors"
    else:
        results = doc.get("results") if isinstance(doc, dict) else doc
        if not isinstance(results, list):
            return "malformed", "rerank answer is neither a list nor an object with results"
        if not all(_scored(r) for r in results):
            return "malformed", "a rerank result without an integer index and a numeric score"
        data = results
        if top_n is not None and inputs is not None and len(data) == min(top_n, inputs):
            return None
        want = inputs
        what = "results"
    if want is None:
        return None if data else ("empty_text", f"no {what} in the answer")
    if len(data) != want:
        return "length_mismatch", f"{len(data)} {what} != {want} asked"
    return None
