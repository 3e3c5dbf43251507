"""``load --endpoint``: each endpoint's path and one request's body for it.

Completions and chat are :func:`.sessions.request_body`'s (streamed, ``max_tokens`` with
``ignore_eos``, usage in the stream).  Responses and Messages are streamed with their own length
member (``max_output_tokens``, ``max_tokens``) and ``ignore_eos``: their usage comes in their own
events.  Embeddings embed the prompt; rerank ranks four pieces of it against its first words.
"""

from __future__ import annotations

from typing import Any

from .sessions import request_body

__all__ = ["ENDPOINTS", "PATHS", "endpoint_body"]

PATHS: dict[str, str] = {
    "completions": "/v1/completions", "chat": "/v1/chat/completions", "responses": "/v1/responses",
    "messages": "/v1/messages", "embeddings": "/v1/embeddings", "rerank": "/v1/rerank",
}
ENDPOINTS = tuple(PATHS)
#: documents of a rerank request
RERANK_DOCUMENTS = 4


def endpoint_body(endpoint: str, model: str | None, prompt: str, max_tokens: int) -> dict[str, Any]:
    """One request of ``endpoint`` with ``prompt`` (``max_tokens``: the answer's fixed length)."""
    if endpoint == "completions":
        return request_body(model, max_tokens, prompt=prompt)
    if endpoint == "chat":
        return request_body(model, max_tokens, messages=[{"role": "user", "content": prompt}])
    if endpoint == "responses":
        return {"model": model, "input": prompt, "max_output_tokens": max_tokens, "ignore_eos": True,
                "temperature": 0, "stream": True}
    if endpoint == "messages":
        return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                "ignore_eos": True, "temperature": 0, "stream": True}
    if endpoint == "embeddings":
        return {"model": model, "input": prompt}
    if endpoint == "rerank":
        words = prompt.split()
        step = max(1, len(words) // RERANK_DOCUMENTS)
        docs = [" ".join(words[i:i + step]) for i in range(0, step * RERANK_DOCUMENTS, step)]
        return {"model": model, "query": " ".join(words[:8]), "documents": [d or prompt for d in docs]}
    raise ValueError(f"unknown endpoint {endpoint!r} (one of {', '.join(ENDPOINTS)})")
