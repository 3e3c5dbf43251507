"""The upstream side of the hop: raw HTTP/1.1 over pooled keep-alive connections to the engines.

aiohttp's client costs a request more than the engine's answer needs: a ``ClientRequest`` and
``ClientResponse`` built per request, a connector, a stream reader fed per read, and a coroutine
wake-up for each step of the way.  The proxy asks for one thing only: send these bytes, tell me
the status and headers, then hand me each body read in the callback that received it.  So this
module speaks HTTP/1.1 itself, with llhttp (``httptools``, the parser uvicorn uses) reading the
answer's framing:

* one ``asyncio.Protocol`` per connection; the request (head and body) goes out in one write;
* the status and headers wake the request's coroutine once; every body read after that goes
  straight to its sink (:class:`exporter.proxy.hop.Splice`) from ``data_received``; body bytes
  that came before the sink was attached wait in the response, in order;
* a connection whose answer ended cleanly with keep-alive goes back to its origin's idle list
  (last in, first out); anything else is closed;
* a request sent on a reused connection that the engine closed before answering anything (the
  keep-alive race: uvicorn closes idle connections after 5 s) is sent once more on a fresh one.

Errors are :mod:`exporter.proxy.transport`'s: a connection that could not be opened is
``UpstreamConnectError`` (``connect_error``); one that broke, or an answer llhttp refused, is
``UpstreamClosed`` (``upstream_disconnect``).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Iterable
from typing import Protocol, cast

import httptools
from multidict import CIMultiDict
from yarl import URL

from .transport import UpstreamClosed, UpstreamConnectError

__all__ = ["Pool", "Response", "Sink", "Origin", "origin_of", "request_head", "HOP_BY_HOP"]

Origin = tuple[str, int, bool]  # host, port, TLS

#: headers that belong to one hop (RFC 9110 7.6.1), or whose value each side sets itself
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                        "trailer", "transfer-encoding", "upgrade", "host", "content-length"})
#: request headers never forwarded as they came: those, ``Accept-Encoding`` (the core reads plain
#: text) and ``Expect`` (the whole body is sent at once)
_NOT_FORWARDED = frozenset(h.encode("ascii") for h in HOP_BY_HOP | {"accept-encoding", "expect"})


class Sink(Protocol):
    """Where a response's body goes once attached."""

    def on_data(self, data: bytes) -> None: ...

    def end(self, error: BaseException | None) -> None: ...


def origin_of(url: URL) -> Origin:
    tls = url.scheme == "https"
    return (url.raw_host or "", url.port or (443 if tls else 80), tls)


def request_head(method: str, url: URL, raw_headers: Iterable[tuple[bytes, bytes]], body_len: int) -> bytes:
    """The request line and headers for ``url``: the client's end-to-end headers as they came
    (bytes, in order), then Host, Content-Length and ``Accept-Encoding: identity`` (the core reads
    plain text)."""
    host, port, tls = origin_of(url)
    authority = f"[{host}]" if ":" in host else host
    if port != (443 if tls else 80):
        authority += f":{port}"
    lines = [f"{method} {url.raw_path_qs} HTTP/1.1\r\nHost: {authority}\r\n".encode("ascii")]
    for name, value in raw_headers:
        if name.lower() not in _NOT_FORWARDED and b"\r" not in value and b"\n" not in value:
            lines.append(name + b": " + value + b"\r\n")
    lines.append(b"Content-Length: %d\r\nAccept-Encoding: identity\r\n\r\n" % body_len)
    return b"".join(lines)


