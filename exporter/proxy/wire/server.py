"""The proxy's server side: each client connection read by the proxy, every read stamped by the
kernel, and handed to aiohttp's own protocol (its parser, application, routes and handlers).

A request's arrival is where the proxy's hold of it starts (``proxy_added_s``).  aiohttp reads the
client's socket in the loop's own code, so the handler's clock starts only once the loop got to
that socket and aiohttp parsed the request: a request that waited in the socket's receive queue
while the loop was busy with other streams would not show it.  So, as the upstream's sockets are
(:mod:`exporter.proxy.wire.stamped`), each client connection is read here with ``recvmsg`` and the
kernel's receive stamp (``SO_TIMESTAMPNS``):

* :class:`ClientConnection` is the protocol the loop talks to.  At ``connection_made`` it stops
  the loop's transport from reading (``pause_reading``) and reads a duplicate of the connection's
  descriptor itself (``add_reader``: no polling), then hands aiohttp's :class:`RequestHandler` a
  :class:`ClientTransport`: the loop's transport, except that reading is the proxy's.  Writes go
  to the loop's transport unchanged (its bound ``write``: no call of ours per write).
* ``pause_reading`` and ``resume_reading`` (aiohttp's flow control of a request body) stop and
  start the proxy's reads; the end of the client's data (``b""``) is aiohttp's ``eof_received``;
  the connection's end (``connection_lost``) stops the reads and closes the duplicate.
* :func:`take_arrival` gives a handler the kernel's stamp of the first read since the last
  response was prepared on the connection (``on_response_prepare``, :func:`mark_responses`): the
  read that brought its request's first bytes.  A request with no read since (pipelined: it came
  with an earlier one) arrives at the last read's stamp, which brought it at the latest.  A
  response prepared before its request's body was all read (a 413) leaves the body's rest to
  aiohttp, which reads it after the response: those reads are that request's, and the next
  request's arrival is the first read after the body's end.  None where the connection is not
  read here (TLS, a Unix socket, a test's own server) and where that read carried no stamp (one
  the loop made before the proxy took over): the caller keeps its own clock.

:func:`start` serves a runner's application this way on a listening socket, and :func:`run_app`
runs it as ``web.run_app`` would: ``serve``'s workers run on it.  A duplicate is a second descriptor
per connection: :func:`allow_open_files` raises the soft limit on open files to the hard one, and a
connection that cannot have one (``EMFILE``) is read by the loop, its arrival the handler's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable
from typing import Any

from aiohttp import StreamReader, web

from .clientsock import tcp_socket
from .stamped import SO_TIMESTAMPNS, read_stamped

__all__ = ["ClientConnection", "ClientTransport", "start", "run_app", "take_arrival", "mark_responses", "allow_open_files"]


class ClientTransport:
    """The loop's transport of one client connection, as aiohttp's protocol sees it: every call goes
    to the loop's transport but reading, which :class:`ClientConnection` does."""

    def __init__(self, inner: asyncio.Transport, owner: ClientConnection) -> None:
        self._inner = inner
        self._owner = owner
        self.write = inner.write  # the hot path: no call of ours per write
        self.writelines = inner.writelines
        self.is_closing = inner.is_closing
        self.get_extra_info = inner.get_extra_info

    def __getattr__(self, name: str) -> Any:  # everything else is the loop's transport's
        return getattr(self._inner, name)

    def pause_reading(self) -> None:
        self._owner.pause()

    def resume_reading(self) -> None:
        self._owner.resume()

    def is_reading(self) -> bool:
        return self._owner.reading

    def take_arrival(self) -> float | None:
        """The kernel's stamp of the first read since the last take, else of the last read (None:
        that read carried no stamp)."""
        return self._owner.take_arrival()

    def reads_until(self, body: StreamReader) -> None:
        """The reads until ``body`` ends are its request's (answered before its body was read)."""
        self._owner.draining = body

    def close(self) -> None:
        self._owner.pause()  # what a closing connection's client still sends is not read
        self._inner.close()

    def abort(self) -> None:
        self._owner.pause()
        self._inner.abort()


