"""The proxy reads its clients' sockets itself (``exporter/proxy/wire/server.py``): each read
stamped by the kernel and handed to aiohttp's own protocol, so a request's arrival is the kernel's
receipt of it, however late the loop got to its socket (SPEC 27)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from exporter.proxy.app import create_app
from exporter.proxy.wire.server import (
    OPEN_FILES,
    ClientConnection,
    ClientTransport,
    allow_open_files,
    mark_responses,
    run_app,
    start,
    take_arrival,
)
from exporter.proxy.wire.stamped import SO_TIMESTAMPNS

from tests.helpers import eventually, make_config, wait_for_records
from tests.unit.test_proxy_added import HELD_S, Prompt, StampedClient
from tests.unit.test_relay import engine_factory  # noqa: F401  (a fixture)

pytestmark = pytest.mark.skipif(SO_TIMESTAMPNS is None, reason="the kernel's receive stamps are Linux's")

def _arrivals_app(seen: dict[str, Any]) -> web.Application:
    async def take(request: web.Request) -> web.Response:
        seen["handler"] = time.time()
        seen["arrival"] = take_arrival(request.transport)
        seen["transport"] = request.transport
        return web.Response(text="ok")

    async def other(request: web.Request) -> web.Response:
        return web.Response(text="other")

    async def body(request: web.Request) -> web.Response:
        transport = request.transport
        await eventually(lambda: asyncio.sleep(0, transport is not None and not transport.is_reading()))
        seen["paused"] = True  # the body's flow control stopped the proxy's own reads
        data = await request.read()
        return web.Response(text=f"{len(data)} {hashlib.sha256(data).hexdigest()}")

    async def close(request: web.Request) -> web.Response:
        transport = request.transport
        assert transport is not None
        seen["reading_before"] = transport.is_reading()
        transport.close()
        seen["reading_after"] = transport.is_reading()
        return web.Response(text="closed")

    async def hang(request: web.Request) -> web.Response:
        seen["transport"] = request.transport
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen["cancelled"] = True
            raise
        raise AssertionError("unreachable")

    async def refuse(request: web.Request) -> web.Response:
        return web.Response(status=413, text="refused")  # its body unread: aiohttp reads it after

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/refuse", refuse)
    app.router.add_get("/take", take)
    app.router.add_get("/other", other)
    app.router.add_post("/body", body)
    app.router.add_get("/hang", hang)
    app.router.add_get("/close", close)
    mark_responses(app)
    return app


def _get(sock: socket.socket, path: str) -> bytes:
    sock.sendall(b"GET %s HTTP/1.1\r\nHost: t\r\n\r\n" % path.encode())
    got = b""
    while b"\r\n\r\n" not in got or not got.rstrip().endswith((b"ok", b"other")):
        data = sock.recv(65536)
        assert data, got
        got += data
    return got


LOOPS = ["asyncio", "uvloop"]


def _on(loop_kind: str, scenario: Callable[[], Awaitable[Any]]) -> Any:
    """``scenario()`` on a loop of its own: asyncio's, or uvloop's (``serve``'s workers run on it)."""
    import uvloop

    loop = uvloop.new_event_loop() if loop_kind == "uvloop" else asyncio.new_event_loop()
    try:
        return loop.run_until_complete(scenario())
    finally:
        loop.close()


@contextlib.asynccontextmanager
async def _served(app: web.Application) -> AsyncIterator[int]:
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    sock = socket.create_server(("127.0.0.1", 0))
    server = await start(runner, sock)
    try:
        yield int(sock.getsockname()[1])
    finally:
        server.close()
        await runner.cleanup()


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_a_request_that_waited_in_the_receive_queue_arrives_at_the_kernels_receipt(loop_kind: str) -> None:
    """The loop is held while a new client's request waits unseen: its arrival is still the
    kernel's receipt, after the client's send and long before the handler ran (uvloop starts its
    own reads of a new connection, which the proxy stops: the request is read, stamped, by it)."""
    seen: dict[str, Any] = {}

    async def scenario() -> float:
        async with _served(_arrivals_app(seen)) as port:
            sock = socket.create_connection(("127.0.0.1", port))
            sent = time.time()
            sock.sendall(b"GET /take HTTP/1.1\r\nHost: t\r\n\r\n")
            time.sleep(0.3)  # this loop is the proxy's: the connection and its request wait in the kernel
            reply = await asyncio.get_running_loop().run_in_executor(None, sock.recv, 65536)
            sock.close()
            assert reply.startswith(b"HTTP/1.1 200")
            return sent

    sent = _on(loop_kind, scenario)
    assert isinstance(seen["transport"], ClientTransport)
    assert sent <= seen["arrival"] < sent + 0.15, (sent, seen)  # the loop's clock would be 0.3 s on
    assert seen["handler"] - seen["arrival"] >= 0.29


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_a_kept_alive_connections_next_request_arrives_at_its_own_read(loop_kind: str) -> None:
    """A response that took no arrival (``/other``) still ends its request's reads: the next
    request on the connection arrives at its own read, stamped, not at the first one's."""
    async def other(sock: socket.socket) -> None:
        await asyncio.get_running_loop().run_in_executor(None, _get, sock, "/other")

    sent, seen = _next_arrival(loop_kind, other, hold_s=0.3)  # held: the second request waits in the kernel too
    assert sent <= seen["arrival"] < sent + 0.15, (sent, seen)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_a_refused_bodys_rest_is_not_the_next_requests_arrival(loop_kind: str) -> None:
    """A request answered before its body was read (a 413): aiohttp reads the body's rest after the
    response, to keep the connection.  Those reads are the refused request's: the next request on
    the connection arrives at its own read, not at the first read of that rest."""
    size = 64 << 10

    async def refused(sock: socket.socket) -> None:
        sock.sendall(b"POST /refuse HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % size)
        answer = await asyncio.get_running_loop().run_in_executor(None, _until, sock, b"refused")
        assert answer.startswith(b"HTTP/1.1 413"), answer
        sock.sendall(b"x" * size)  # the rest, read after the response
        await asyncio.sleep(0.2)  # the loop runs: the rest is read now, well before the next request

    sent, seen = _next_arrival(loop_kind, refused)
    assert sent <= seen["arrival"] < sent + 0.15, (sent, seen)


def _next_arrival(loop_kind: str, before: Callable[[socket.socket], Awaitable[None]],
                  hold_s: float = 0.0) -> tuple[float, dict[str, Any]]:
    """On one kept-alive connection, ``before(sock)`` then ``GET /take``: when that was sent, and
    what its handler saw."""
    seen: dict[str, Any] = {}

    async def scenario() -> float:
        async with _served(_arrivals_app(seen)) as port:
            sock = socket.create_connection(("127.0.0.1", port))
            try:
                await before(sock)
                return await _take(sock, hold_s)
            finally:
                sock.close()

    return _on(loop_kind, scenario), seen


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_a_pipelined_request_arrives_with_the_read_that_brought_it(loop_kind: str) -> None:
    """Two requests in one read: the second, handled after the first's response, arrives at that
    read's stamp (it waited in the proxy from then), not at its handler's clock."""
    seen: dict[str, Any] = {}

    async def scenario() -> float:
        async with _served(_arrivals_app(seen)) as port:
            sock = socket.create_connection(("127.0.0.1", port))
            try:
                sent = time.time()
                sock.sendall(b"GET /other HTTP/1.1\r\nHost: t\r\n\r\nGET /take HTTP/1.1\r\nHost: t\r\n\r\n")
                time.sleep(0.3)  # both wait in the kernel, then come in one read
                await asyncio.get_running_loop().run_in_executor(None, _rest, sock)
            finally:
                sock.close()
            return sent

    sent = _on(loop_kind, scenario)
    assert seen["arrival"] is not None and sent <= seen["arrival"] < sent + 0.15, (sent, seen)
    assert seen["handler"] > sent + 0.3


async def _take(sock: socket.socket, hold_s: float = 0.0) -> float:
    """``GET /take`` on ``sock``, this loop (the proxy's) held ``hold_s`` after the send; when it was sent."""
    sent = time.time()
    sock.sendall(b"GET /take HTTP/1.1\r\nHost: t\r\n\r\n")
    time.sleep(hold_s)
    await asyncio.get_running_loop().run_in_executor(None, _rest, sock)
    return sent


def _rest(sock: socket.socket) -> bytes:
    return _until(sock, b"ok")


def _answer(sock: socket.socket) -> bytes:
    """One answer with a Content-Length, whole."""
    got = b""
    while b"\r\n\r\n" not in got:
        data = sock.recv(65536)
        assert data, got
        got += data
    head, _, body = got.partition(b"\r\n\r\n")
    length = int(head.lower().partition(b"content-length:")[2].split(b"\r\n")[0])
    while len(body) < length:
        data = sock.recv(65536)
        assert data, got + body
        body += data
    return head + b"\r\n\r\n" + body


def _until(sock: socket.socket, end: bytes) -> bytes:
    got = b""
    while not got.rstrip().endswith(end):
        data = sock.recv(65536)
        assert data, got
        got += data
    return got


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_a_large_body_is_paused_by_aiohttps_flow_control_and_arrives_whole(loop_kind: str) -> None:
    seen: dict[str, Any] = {}
    payload = os.urandom(8 << 20)
    expected = f"{len(payload)} {hashlib.sha256(payload).hexdigest()}".encode()

    def post(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST /body HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(payload) + payload)
            got = b""
            while b"\r\n\r\n" not in got or len(got.partition(b"\r\n\r\n")[2]) < len(expected):
                data = sock.recv(65536)
                if not data:
                    break
                got += data
            return got

    async def scenario() -> bytes:
        async with _served(_arrivals_app(seen)) as port:
            return await asyncio.get_running_loop().run_in_executor(None, post, port)

    reply = _on(loop_kind, scenario)
    assert seen.get("paused") is True
    assert reply.startswith(b"HTTP/1.1 200") and reply.partition(b"\r\n\r\n")[2] == expected


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_a_client_that_leaves_cancels_its_handler_and_leaves_no_descriptor(loop_kind: str) -> None:
    seen: dict[str, Any] = {}

    async def scenario() -> None:
        async with _served(_arrivals_app(seen)) as port:
            fds = len(os.listdir("/proc/self/fd"))
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"GET /hang HTTP/1.1\r\nHost: t\r\n\r\n")
            await eventually(lambda: asyncio.sleep(0, "transport" in seen))
            sock.close()
            await eventually(lambda: asyncio.sleep(0, seen.get("cancelled")))
            await eventually(lambda: asyncio.sleep(0, len(os.listdir("/proc/self/fd")) <= fds))  # the duplicate too

    _on(loop_kind, scenario)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_a_closed_connections_handler_is_freed_without_the_cycle_collector(loop_kind: str) -> None:
    """``serve``'s workers freeze their start-up objects out of the collector's way: a
    connection's handler must go when its connection does, not at the next collection."""
    import gc

    from aiohttp.web_protocol import RequestHandler

    seen: dict[str, Any] = {}

    def handlers() -> int:
        return sum(isinstance(o, RequestHandler) for o in gc.get_objects())

    async def scenario() -> None:
        async with _served(_arrivals_app(seen)) as port:
            loop = asyncio.get_running_loop()
            before = handlers()
            for _ in range(3):
                sock = socket.create_connection(("127.0.0.1", port))
                await loop.run_in_executor(None, _get, sock, "/take")
                sock.close()
            seen.clear()  # what the handler kept of its request
            await eventually(lambda: asyncio.sleep(0, handlers() <= before))

    gc.disable()
    try:
        _on(loop_kind, scenario)
    finally:
        gc.enable()


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_the_proxy_served_this_way_adds_the_whole_wait_to_proxy_added(
        loop_kind: str, engine_factory: Any, tmp_path: Path) -> None:  # noqa: F811
    """The proxy's own app on this server: the client's request waits while the loop is held;
    ``ttft_s`` has none of it, ``proxy_added_s`` all of it, from the kernel's receipt."""
    async def scenario() -> tuple[dict[str, Any], StampedClient]:
        engine = engine_factory(Prompt)
        async with _served(create_app(make_config(tmp_path, engine.port))) as port:
            client = StampedClient(port)
            client.start()
            assert client.sent.wait(10)
            time.sleep(HELD_S)
            (record,) = await wait_for_records(tmp_path, 1)
            await asyncio.get_running_loop().run_in_executor(None, client.join, 10)
            return record, client

    record, client = _on(loop_kind, scenario)
    assert record["outcome"] == "success" and record["ttft_s"] < HELD_S / 2
    assert record["proxy_added_s"] >= HELD_S
    assert client.ttft is not None and client.ttft >= record["ttft_s"] + record["proxy_added_s"] - 0.001, \
        (client.ttft, record)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_after_a_413_the_next_requests_proxy_added_is_its_own(
        loop_kind: str, engine_factory: Any, tmp_path: Path) -> None:  # noqa: F811
    """The proxy's own app: a body over ``max_request_body_bytes`` is refused with 413 before the
    whole of it came, and the rest is read after the answer; the next request on the connection,
    sent 0.2 s later, is held by the proxy for its own time only."""
    async def scenario() -> list[dict[str, Any]]:
        engine = engine_factory(Prompt)
        config = make_config(tmp_path, engine.port, max_request_body_bytes=4096)
        async with _served(create_app(config)) as port:
            loop = asyncio.get_running_loop()
            sock = socket.create_connection(("127.0.0.1", port))
            try:
                size = 64 << 10
                sock.sendall(b"POST /vllm/v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % size + b"x" * 8192)
                refused = await loop.run_in_executor(None, _answer, sock)
                assert refused.startswith(b"HTTP/1.1 413"), refused
                sock.sendall(b"x" * (size - 8192))  # the rest, read after the answer
                await asyncio.sleep(0.2)
                body = b'{"prompt":"p","stream":true,"max_tokens":2}'
                sock.sendall(b"POST /vllm/v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                return await wait_for_records(tmp_path, 2)
            finally:
                sock.close()

    refused, answered = _on(loop_kind, scenario)
    assert refused["reason"] == "proxy_error" and "413" in refused["detail"]
    assert answered["outcome"] == "success", answered
    assert answered["proxy_added_s"] < 0.1, answered  # not the 0.2 s since the refused body's rest


def test_a_worker_may_open_as_many_files_as_the_hard_limit_allows() -> None:
    """Two descriptors per client connection: the soft limit goes up to the hard one."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(soft, 512) if hard == resource.RLIM_INFINITY or hard > 512 else hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        got = allow_open_files()
        assert got == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert got == (OPEN_FILES if hard == resource.RLIM_INFINITY else hard) and (got > low or hard == low)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_run_app_serves_until_a_stop_and_closes_an_idle_kept_alive_connection() -> None:
    """``serve``'s workers run on ``run_app``: it answers, closes a connection idle for
    ``keepalive_timeout`` (``web.run_app``'s 75 s by default, not aiohttp's hour), and returns
    on a stop with its loop closed."""
    sock = socket.create_server(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    loop = asyncio.new_event_loop()
    worker = threading.Thread(target=run_app, args=(_arrivals_app({}), sock, loop),
                              kwargs={"backlog": 16, "shutdown_timeout": 1.0, "keepalive_timeout": 0.2}, daemon=True)
    worker.start()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            assert _get(conn, "/other").startswith(b"HTTP/1.1 200")
            assert conn.recv(1) == b""  # the server closed it once idle
    finally:
        def stop() -> None:
            raise web.GracefulExit()

        loop.call_soon_threadsafe(stop)
        worker.join(10)
    assert not worker.is_alive() and loop.is_closed()


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_a_closing_connection_is_read_no_more(loop_kind: str) -> None:
    seen: dict[str, Any] = {}

    async def scenario() -> None:
        async with _served(_arrivals_app(seen)) as port:
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"GET /close HTTP/1.1\r\nHost: t\r\n\r\n")
            await eventually(lambda: asyncio.sleep(0, "reading_after" in seen))
            sock.close()

    _on(loop_kind, scenario)
    assert seen == {"reading_before": True, "reading_after": False}


async def test_a_read_the_loop_made_carries_no_stamp_and_gives_no_arrival() -> None:
    """Before the proxy takes a connection over, uvloop may read it: those bytes reach aiohttp,
    but their arrival is not taken as the kernel's."""
    got: list[bytes] = []

    class Inner(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            got.append(data)

    conn = ClientConnection(Inner())
    conn.data_received(b"GET / HTTP/1.1\r\n")
    assert got == [b"GET / HTTP/1.1\r\n"] and conn.take_arrival() is None
