"""The client's socket: how many upstream bytes the kernel may hold unsent for it.

Linux grows a TCP socket's send buffer to megabytes on its own, so a client that reads slowly
would leave its response in the kernel, out of the proxy's sight.  ``TCP_NOTSENT_LOWAT`` caps the
bytes the kernel keeps unsent; the rest waits in the transport's write buffer, where the splice
sees it as client back-pressure (and pauses the upstream past its high-water mark).  One
``setsockopt`` per request, none per read.
"""

from __future__ import annotations

import asyncio
import socket

__all__ = ["NOTSENT_LOWAT", "cap_unsent"]

#: unsent bytes the kernel may hold for one client: ample for any client that keeps up
NOTSENT_LOWAT = 128 << 10

_OPT = getattr(socket, "TCP_NOTSENT_LOWAT", 25 if hasattr(socket, "TCP_CONGESTION") else None)


def cap_unsent(transport: asyncio.BaseTransport, limit: int = NOTSENT_LOWAT) -> bool:
    """Cap the unsent bytes of ``transport``'s TCP socket; False where that cannot be done."""
    sock = transport.get_extra_info("socket")
    if sock is None or _OPT is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _OPT, limit)
    except OSError:
        return False
    return True
