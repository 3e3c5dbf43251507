"""The proxy's own upstream client (exporter/proxy/wire/upstream.py) against real sockets: aiohttp
servers for the ordinary answers, raw asyncio servers for the framings aiohttp never sends
(interim 100, a body ended by the close, garbage, a keep-alive close race)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from yarl import URL

from exporter.proxy.wire.errors import UpstreamClosed, UpstreamConnectError, transport_reason
from exporter.proxy.wire.upstream import Pool, Response, origin_of, request_head

from tests.helpers import eventually

PIECES = [b"data: %d\n\n" % i for i in range(50)]


class Sink:
    def __init__(self) -> None:
        self.reads: list[bytes] = []
        self.stamps: list[float] = []
        self.ended: list[BaseException | None] = []
        self.done = asyncio.get_running_loop().create_future()

    def on_data(self, data: bytes, stamp: float) -> None:
        self.reads.append(data)
        self.stamps.append(stamp)

    def end(self, error: BaseException | None, stamp: float) -> None:
        self.ended.append(error)
        if not self.done.done():
            self.done.set_result(None)


async def _body(resp: Response) -> tuple[bytes, Sink]:
    """Everything the answer's body holds, through a sink, as the relay takes it."""
    sink = Sink()
    for data, stamp in resp.take_pending():
        sink.on_data(data, stamp)
    if resp.is_eof() or resp.exception() is not None:
        sink.end(resp.exception(), 0.0)
    else:
        resp.attach(sink)
    await asyncio.wait_for(sink.done, 10)
    return b"".join(sink.reads), sink


