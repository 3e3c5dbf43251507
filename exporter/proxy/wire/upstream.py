"""The upstream side of a request: raw HTTP/1.1 over pooled keep-alive connections to the engines.

The proxy asks one thing of its client to the engines: send these bytes once, tell me the status
and headers, then hand me each body read, with the moment it arrived, in the callback that
received it.  So this module speaks HTTP/1.1 itself, with llhttp (``httptools``, the parser
uvicorn uses) reading the answer's framing:

* a plain connection is a :class:`exporter.proxy.wire.stamped.StampedSocket`: each read carries the
  kernel's receive stamp (``CLOCK_REALTIME``); a TLS one is an asyncio transport whose reads are
  stamped with ``time.time()`` when the loop runs them (same clock, the loop's lateness included);
* the request (head and body) goes out in one write, once: it is never sent again, whatever
  happens to the connection (a measuring proxy must not re-run a non-idempotent request);
* the status and headers wake the request's coroutine once; every body read after that goes
  straight to its sink (:class:`exporter.proxy.wire.relay.Relay`); body bytes that came before the
  sink was attached wait in the response, in order, with their stamps;
* a connection whose answer ended cleanly with keep-alive goes back to its origin's idle list
  (last in, first out) and is used again only within ``KEEPALIVE_S`` (4 s), before uvicorn, under
  vLLM and SGLang, closes an idle one (5 s); anything else is closed.

Errors are those of :mod:`exporter.proxy.wire.errors`: a connection that could not be opened is
``UpstreamConnectError`` (``connect_error``); one that broke, or an answer llhttp refused, is
``UpstreamClosed`` (``upstream_disconnect``), also when it closed after the request was written
and before any answer (its detail says so).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Iterable

import httptools
from multidict import CIMultiDict
from yarl import URL

from .answer import Response, Sink
from .errors import UpstreamClosed, UpstreamConnectError
from .stamped import StampedSocket, TLSStream

__all__ = ["Pool", "Response", "Sink", "Origin", "origin_of", "request_head", "HOP_BY_HOP", "KEEPALIVE_S"]

Origin = tuple[str, int, bool]  # host, port, TLS

#: headers that belong to one hop (RFC 9110 7.6.1), or whose value each side sets itself
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                        "trailer", "transfer-encoding", "upgrade", "host", "content-length"})
#: request headers never forwarded as they came: those, ``Accept-Encoding`` (the core reads plain
#: text) and ``Expect`` (the whole body is sent at once)
_NOT_FORWARDED = frozenset(h.encode("ascii") for h in HOP_BY_HOP | {"accept-encoding", "expect"})
#: an idle pooled connection is used again only this long (uvicorn closes one after 5 s)
KEEPALIVE_S = 4.0


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


class _Connection:
    """One keep-alive connection; one answer at a time.  Its I/O is a StampedSocket (plain) or a
    TLS transport; llhttp's callbacks fill the current :class:`Response`."""

    def __init__(self, pool: Pool, origin: Origin) -> None:
        self.pool = pool
        self.origin = origin
        self.io: StampedSocket | TLSStream | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.lost_already = False
        self.reusable = False  # the last answer ended cleanly with keep-alive
        self.answered = False  # the current answer's first byte came
        self.idle_since = 0.0  # monotonic: when it went back to the pool
        self.sent_at = 0.0  # unix: when the current request was written
        self.uses = 0  # requests written on it
        self._stamp = 0.0  # the stamp of the read being parsed
        self._paused = False
        self._reason: list[bytes] = []

    def kernel_stamps(self) -> bool:
        io = self.io
        return io is not None and io.kernel_stamps and io.unstamped == 0

    def request_sent(self) -> float | None:
        """Just before the current request's last byte went to the kernel (None: not yet)."""
        return self.io.sent_at if self.io is not None else None

    # -- the I/O's callbacks ------------------------------------------------------------------

    def received(self, data: bytes, stamp: float) -> None:
        if self.response is None:  # bytes on an idle connection answer nothing we asked: drop it
            self.close()
            return
        self.answered = True
        self._stamp = stamp
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamClosed("the engine switched protocols"))
        except httptools.HttpParserError as exc:
            self._fail(UpstreamClosed(f"unparseable HTTP from the engine: {exc}"))

    def lost(self, exc: BaseException | None) -> None:
        self.lost_already = True
        self.reusable = False
        self.pool.forget(self)
        resp = self.response
        if resp is None:
            return
        now = time.time()
        if resp.until_close and resp.head.done() and exc is None:
            resp.connection_lost(None, now)  # read-until-close body: the close is its end
        else:
            resp.connection_lost(UpstreamClosed(self._closed_detail(exc, now)), now)

    def _closed_detail(self, exc: BaseException | None, now: float) -> str:
        detail = f": {exc}" if exc is not None else ""
        if self.answered:
            return f"the engine closed the connection{detail}"
        held = f"{now - self.sent_at:.3f} s after the request was written"
        where = "a pooled connection" if self.uses > 1 else "a new connection"
        return (f"the engine closed the connection before answering anything ({held}, on {where}); "
                f"not sent again{detail}")

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
            resp.data_received(body, self._stamp)

    def on_message_complete(self) -> None:
        resp = self.response
        if resp is None or not resp.status:  # the end of an interim answer
            return
        self.reusable = self.parser.should_keep_alive()
        resp.connection_lost(None, self._stamp)  # E2E ends at the read that completed the answer

    # -- the pool's side ----------------------------------------------------------------------

    def send(self, data: bytes, head: asyncio.Future[None]) -> Response:
        assert self.io is not None
        self.response = resp = Response(self, head)
        self.reusable = False
        self.answered = False
        self.uses += 1
        self.sent_at = time.time()
        self.io.write(data)
        return resp

    def io_pause(self) -> None:
        if not self._paused and self.io is not None and not self.lost_already:
            self._paused = True
            self.io.pause()

    def io_resume(self) -> None:
        if self._paused and self.io is not None and not self.lost_already:
            self._paused = False
            self.io.resume()

    def usable(self) -> bool:
        return not self.lost_already and self.io is not None and not self.io.is_closing()

    def finished(self, resp: Response) -> None:
        if self.response is not resp:
            return
        self.response = None
        if self.reusable and resp.is_eof() and not self.lost_already:
            self.io_resume()
            self.pool.put(self)
        else:
            self.close()

    def _fail(self, error: BaseException) -> None:
        resp = self.response
        if resp is not None:
            resp.connection_lost(error, self._stamp or time.time())
        self.close()

    def close(self) -> None:
        self.reusable = False
        self.pool.forget(self)
        if self.io is not None:
            self.io.close()