class Response:
    """One answer: its status line and headers, then its body, read by read."""

    __slots__ = ("status", "reason", "headers", "_conn", "_pending", "_sink", "_error", "_eof",
                 "until_close", "head")

    def __init__(self, conn: _Connection, head: asyncio.Future[None]) -> None:
        self.status = 0
        self.reason = ""
        self.headers: CIMultiDict[str] = CIMultiDict()
        self._conn = conn
        self._pending: list[bytes] = []
        self._sink: Sink | None = None
        self._error: BaseException | None = None
        self._eof = False
        self.until_close = False  # neither Content-Length nor chunked: the body ends with the connection
        self.head = head

    # -- the request's side -----------------------------------------------------------------

    def take_pending(self) -> bytes:
        """Body bytes that arrived before a sink was attached (b"" if none)."""
        pending, self._pending = self._pending, []
        return pending[0] if len(pending) == 1 else b"".join(pending)

    def exception(self) -> BaseException | None:
        return self._error

    def is_eof(self) -> bool:
        return self._eof

    def attach(self, sink: Sink) -> None:
        """From now on each body read calls ``sink.on_data``; the end or a failure ``sink.end``."""
        self._sink = sink

    def detach(self) -> None:
        self._sink = None

    def pause_reading(self) -> None:
        self._conn.pause()

    def resume_reading(self) -> None:
        self._conn.resume()

    async def read(self) -> bytes:
        """The whole body (a short one: a health check, a model list); raises its error."""
        parts = [self.take_pending()]
        if not (self._eof or self._error is not None):
            ended = asyncio.get_running_loop().create_future()
            self.attach(_Collect(parts, ended))
            try:
                await ended
            finally:
                self.detach()
        if self._error is not None:
            raise self._error
        return b"".join(parts)

    def release(self) -> None:
        """Done with the answer: a connection that ended it cleanly is pooled, else closed."""
        self._sink = None
        self._conn.finished(self)

    # -- the connection's side ----------------------------------------------------------------

    def _end(self, error: BaseException | None) -> None:
        if self._eof or self._error is not None:
            return
        if error is None:
            self._eof = True
        else:
            self._error = error
        if not self.head.done():
            if error is None:
                self.head.set_result(None)
            else:
                self.head.set_exception(error)
        sink = self._sink
        if sink is not None:
            sink.end(error)