def _get(url: URL, headers: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
    return request_head("GET", url, headers, 0)


async def _sse_app(aiohttp_server: Any, *, sized: bool = False, cut: bool = False) -> tuple[Any, list[Any]]:
    peers: list[Any] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        peers.append(request.transport.get_extra_info("peername"))
        body = b"".join(PIECES)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        if sized:
            resp.content_length = len(body)
        await resp.prepare(request)
        for i, piece in enumerate(PIECES):
            await resp.write(piece)
            await asyncio.sleep(0)
            if cut and i == 25:
                request.transport.close()
                return resp
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/", handle)
    server = await aiohttp_server(app)
    return server, peers


@pytest.mark.parametrize("sized", [False, True], ids=["chunked", "content-length"])
async def test_a_body_reaches_the_sink_whole_and_the_connection_is_reused(aiohttp_server: Any, sized: bool) -> None:
    server, peers = await _sse_app(aiohttp_server, sized=sized)
    url = server.make_url("/")
    pool = Pool(2.0)
    for _ in range(2):
        resp = await pool.request(origin_of(url), _get(url), b"")
        assert resp.status == 200 and resp.headers["Content-Type"] == "text/event-stream"
        body, sink = await _body(resp)
        assert body == b"".join(PIECES) and sink.ended == [None]
        resp.release()
        assert pool.idle(origin_of(url)) == 1  # a clean end with keep-alive: pooled
    assert pool.opened == 1 and len(peers) == 2 and peers[0] == peers[1]
    pool.close()


async def test_a_cut_reaches_the_sink_as_upstream_disconnect(aiohttp_server: Any) -> None:
    server, _ = await _sse_app(aiohttp_server, cut=True)
    url = server.make_url("/")
    pool = Pool(2.0)
    resp = await pool.request(origin_of(url), _get(url), b"")
    body, sink = await _body(resp)
    assert b"".join(PIECES).startswith(body) and len(body) < len(b"".join(PIECES))
    assert len(sink.ended) == 1 and isinstance(sink.ended[0], UpstreamClosed)
    assert transport_reason(sink.ended[0]) == "upstream_disconnect"
    resp.release()
    assert pool.idle(origin_of(url)) == 0  # a broken connection is never pooled


async def test_a_closed_port_is_a_connect_error() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    url = URL(f"http://127.0.0.1:{port}/v1/completions")
    with pytest.raises(UpstreamConnectError) as info:
        await Pool(2.0).request(origin_of(url), _get(url), b"")
    assert transport_reason(info.value) == "connect_error" and f"127.0.0.1:{port}" in str(info.value)


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
async def raw_server() -> AsyncIterator[Callable[[Handler], Awaitable[URL]]]:
    servers: list[asyncio.Server] = []

    async def start(handler: Handler) -> URL:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        servers.append(server)
        return URL(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/completions")

    yield start
    for server in servers:
        server.close()


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    return head + await reader.readexactly(length)


def _answer(*parts: bytes, close: bool = False) -> Handler:
    """A raw engine: reads one request, writes ``parts`` 50 ms apart, then closes or idles."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        for i, part in enumerate(parts):
            if i:
                await asyncio.sleep(0.05)
            writer.write(part)
            await writer.drain()
        if close:
            writer.close()
        else:
            await asyncio.sleep(1)

    return handler


async def test_an_interim_100_is_skipped(raw_server: Any) -> None:
    url = await raw_server(_answer(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Made\r\nX-A: 1\r\nContent-Length: 2\r\n\r\nok"))
    resp = await Pool(2.0).request(origin_of(url), request_head("POST", url, (), 2), b"{}")
    assert (resp.status, resp.reason, dict(resp.headers)) == (201, "Made", {"X-A": "1", "Content-Length": "2"})
    assert (await _body(resp))[0] == b"ok"


async def test_a_body_without_framing_ends_with_the_connection(raw_server: Any) -> None:
    url = await raw_server(_answer(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\ndata: a\n\n",
        b"data: [DONE]\n\n", close=True))
    pool = Pool(2.0)
    resp = await pool.request(origin_of(url), _get(url), b"")
    body, sink = await _body(resp)
    assert body == b"data: a\n\ndata: [DONE]\n\n" and sink.ended == [None]
    resp.release()
    assert pool.idle(origin_of(url)) == 0


async def test_garbage_from_the_engine_is_an_upstream_disconnect_not_a_crash(raw_server: Any) -> None:
    url = await raw_server(_answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nnot hex\r\n"))
    resp = await Pool(2.0).request(origin_of(url), _get(url), b"")
    _, sink = await _body(resp)
    assert len(sink.ended) == 1 and isinstance(sink.ended[0], UpstreamClosed)
    assert "unparseable" in str(sink.ended[0])


async def test_a_request_goes_upstream_once_even_when_the_engine_closes_before_answering(raw_server: Any) -> None:
    """An engine that answers once, then reads the next request on the same connection and
    closes without answering (it died mid-prefill, or closed an idle connection as the request
    came): the request is not sent again; it fails as upstream_disconnect, saying so."""
    requests = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        await _read_request(reader)
        requests += 1
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n%d" % requests)
        await writer.drain()
        try:
            await _read_request(reader)  # the next request on this connection: closed unanswered
            requests += 1
        except asyncio.IncompleteReadError:
            pass
        writer.close()

    url = await raw_server(handler)
    pool = Pool(2.0)
    first = await pool.request(origin_of(url), _get(url), b"")
    assert (await _body(first))[0] == b"1"
    first.release()
    assert pool.idle(origin_of(url)) == 1
    with pytest.raises(UpstreamClosed) as info:
        await pool.request(origin_of(url), _get(url), b"")
    assert transport_reason(info.value) == "upstream_disconnect"
    assert "before answering anything" in str(info.value) and "not sent again" in str(info.value)
    assert "pooled connection" in str(info.value)
    # a second attempt would have needed a new connection, opened before the error was raised
    assert requests == 2 and pool.opened == 1


async def test_a_request_abandoned_while_waiting_closes_its_connection(raw_server: Any) -> None:
    seen = asyncio.Event()
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        seen.set()
        if not await reader.read(1):  # nothing more comes: the proxy closed its end
            closed.set()

    url = await raw_server(handler)
    pool = Pool(2.0)
    task = asyncio.ensure_future(pool.request(origin_of(url), _get(url), b""))
    await asyncio.wait_for(seen.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(closed.wait(), 5)
    assert pool.idle(origin_of(url)) == 0


async def test_reading_pauses_and_resumes(aiohttp_server: Any) -> None:
    server, _ = await _sse_app(aiohttp_server)
    url = server.make_url("/")
    resp = await Pool(2.0).request(origin_of(url), _get(url), b"")
    loop = asyncio.get_running_loop()
    io = resp._conn.io
    assert io is not None
    resp.pause_reading()
    assert not loop.remove_reader(io.fd)  # no reader registered while paused
    resp.resume_reading()
    assert loop.remove_reader(io.fd)  # registered again (and taken off here: put it back)
    loop.add_reader(io.fd, io._on_readable)
    assert (await _body(resp))[0] == b"".join(PIECES)


def test_the_request_head_keeps_end_to_end_headers_and_sets_its_own_framing() -> None:
    headers = ((b"Content-Type", b"application/json"), (b"Connection", b"close"), (b"Host", b"evil"),
               (b"Transfer-Encoding", b"chunked"), (b"Content-Length", b"999"), (b"Accept-Encoding", b"gzip"),
               (b"Expect", b"100-continue"), (b"X-Bench-Scenario", b"a"), (b"X-Bad", b"a\r\nInjected: 1"))
    head = request_head("POST", URL("http://[::1]:8000/base/v1/completions?x=1"), headers, 12)
    assert head == (b"POST /base/v1/completions?x=1 HTTP/1.1\r\nHost: [::1]:8000\r\n"
                    b"Content-Type: application/json\r\nX-Bench-Scenario: a\r\n"
                    b"Content-Length: 12\r\nAccept-Encoding: identity\r\n\r\n")
    assert request_head("GET", URL("https://engine/health"), (), 0).startswith(b"GET /health HTTP/1.1\r\nHost: engine\r\n")
    assert origin_of(URL("https://engine/health")) == ("engine", 443, True)


def test_under_uvloop_as_serve_runs_it() -> None:
    """serve runs on uvloop, whose transports are not asyncio's classes."""
    uvloop = pytest.importorskip("uvloop")

    async def main() -> tuple[bytes, bytes, int]:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                try:
                    await _read_request(reader)
                except asyncio.IncompleteReadError:
                    return
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n")
                await writer.drain()

        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        url = URL(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/health")
        pool = Pool(2.0)
        bodies = []
        for _ in range(2):
            resp = await pool.request(origin_of(url), _get(url), b"")
            bodies.append((await _body(resp))[0])
            resp.release()
        pool.close()
        server.close()
        return bodies[0], bodies[1], pool.opened

    loop = uvloop.new_event_loop()
    try:
        assert loop.run_until_complete(main()) == (b"ok", b"ok", 1)
    finally:
        loop.close()


async def test_idle_connections_expire_and_one_that_speaks_unasked_is_closed(
        raw_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from exporter.proxy.wire import upstream

    writers: list[asyncio.StreamWriter] = []
    both = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        await _read_request(reader)
        if len(writers) == 2:
            both.set()
        await both.wait()  # both requests are in flight at once: two connections
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx")
        await writer.drain()
        await reader.read()

    url = await raw_server(handler)
    pool = Pool(2.0)
    first, second = await asyncio.gather(*(pool.request(origin_of(url), _get(url), b"") for _ in range(2)))
    for resp in (first, second):
        await _body(resp)
    first.release()
    assert pool.idle(origin_of(url)) == 1
    monkeypatch.setattr(upstream, "KEEPALIVE_S", 0.0)
    second.release()  # pooling it closes the one idle past KEEPALIVE_S
    assert pool.idle(origin_of(url)) == 1 and first._conn.io.is_closing()
    monkeypatch.setattr(upstream, "KEEPALIVE_S", 4.0)
    for writer in writers:  # an answer to nothing, on the idle one (the other is closed)
        writer.write(b"HTTP/1.1 200 OK\r\n\r\n")
    async def dropped() -> bool:
        return pool.idle(origin_of(url)) == 0
    await eventually(dropped)
