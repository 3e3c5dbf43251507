"""Whether a response body is an SSE stream: one decision for the proxy and the load driver."""

from __future__ import annotations

__all__ = ["is_event_stream"]


def is_event_stream(content_type: str | None, requested_stream: bool) -> bool:
    """True when the body is to be parsed as SSE.

    The media type decides, case-insensitively (RFC 9110 8.3.1: ``Text/Event-Stream`` is
    ``text/event-stream``), parameters ignored.  With no Content-Type at all, the request's
    ``stream: true`` decides.
    """
    if not content_type or not content_type.strip():
        return requested_stream
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "text/event-stream"
