"""The private library contracts the proxy relies on (exporter/proxy/internals.py), each
exercised against the installed aiohttp and prometheus_client through real sockets and real
multiprocess files: a release that breaks one turns its test red here, by name."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.streams import StreamReader
from prometheus_client import CollectorRegistry, Counter, values
from prometheus_client.multiprocess import MultiProcessCollector

from exporter.proxy.internals import is_redirected, redirect_reads, restore_reads, use_multiprocess_values

PIECES = [b"data: %d\n\n" % i for i in range(50)]


class Sink:
    def __init__(self) -> None:
        self.reads: list[bytes] = []
        self.ended: list[BaseException | None] = []
        self.done = asyncio.get_running_loop().create_future()

    def on_data(self, data: bytes) -> None:
        self.reads.append(data)

    def end(self, error: BaseException | None) -> None:
        self.ended.append(error)
        if not self.done.done():
            self.done.set_result(None)


#: set by the client once its reads are redirected: the upstream sends the rest only then
GO: dict[str, asyncio.Event] = {}


async def _upstream(aiohttp_server: Any, *, sized: bool = False, cut: bool = False) -> Any:
    peers: list[Any] = []
    GO["go"] = go = asyncio.Event()

    async def handle(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        peers.append(request.transport.get_extra_info("peername"))
        body = b"".join(PIECES)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        if sized:
            resp.content_length = len(body)
        await resp.prepare(request)
        await resp.write(PIECES[0])
        await go.wait()  # the client has its headers, maybe the first read, and redirected the rest
        for piece in PIECES[1:25]:
            await resp.write(piece)
            await asyncio.sleep(0)
        if cut:
            request.transport.close()
            return resp
        for piece in PIECES[25:]:
            await resp.write(piece)
            await asyncio.sleep(0)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/", handle)
    server = await aiohttp_server(app)
    return server, peers


async def _redirected(resp: aiohttp.ClientResponse) -> tuple[Sink, bytes]:
    assert type(resp.content) is StreamReader  # the class that can be switched in place
    await asyncio.sleep(0.01)
    first = resp.content.read_nowait()  # what came with the headers stays buffered
    sink = Sink()
    redirect_reads(resp.content, sink)
    assert is_redirected(resp.content)
    GO["go"].set()
    await asyncio.wait_for(sink.done, 10)
    return sink, first


@pytest.mark.parametrize("sized", [False, True], ids=["chunked", "content-length"])
async def test_redirected_reads_reach_the_sink_and_release_the_connection(aiohttp_server: Any, sized: bool) -> None:
    server, peers = await _upstream(aiohttp_server, sized=sized)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        async with session.get(server.make_url("/")) as resp:
            sink, first = await _redirected(resp)
            assert first + b"".join(sink.reads) == b"".join(PIECES)
            assert sink.reads and sink.ended == [None]  # feed_eof reached the sink, once
            restore_reads(resp.content)
            assert type(resp.content) is StreamReader and resp.content.is_eof()
        async with session.get(server.make_url("/")) as resp:  # the end released the connection
            await resp.read()
    assert len(peers) == 2 and peers[0] == peers[1]


async def test_an_upstream_cut_reaches_the_sink_as_an_error(aiohttp_server: Any) -> None:
    server, _ = await _upstream(aiohttp_server, cut=True)
    async with aiohttp.ClientSession() as session, session.get(server.make_url("/")) as resp:
        sink, _ = await _redirected(resp)
        restore_reads(resp.content)
    assert len(sink.ended) == 1 and isinstance(sink.ended[0], aiohttp.ClientPayloadError)


async def test_the_connection_protocol_pauses_and_resumes_reading(aiohttp_server: Any) -> None:
    server, _ = await _upstream(aiohttp_server)
    async with aiohttp.ClientSession() as session, session.get(server.make_url("/")) as resp:
        assert resp.connection is not None
        protocol = resp.connection.protocol
        assert protocol is not None and protocol.transport is not None
        protocol.pause_reading()
        assert not protocol.transport.is_reading()
        protocol.resume_reading()
        assert protocol.transport.is_reading()
        GO["go"].set()
        await resp.read()


def test_restoring_a_reader_never_redirected_changes_nothing() -> None:
    class Proto:
        def resume_reading(self, resume_parser: bool = True) -> None:
            pass

    loop = asyncio.new_event_loop()
    try:
        reader = StreamReader(Proto(), 1 << 16, loop=loop)  # type: ignore[arg-type]
        restore_reads(reader)
        assert type(reader) is StreamReader
        with pytest.raises(TypeError):
            redirect_reads(object(), Sink.__new__(Sink))  # type: ignore[arg-type]
    finally:
        loop.close()


def test_multiprocess_values_go_to_the_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker inherits prometheus_client imported without PROMETHEUS_MULTIPROC_DIR: the
    value class is replaced, and metrics made after it write this process's files."""
    monkeypatch.setattr(values, "ValueClass", values.ValueClass)  # restored after the test
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    use_multiprocess_values()
    counter = Counter("llmbench_internals_probe", "probe", ["k"], registry=None)
    counter.labels("a").inc(3)
    assert list(tmp_path.glob("counter_*.db"))
    merged = CollectorRegistry()
    MultiProcessCollector(merged, path=str(tmp_path))
    assert merged.get_sample_value("llmbench_internals_probe_total", {"k": "a"}) == 3.0