class _Collect:
    """A sink that keeps a body's reads and says when it ended."""

    def __init__(self, parts: list[bytes], ended: asyncio.Future[None]) -> None:
        self.parts = parts
        self.ended = ended

    def on_data(self, data: bytes) -> None:
        self.parts.append(data)

    def end(self, error: BaseException | None) -> None:
        if not self.ended.done():
            self.ended.set_result(None)


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one answer at a time."""

    def __init__(self, pool: Pool, origin: Origin) -> None:
        self.pool = pool
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.lost = False
        self.reusable = False  # the last answer ended cleanly with keep-alive
        self.answered = False  # the current answer's first byte came
        self.idle_since = 0.0
        self._paused = False
        self._reason: list[bytes] = []

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not its subclasses

    def data_received(self, data: bytes) -> None:
        if self.response is None:  # bytes on an idle connection answer nothing we asked: drop it
            self.close()
            return
        self.answered = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamClosed("the engine switched protocols"))
        except httptools.HttpParserError as exc:
            self._fail(UpstreamClosed(f"unparseable HTTP from the engine: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.reusable = False
        self.pool.forget(self)
        resp = self.response
        if resp is None:
            return
        if resp.until_close and resp.head.done() and exc is None:
            resp._end(None)  # read-until-close body: the close is its end
        else:
            detail = f": {exc}" if exc is not None else ""
            resp._end(UpstreamClosed(f"the engine closed the connection{detail}"))

    # -- llhttp's callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._reason = []
        resp = self.response
        if resp is not None:
            resp.headers = CIMultiDict()

    def on_status(self, reason: bytes) -> None:
        self._reason.append(reason)

    def on_header(self, name: bytes, value: bytes) -> None:
        resp = self.response
        if resp is not None:
            resp.headers.add(name.decode("latin-1"), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        resp = self.response
        if resp is None:
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
            return
        resp.status = status
        resp.reason = b"".join(self._reason).decode("latin-1")
        te = resp.headers.get("Transfer-Encoding", "")
        resp.until_close = ("Content-Length" not in resp.headers and "chunked" not in te.lower()
                            and status not in (204, 304))
        if not resp.head.done():
            resp.head.set_result(None)

    def on_body(self, body: bytes) -> None:  # the hot path: one call to the sink, no more
        resp = self.response
        if resp is not None and resp.status:
            sink = resp._sink
            if sink is not None:
                sink.on_data(body)
            else:
                resp._pending.append(body)

    def on_message_complete(self) -> None:
        resp = self.response
        if resp is None or not resp.status:  # the end of an interim answer
            return
        self.reusable = self.parser.should_keep_alive()
        resp._end(None)

    # -- the pool's side ----------------------------------------------------------------------

    def send(self, data: Iterable[bytes], head: asyncio.Future[None]) -> Response:
        assert self.transport is not None
        self.response = resp = Response(self, head)
        self.reusable = False
        self.answered = False
        self.transport.writelines(data)
        return resp

    def pause(self) -> None:
        if not self._paused and self.transport is not None and not self.lost:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.lost:
            self._paused = False
            self.transport.resume_reading()

    def finished(self, resp: Response) -> None:
        if self.response is not resp:
            return
        self.response = None
        if self.reusable and resp.is_eof() and not self.lost:
            self.resume()
            self.pool.put(self)
        else:
            self.close()

    def _fail(self, error: BaseException) -> None:
        resp = self.response
        if resp is not None:
            resp._end(error)
        self.close()

    def close(self) -> None:
        self.reusable = False
        self.pool.forget(self)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()


#: an idle pooled connection older than this is closed (aiohttp's client keeps them 15 s too)
KEEPALIVE_S = 15.0


class Pool:
    """Keep-alive connections per origin, opened on demand, with no limit on their number; an
    idle one is used again (the newest first) or closed after ``KEEPALIVE_S``."""

    def __init__(self, connect_s: float) -> None:
        self.connect_s = connect_s
        self._idle: dict[Origin, list[_Connection]] = {}
        self._tls: ssl.SSLContext | None = None
        self.opened = 0  # connections opened so far (tests and benchmarks read it)

    async def request(self, origin: Origin, head: bytes, body: bytes) -> Response:
        """Send one request; return once its status and headers have come (raises
        ``UpstreamConnectError`` or ``UpstreamClosed``)."""
        loop = asyncio.get_running_loop()
        for attempt in (0, 1):
            conn = self._idle_connection(origin)
            reused = conn is not None
            if conn is None:
                conn = await self._connect(origin)
            fut: asyncio.Future[None] = loop.create_future()
            resp = conn.send((head, body) if body else (head,), fut)
            try:
                await fut
            except UpstreamClosed:
                if reused and attempt == 0 and not conn.answered:
                    continue  # closed by the engine while idle, before it read this request
                raise
            except BaseException:
                conn.close()  # cancelled (the client left) or timed out: the answer is abandoned
                raise
            return resp
        raise AssertionError("unreachable")  # pragma: no cover

    def _idle_connection(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if time.monotonic() - conn.idle_since > KEEPALIVE_S:
                conn.close()
            elif not conn.lost and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    async def _connect(self, origin: Origin) -> _Connection:
        host, port, tls = origin
        loop = asyncio.get_running_loop()
        ctx: ssl.SSLContext | None = None
        if tls:
            if self._tls is None:
                self._tls = ssl.create_default_context()
            ctx = self._tls
        try:
            async with asyncio.timeout(self.connect_s):
                _, conn = await loop.create_connection(lambda: _Connection(self, origin), host, port, ssl=ctx)
        except TimeoutError as exc:
            raise UpstreamConnectError(f"cannot connect to {host}:{port}: no answer within "
                                       f"connect_s={self.connect_s}") from exc
        except OSError as exc:
            raise UpstreamConnectError(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from exc
        self.opened += 1
        return conn

    def put(self, conn: _Connection) -> None:
        now = time.monotonic()
        conn.idle_since = now
        idle = self._idle.setdefault(conn.origin, [])
        while idle and now - idle[0].idle_since > KEEPALIVE_S:  # the oldest first
            idle.pop(0).close()
        idle.append(conn)

    def forget(self, conn: _Connection) -> None:
        idle = self._idle.get(conn.origin)
        if idle and conn in idle:
            idle.remove(conn)

    def idle(self, origin: Origin) -> int:
        """Idle connections to ``origin`` (tests read it)."""
        return len(self._idle.get(origin, ()))

    def close(self) -> None:
        for idle in list(self._idle.values()):
            for conn in list(idle):
                conn.close()
        self._idle.clear()
