"""The library contracts the proxy relies on (exporter/proxy/wire/writer.py, exporter/proxy/valuefiles.py), each exercised by
name against the installed releases (CI: at the floor and at the newest): aiohttp's response
writer beneath the relay, through real sockets, and prometheus_client's multiprocess values,
through real files.  A release that breaks one turns its test red."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, values
from prometheus_client.multiprocess import MultiProcessCollector

from exporter.proxy.valuefiles import use_multiprocess_values
from exporter.proxy.wire.writer import client_writing_paused, write_body

PARTS = [b"data: %d\n\n" % i for i in range(20)] + [b"x" * 20000]


async def test_aiohttp_body_beneath_the_writer_then_write_eof(aiohttp_server: Any) -> None:
    """write_body: after prepare() and send_headers(), chunk-framed bytes on the transport are
    the body, and write_eof(rest) ends it with rest and the last chunk."""
    seen: dict[str, Any] = {}

    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        writer = await resp.prepare(request)
        assert writer is not None and request.transport is not None
        seen["chunked"] = writer.chunked
        writer.send_headers()  # type: ignore[attr-defined]
        for part in PARTS:
            write_body(request.transport, part, writer.chunked)
        await resp.write_eof(b"rest")
        return resp

    app = web.Application()
    app.router.add_get("/", handle)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession() as session:
        for _ in range(2):  # and the keep-alive connection is sound for the next response
            async with session.get(server.make_url("/")) as resp:
                assert resp.headers["Transfer-Encoding"] == "chunked"
                assert await resp.read() == b"".join(PARTS) + b"rest"
    assert seen["chunked"] is True


async def test_aiohttp_flow_control_pause_writing_and_drain(aiohttp_server: Any) -> None:
    """client_writing_paused: the protocol says when its transport paused writing; the writer's
    drain() returns once the client took enough for resume_writing."""
    events: list[str] = []
    paused = asyncio.Event()

    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        writer = await resp.prepare(request)
        assert writer is not None and request.transport is not None
        writer.send_headers()  # type: ignore[attr-defined]
        request.transport.set_write_buffer_limits(high=16 << 10, low=4 << 10)
        while not client_writing_paused(request):
            write_body(request.transport, b"y" * 4096, writer.chunked)
            await asyncio.sleep(0)  # let the transport try the socket
        events.append("paused")
        paused.set()
        await writer.drain()
        events.append("drained")
        assert not client_writing_paused(request)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/", handle)
    server = await aiohttp_server(app)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", server.port))
    await loop.sock_sendall(sock, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(paused.wait(), 30)
    assert events == ["paused"]  # the client has read nothing: drain() waits
    while not (data := await loop.sock_recv(sock, 65536)).endswith(b"0\r\n\r\n"):
        assert data
    assert events == ["paused", "drained"]
    sock.close()


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
