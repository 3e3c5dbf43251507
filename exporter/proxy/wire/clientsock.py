"""The client's socket: how many bytes the kernel may hold for a streaming client.

Linux grows a TCP socket's send buffer to megabytes on its own, and ``send()`` takes bytes as long
as there is room (``TCP_NOTSENT_LOWAT`` only decides when the socket polls writable).  A client
that reads slowly would then leave its whole stream in the kernel, out of the proxy's sight: the
transport never fills, its protocol never hears ``pause_writing``.  So a streaming response's
socket gets a small fixed send buffer (``SO_SNDBUF``; the kernel doubles it for its own
bookkeeping) and its transport a small high-water mark: beyond some 40 KiB that the client has not
taken, the relay sees back-pressure (:mod:`exporter.proxy.wire.relay`).  An SSE stream's pace (tens of
KB/s) leaves that room unused for any client that keeps up.  One ``setsockopt`` per request, none
per read.
"""

from __future__ import annotations

import asyncio
import socket

__all__ = ["SEND_BUFFER", "HIGH_WATER", "LOW_WATER", "limit_unsent"]

#: the send buffer asked of the kernel for a streaming client's socket (it keeps twice this)
SEND_BUFFER = 8 << 10
#: the client transport's buffer above which it calls ``pause_writing`` (and below which, again,
#: ``resume_writing``)
HIGH_WATER = 16 << 10
LOW_WATER = 4 << 10


def limit_unsent(transport: asyncio.BaseTransport) -> bool:
    """Cap what the kernel and the transport hold for ``transport``'s client; False where the
    kernel's part cannot be capped (not TCP), the transport's still is."""
    try:
        transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)  # type: ignore[attr-defined]
    except (AttributeError, NotImplementedError):  # pragma: no cover - a transport without limits
        pass
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
    except OSError:
        return False
    return True
