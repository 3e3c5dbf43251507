"""The output token ids an engine sent with its answer (vLLM ``return_token_ids``: each choice
carries ``token_ids``), read back from the answer's bytes: what the engine generated, whether
or not any of it became visible text.  Pure: bytes in, ids out."""

from __future__ import annotations

from collections.abc import Iterable

from exporter.core.jsondepth import loads
from exporter.core.sse import SSEParser

__all__ = ["output_token_ids", "output_text"]


def _ids_of(doc: object) -> Iterable[int]:
    if not isinstance(doc, dict):
        return ()
    choices = doc.get("choices")
    if not isinstance(choices, list):
        return ()
    ids: list[int] = []
    for choice in choices:
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            got = choice.get("token_ids")
            if isinstance(got, list):
                ids.extend(i for i in got if isinstance(i, int) and not isinstance(i, bool))
    return ids


def _text_of(doc: object) -> str:
    """The first choice's text in one document: completions ``text``; chat ``reasoning_content`` (or
    ``reasoning``) then ``content`` of its ``delta`` or ``message`` (what the engine's tokens became)."""
    choices = doc.get("choices") if isinstance(doc, dict) else None
    out = ""
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        if isinstance(choice.get("text"), str):
            out += choice["text"]
        msg = choice.get("delta", choice.get("message"))
        if isinstance(msg, dict):
            reasoning = msg.get("reasoning_content", msg.get("reasoning"))
            out += (reasoning if isinstance(reasoning, str) else "") + (c if isinstance(c := msg.get("content"), str) else "")
    return out


def output_text(body: bytes, streaming: bool) -> str:
    """The first choice's text as the engine sent it, joined in order (reasoning before content in a chunk)."""
    return "".join(_text_of(doc) for doc in _documents(body, streaming) or ())


def _documents(body: bytes, streaming: bool) -> list[object] | None:
    docs: list[object] = []
    if streaming:
        parser = SSEParser()
        for event in [*parser.feed(body), *parser.close()]:
            if event.data and event.data != b"[DONE]":
                try:
                    docs.append(loads(event.data))
                except ValueError:
                    continue
    else:
        try:
            docs.append(loads(body))
        except ValueError:
            return None
    return docs


def output_token_ids(body: bytes, streaming: bool) -> list[int] | None:
    """The first choice's output token ids, in order; None when the answer carries none."""
    docs = _documents(body, streaming)
    if docs is None:
        return None
    seen = False
    ids: list[int] = []
    for doc in docs:
        if isinstance(doc, dict) and any(isinstance(c, dict) and "token_ids" in c for c in doc.get("choices") or ()):
            seen = True
        ids.extend(_ids_of(doc))
    return ids if seen else None