class Pool:
    """Keep-alive connections per origin, opened on demand, with no limit on their number; an
    idle one is used again (the newest first) within ``KEEPALIVE_S``, else closed."""

    def __init__(self, connect_s: float) -> None:
        self.connect_s = connect_s
        self._idle: dict[Origin, list[_Connection]] = {}
        self._tls: ssl.SSLContext | None = None
        self.opened = 0  # connections opened so far (tests and benchmarks read it)

    async def request(self, origin: Origin, head: bytes, body: bytes) -> Response:
        """Send one request, once; return when its status and headers have come (raises
        ``UpstreamConnectError`` or ``UpstreamClosed``; never sends it a second time)."""
        conn = self._idle_connection(origin)
        if conn is None:
            conn = await self._connect(origin)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        resp = conn.send(head + body if body else head, fut)
        try:
            await fut
        except BaseException:
            conn.close()  # failed, cancelled (the client left) or timed out: the answer is abandoned
            raise
        return resp

    def _idle_connection(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if time.monotonic() - conn.idle_since >= KEEPALIVE_S:
                conn.close()
            elif conn.usable():
                return conn
        return None

    async def _connect(self, origin: Origin) -> _Connection:
        host, port, tls = origin
        conn = _Connection(self, origin)
        try:
            async with asyncio.timeout(self.connect_s):
                conn.io = await (self._open_tls(conn) if tls else self._open_plain(conn))
        except TimeoutError as exc:
            raise UpstreamConnectError(f"cannot connect to {host}:{port}: no answer within "
                                       f"connect_s={self.connect_s}") from exc
        except OSError as exc:
            raise UpstreamConnectError(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from exc
        self.opened += 1
        return conn

    async def _open_plain(self, conn: _Connection) -> StampedSocket:
        host, port, _ = conn.origin
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        error: OSError | None = None
        for family, kind, proto, _, address in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await loop.sock_connect(sock, address)
            except BaseException as exc:
                sock.close()
                if not isinstance(exc, OSError):
                    raise
                error = exc
                continue
            return StampedSocket(sock, loop, conn.received, conn.lost)
        raise error or OSError(f"no address for {host}")

    async def _open_tls(self, conn: _Connection) -> TLSStream:
        host, port, _ = conn.origin
        if self._tls is None:
            self._tls = ssl.create_default_context()
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(lambda: TLSStream(conn.received, conn.lost), host, port, ssl=self._tls)
        return proto

    def put(self, conn: _Connection) -> None:
        now = time.monotonic()
        conn.idle_since = now
        idle = self._idle.setdefault(conn.origin, [])
        while idle and now - idle[0].idle_since >= KEEPALIVE_S:  # the oldest first
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