class ClientConnection(asyncio.Protocol):
    """Reads one client connection with the kernel's stamps and hands each read to ``inner``
    (aiohttp's protocol); see the module's docstring."""

    def __init__(self, inner: asyncio.Protocol) -> None:
        self.inner = inner
        self.transport: ClientTransport | None = None  # set while the proxy reads the connection
        self.loop_transport: asyncio.Transport | None = None
        self.sock: socket.socket | None = None
        self.reading = False
        self.began = False  # a read came since the last take (the next request's first bytes)
        self.first: float | None = None  # its kernel stamp (None: it carried none)
        self.last: float | None = None  # the kernel stamp of the latest read (None: it carried none)
        #: the body of a request answered before it was read: aiohttp reads its rest after the response
        self.draining: StreamReader | None = None
        self._loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        loop_transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.sock = _duplicate(transport)
        if self.sock is None:  # not a TCP socket the proxy can read: the loop reads it, as it would
            self.inner.connection_made(transport)
            return
        self.transport = ClientTransport(loop_transport, self)
        self.loop_transport = loop_transport
        loop_transport.pause_reading()  # asyncio's loop then never reads it
        self.inner.connection_made(self.transport)  # type: ignore[arg-type]
        # uvloop starts its transport's reads once this returns, paused or not: they stop at the
        # loop's next round, and what they read meanwhile still reaches aiohttp (data_received)
        self._loop.call_soon(_stop_reading, loop_transport)
        self.resume()
        self._on_readable()  # what came with the connection (a new client's request), stamped

    def data_received(self, data: bytes) -> None:  # the loop's reads (before the pause): no stamp
        if self.loop_transport is not None:  # the proxy reads it (set and cleared with transport)
            # uvloop 0.19 starts its reads a round later still, after the call_soon above: the
            # first read the loop makes stops it, or it would read past aiohttp's flow control
            _stop_reading(self.loop_transport)
        self.began = True
        self.last = None
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()
        self.inner.connection_lost(exc)
        self.transport = self.loop_transport = None  # no cycle: aiohttp's handler is freed at once

    def take_arrival(self) -> float | None:
        first = self.first if self.began else self.last  # no read since: it came in the last one
        self.began = False
        self.first = None
        return first

    # -- the proxy's reads ----------------------------------------------------------------------

    def pause(self) -> None:
        if self.reading and self.sock is not None:
            self.reading = False
            self._loop.remove_reader(self.sock.fileno())

    def resume(self) -> None:
        if not self.reading and self.sock is not None:
            self.reading = True
            self._loop.add_reader(self.sock.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        sock = self.sock
        if sock is None:
            return
        try:
            data, stamp = read_stamped(sock)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # reset by the client: the loop's transport ends the connection
            self._release()
            if self.transport is not None:
                self.transport.abort()
            return
        if not data:  # the client's end of data
            self.pause()
            if not self.inner.eof_received() and self.transport is not None:
                self.transport.close()
            return
        self.last = stamp
        if not self.began:
            self.began = True
            self.first = stamp
        self.inner.data_received(data)
        draining = self.draining
        if draining is not None and draining.is_eof():  # the answered request's last bytes: what
            self.draining = None  # follows them (in this read or a later one) is the next request
            self.take_arrival()  # its reads end here, as a prepared response ends a request's

    def _release(self) -> None:
        self.pause()
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()


def _stop_reading(transport: asyncio.Transport) -> None:
    if not transport.is_closing():
        transport.pause_reading()


def _duplicate(transport: asyncio.BaseTransport) -> socket.socket | None:
    """A duplicate of the connection's TCP socket, stamped on receipt; None where it is not one
    (TLS, a Unix socket) or the platform has no receive stamps."""
    if SO_TIMESTAMPNS is None or transport.get_extra_info("sslcontext") is not None:
        return None
    sock = tcp_socket(transport)
    if sock is None:
        return None
    try:
        dup = socket.socket(sock.family, socket.SOCK_STREAM, fileno=os.dup(sock.fileno()))
    except OSError:
        return None
    try:
        dup.setblocking(False)
        dup.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        dup.close()
        return None
    return dup


def take_arrival(transport: object) -> float | None:
    """The kernel's stamp of the read that brought the current request's first bytes (unix
    seconds), once; None where the connection is not read by :class:`ClientConnection`."""
    return transport.take_arrival() if isinstance(transport, ClientTransport) else None


def mark_responses(app: web.Application) -> None:
    """Each response prepared on a connection ends its request's reads: the next read starts the
    next request (its arrival), whatever the handler (``/metrics``, ``/health``) took or not; for a
    request whose body was not all read (a 413), the first read after the body's end does."""

    async def prepared(request: web.Request, response: web.StreamResponse) -> None:
        transport = request.transport
        take_arrival(transport)
        if isinstance(transport, ClientTransport) and not request.content.is_eof():
            transport.reads_until(request.content)  # a body answered unread (413): its rest is its own

    app.on_response_prepare.append(prepared)


async def start(runner: web.AppRunner, sock: socket.socket, backlog: int = 1024) -> asyncio.AbstractServer:
    """Serve ``runner``'s application (set up) on the listening ``sock``, each connection read by
    a :class:`ClientConnection`."""
    server = runner.server
    assert server is not None, "runner.setup() first"
    if SO_TIMESTAMPNS is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        # The kernel stamps what it receives only while some socket asks it to: the listening one
        # does, for as long as it listens, and each connection it accepts inherits the option.
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    factory: Callable[[], asyncio.Protocol] = server
    return await asyncio.get_running_loop().create_server(lambda: ClientConnection(factory()), sock=sock,
                                                          backlog=backlog)


def run_app(app: web.Application, sock: socket.socket, loop: asyncio.AbstractEventLoop, backlog: int,
            shutdown_timeout: float, keepalive_timeout: float = 75.0) -> None:
    """``web.run_app``'s shape on :func:`start`: serves ``app`` on ``sock`` until a stop
    (``GracefulExit``, raised by a signal's handler), then shuts it down (its requests get
    ``shutdown_timeout``), cancels what is left and closes the loop.  An idle kept-alive
    connection is closed after ``keepalive_timeout`` (``web.run_app``'s default)."""

    async def main() -> None:
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=shutdown_timeout,
                               keepalive_timeout=keepalive_timeout)
        await runner.setup()
        server: asyncio.AbstractServer | None = None
        try:
            server = await start(runner, sock, backlog=backlog)
            await asyncio.Event().wait()  # until the stop cancels it
        finally:
            if server is not None:
                server.close()
            await runner.cleanup()

    allow_open_files()
    asyncio.set_event_loop(loop)
    task = loop.create_task(main())
    try:
        loop.run_until_complete(task)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        try:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    loop.run_until_complete(task)
        finally:
            _cancel_the_rest(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()


def _cancel_the_rest(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the tasks still running; an error one of them ended with goes to the loop's
    exception handler (logged), as ``web.run_app`` does."""
    left = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in left:
        t.cancel()
    loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
    for t in left:
        if not t.cancelled() and t.exception() is not None:
            loop.call_exception_handler({"message": "unhandled exception during shutdown",
                                         "exception": t.exception(), "task": t})


#: the soft limit on open files asked for where the hard one is unlimited
OPEN_FILES = 1 << 20


def allow_open_files() -> int:
    """Raise this process's soft limit on open files to its hard one: each client connection holds
    two descriptors (the loop's and the proxy's duplicate), so a default soft limit of 1,024 would
    cap a worker near 340 streams (with their upstream connections).  The limit now in force."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = OPEN_FILES if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
