"""A plain TCP connection to an engine, read with ``recvmsg`` and stamped with the kernel's clock.

A read's stamp decides TTFT, TPOT and E2E.  Stamped in the loop's callback, it is late by as
long as the loop was busy with other streams' reads; stamped by the kernel (``SO_TIMESTAMPNS``:
the moment the segment was received, ``CLOCK_REALTIME``), it is not, however busy the loop is.
So the proxy's upstream sockets are not asyncio transports: the loop says a socket is readable
(``add_reader``, no polling) and :class:`StampedSocket` reads it with ``recvmsg`` and hands each
read, with its stamp, to its owner.  Where the kernel gives no stamp (not Linux, or a read that
carries none) the stamp is ``time.time()`` at the read, on the same clock: :attr:`kernel_stamps`
tells which.

Linux stamps a read that holds several segments with the last one's arrival: a text that came
in an earlier segment of the same read (the loop was late, so segments piled up) is stamped late
by at most that lateness, which the request's ``timing_uncertainty_s`` (the loop's lag while it
was in flight) still bounds.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Callable

__all__ = ["StampedSocket", "TLSStream", "kernel_stamp", "read_stamped", "SO_TIMESTAMPNS", "READ_SIZE"]

#: ``SO_TIMESTAMPNS`` (Linux, asm-generic: 35), where the socket module lacks the name
SO_TIMESTAMPNS: int | None = getattr(socket, "SO_TIMESTAMPNS", 35 if hasattr(socket, "TCP_CONGESTION") else None)
#: bytes asked of one read (a long-prefill burst of SSE events fits)
READ_SIZE = 256 << 10
_TIME_NS = struct.Struct("@qq")
_ANC_SPACE = socket.CMSG_SPACE(_TIME_NS.size) if hasattr(socket, "CMSG_SPACE") else 0


class _ReadBuffer(threading.local):
    """One read buffer per thread (a loop's reads never overlap; two loops' threads could).

    ``recvmsg(READ_SIZE)`` makes a new 256 KiB object for every read and shrinks it to the bytes
    that came: 12 to 19 µs a read of one SSE event on Linux (the allocator's large-block path),
    against 5 µs for ``recvmsg_into`` a buffer kept for the thread and a copy of what came."""

    def __init__(self) -> None:
        self.buffer = bytearray(READ_SIZE)
        self.view = memoryview(self.buffer)
        self.into = [self.buffer]


_READ = _ReadBuffer()


def kernel_stamp(ancdata: list[tuple[int, int, bytes]]) -> float | None:
    """The ``SCM_TIMESTAMPNS`` stamp among a read's ancillary data (unix seconds), or None."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIME_NS.size:
            sec, nsec = _TIME_NS.unpack_from(data)
            return float(sec + nsec * 1e-9)
    return None


def read_stamped(sock: socket.socket) -> tuple[bytes, float | None]:
    """One ``recvmsg`` of ``sock`` into this thread's buffer: the bytes that came (``b""``: the
    peer's end of data) and the kernel's receive stamp of the read (None where it carried none).
    Raises what ``recvmsg_into`` raises."""
    read = _READ
    size, ancdata, _, _ = sock.recvmsg_into(read.into, _ANC_SPACE)
    return read.view[:size].tobytes(), (kernel_stamp(ancdata) if ancdata else None)


class StampedSocket:
    """Owns one connected non-blocking socket: writes what it is given, and hands each read to
    ``received(data, stamp)``; the end (EOF: ``None``, or the error) to ``lost(exc)``, once."""

    __slots__ = ("sock", "loop", "fd", "received", "lost", "kernel_stamps", "unstamped", "sent_at", "_out", "_reading",
                 "_closed")

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop,
                 received: Callable[[bytes, float], None], lost: Callable[[BaseException | None], None]) -> None:
        self.sock = sock
        self.loop = loop
        self.fd = sock.fileno()
        self.received = received
        self.lost = lost
        self.kernel_stamps = _enable_stamps(sock)
        self.unstamped = 0  # reads that carried no kernel stamp (stamped with time.time())
        #: unix time just before the send(2) that handed the kernel the last byte written so far
        #: (None while some wait for the socket to be writable)
        self.sent_at: float | None = None
        self._out: list[memoryview] = []
        self._reading = False
        self._closed = False
        self.resume()

    def is_closing(self) -> bool:
        return self._closed

    def write(self, data: bytes) -> None:
        """Send ``data`` now, as far as the kernel takes it; the rest when the socket is writable."""
        if self._closed:
            return
        self.sent_at = None
        if self._out:
            self._out.append(memoryview(data))
            return
        now = time.time()  # before the call: the GIL is taken back after it, maybe late
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._fail(exc)
            return
        if sent < len(data):
            self._out.append(memoryview(data)[sent:])
            self.loop.add_writer(self.fd, self._on_writable)
        else:
            self.sent_at = now

    def _on_writable(self) -> None:
        while self._out:
            now = time.time()
            try:
                sent = self.sock.send(self._out[0])
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._fail(exc)
                return
            head = self._out[0]
            if sent < len(head):
                self._out[0] = head[sent:]
                return
            self._out.pop(0)
        self.sent_at = now
        self.loop.remove_writer(self.fd)

    def _on_readable(self) -> None:
        try:
            data, stamp = read_stamped(self.sock)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._fail(exc)
            return
        if not data:
            self._fail(None)
            return
        if stamp is None:
            self.unstamped += 1
            stamp = time.time()
        self.received(data, stamp)

    def pause(self) -> None:
        if self._reading and not self._closed:
            self._reading = False
            self.loop.remove_reader(self.fd)

    def resume(self) -> None:
        if not self._reading and not self._closed:
            self._reading = True
            self.loop.add_reader(self.fd, self._on_readable)

    def _fail(self, exc: BaseException | None) -> None:
        if not self._closed:
            self.close()
            self.lost(exc)

    def close(self) -> None:
        """Close at once (unsent bytes are dropped); ``lost`` is not called."""
        if self._closed:
            return
        self._closed = True
        if self._reading:
            self.loop.remove_reader(self.fd)
        if self._out:
            self._out.clear()
            self.loop.remove_writer(self.fd)
        self.sock.close()


class TLSStream(asyncio.Protocol):
    """A TLS connection, with :class:`StampedSocket`'s interface: its reads are stamped with
    ``time.time()`` when the loop runs them (the kernel's stamp is not reachable under TLS)."""

    def __init__(self, received: Callable[[bytes, float], None],
                 lost: Callable[[BaseException | None], None]) -> None:
        self.received = received
        self.lost = lost
        self.transport: asyncio.Transport | None = None
        self.kernel_stamps = False
        self.unstamped = 0
        self.sent_at: float | None = None  # when the last write went to the transport (unix)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's are not asyncio's classes

    def data_received(self, data: bytes) -> None:
        self.received(data, time.time())

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost(exc)

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.sent_at = time.time()
            self.transport.write(data)

    def pause(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def is_closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()


def _enable_stamps(sock: socket.socket) -> bool:
    if SO_TIMESTAMPNS is None or not hasattr(sock, "recvmsg"):
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True
