"""The client's socket: how many bytes the kernel may hold for a streaming client, and when the
kernel last received data on it.

Linux grows a TCP socket's send buffer to megabytes on its own, and ``send()`` takes bytes as long
as there is room (``TCP_NOTSENT_LOWAT`` only decides when the socket polls writable).  A client
that reads slowly would then leave its whole stream in the kernel, out of the proxy's sight: the
transport never fills, its protocol never hears ``pause_writing``.  So a streaming response's
socket gets a small fixed send buffer (``SO_SNDBUF``; the kernel doubles it for its own
bookkeeping) and its transport a small high-water mark: beyond some 40 KiB that the client has not
taken, the relay sees back-pressure (:mod:`exporter.proxy.wire.relay`).  An SSE stream's pace (tens of
KB/s) leaves that room unused for any client that keeps up.  One ``setsockopt`` per connection,
none per read.

:func:`received_at` asks the kernel (``TCP_INFO``'s ``tcpi_last_data_recv``, in milliseconds of the
kernel's tick) how long ago the client's last data came: a request that waited unseen in the
socket's receive queue while the loop was busy elsewhere shows it, where the handler's own clock
starts only when aiohttp parsed it.  One ``getsockopt`` per request.

:func:`cork` holds the client's partial segments (``TCP_CORK``) while the response's head and the
reads that came with it are written, so that they leave in one transmission: on loopback a
transmission is the costly part of a write (the receiver's TCP processing and its wake-up run in
the sender's system call), and an answer whose first text came with its head otherwise costs two.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
import weakref

__all__ = ["SEND_BUFFER", "HIGH_WATER", "LOW_WATER", "tcp_socket", "limit_unsent", "received_at", "cork"]

#: the send buffer asked of the kernel for a streaming client's socket (it keeps twice this)
SEND_BUFFER = 8 << 10
#: the client transport's buffer above which it calls ``pause_writing`` (and below which, again,
#: ``resume_writing``)
HIGH_WATER = 16 << 10
LOW_WATER = 4 << 10


def tcp_socket(transport: asyncio.BaseTransport | None) -> socket.socket | None:
    """``transport``'s socket where it is TCP (IPv4 or IPv6); None otherwise (a Unix socket, none)."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    return sock  # type: ignore[no-any-return]


#: transports already capped, with what :func:`limit_unsent` said (a keep-alive client's caps hold)
_CAPPED: weakref.WeakKeyDictionary[asyncio.BaseTransport, bool] = weakref.WeakKeyDictionary()


def limit_unsent(transport: asyncio.BaseTransport) -> bool:
    """Cap what the kernel and the transport hold for ``transport``'s client; False where the
    kernel's part cannot be capped (not TCP), the transport's still is.  Once per connection."""
    try:
        capped = _CAPPED.get(transport)
        if capped is None:
            capped = _CAPPED[transport] = _cap(transport)
    except TypeError:  # a transport without weak references (uvloop's TLS one): capped each time
        return _cap(transport)
    return capped


def _cap(transport: asyncio.BaseTransport) -> bool:
    try:
        transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)  # type: ignore[attr-defined]
    except (AttributeError, NotImplementedError):  # pragma: no cover - a transport without limits
        pass
    sock = tcp_socket(transport)
    if sock is None:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
    except OSError:
        return False
    return True


#: ``struct tcp_info`` up to ``tcpi_last_data_recv`` (Linux): 8 bytes of u8 fields, then u32s;
#: ``tcpi_last_data_recv`` is the 12th u32 (milliseconds since the last data came)
_TCP_INFO = struct.Struct("8x12I")
_TCP_INFO_OPT: int | None = getattr(socket, "TCP_INFO", None)


def received_at(transport: asyncio.BaseTransport | None) -> float | None:
    """Unix time the kernel last received data from ``transport``'s client (its tick's
    resolution: a few milliseconds at most), or None where the platform does not say."""
    sock = tcp_socket(transport)
    if _TCP_INFO_OPT is None or sock is None:
        return None
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO_OPT, _TCP_INFO.size)
    except OSError:
        return None
    if len(raw) < _TCP_INFO.size:
        return None
    since_ms: int = _TCP_INFO.unpack_from(raw)[11]
    return time.time() - since_ms / 1000.0


_CORK_OPT: int | None = getattr(socket, "TCP_CORK", None)


def cork(transport: asyncio.BaseTransport | None, on: bool) -> bool:
    """Hold (``on``) or send (not ``on``) the partial segments written to ``transport``'s client
    (Linux ``TCP_CORK``; the kernel sends them anyway after 200 ms); False where the platform or
    the socket does not have it."""
    sock = tcp_socket(transport)
    if _CORK_OPT is None or sock is None:
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _CORK_OPT, 1 if on else 0)
    except OSError:
        return False
    return True
