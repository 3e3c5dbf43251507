"""The relay (exporter/proxy/wire/relay.py) and its upstream sockets (exporter/proxy/wire/stamped.py),
through the proxy's public path: stamps taken by the kernel, E2E at the socket, a request sent
once, and a request path that never polls."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.proxy.wire import clientsock
from exporter.proxy.wire import relay as relay_module
from exporter.proxy.wire.stamped import SO_TIMESTAMPNS

from tests.helpers import wait_for_records

ROOT = Path(__file__).resolve().parents[2]
STREAM = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
          b'data: {"choices":[{"index":0,"text":"hi","finish_reason":null}]}\n\n',
          b'data: {"choices":[{"index":0,"text":"!","finish_reason":"length"}]}\n\n'
          b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}\n\n'
          b'data: [DONE]\n\n')


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        part = conn.recv(65536)
        if not part:
            return b""
        data += part
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        body += conn.recv(65536)
    return head


class ThreadEngine:
    """A raw HTTP/1.1 engine on its own thread (so it runs while the proxy's loop is blocked):
    ``serve(conn, n)`` answers the ``n``-th POST it was sent (a GET, the proxy's warm-up or
    engine probe, gets ``{}``)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.requests = 0
        self.threads: list[threading.Thread] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self.accept = threading.Thread(target=self._accept, daemon=True)
        self.accept.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._conn, args=(conn,), daemon=True)
            t.start()
            self.threads.append(t)

    def _conn(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(ConnectionResetError):  # the proxy closed its pooled connection
            while head := _read_request(conn):
                if not head.startswith(b"POST"):  # the proxy's warm-up and engine probes
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
                    continue
                self.requests += 1
                if not self.serve(conn, self.requests):
                    return

    def serve(self, conn: socket.socket, n: int) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        self.sock.close()


def _block_loop(loop: asyncio.AbstractEventLoop, blocked: threading.Event, seconds: float) -> None:
    """Make the proxy's loop busy for ``seconds`` (as a burst of other streams' reads would)."""
    def busy() -> None:
        blocked.set()
        time.sleep(seconds)
    loop.call_soon_threadsafe(busy)
    blocked.wait(10)


class BlockedWhileAnswering(ThreadEngine):
    """Answers the whole stream while the proxy's loop is blocked for 2 s."""

    def serve(self, conn: socket.socket, n: int) -> bool:
        assert self.loop is not None
        _block_loop(self.loop, threading.Event(), 2.0)
        conn.sendall(STREAM[0])
        for part in STREAM[1:]:
            conn.sendall(_chunk(part))
        conn.sendall(b"0\r\n\r\n")
        return True


@pytest.fixture
def engine_factory() -> Iterator[Any]:
    made: list[ThreadEngine] = []

    def make(cls: type[ThreadEngine]) -> ThreadEngine:
        engine = cls()
        engine.loop = asyncio.get_running_loop()
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()


@pytest.mark.skipif(SO_TIMESTAMPNS is None, reason="the kernel's receive stamps are Linux's")
async def test_reads_are_stamped_by_the_kernel_not_when_a_busy_loop_gets_to_them(
        engine_factory: Any, proxy_factory: Any, tmp_path: Path) -> None:
    """The engine answers in full while the proxy's loop is stuck for 2 s: stamped when the
    loop ran the reads, TTFT and E2E would be 2 s or more; the kernel stamped them on arrival
    (the margin is for a machine so busy that the engine's thread runs a second late)."""
    engine = engine_factory(BlockedWhileAnswering)
    client = await proxy_factory(engine.port)
    resp = await client.post("/vllm/v1/completions", json={"prompt": "p", "stream": True, "max_tokens": 2})
    assert resp.status == 200
    assert await resp.read() == b"".join(STREAM[1:])
    (record,) = await wait_for_records(tmp_path, 1)
    assert record["outcome"] == "success" and record["stamps"] == "kernel"
    assert record["ttft_s"] < 1.0 and record["e2e_s"] < 1.0, record
    assert record["timing_uncertainty_s"] >= 1.0  # the loop's lag is still told, as a bound


class AnswersOnceThenHoldsAndCloses(ThreadEngine):
    """Answers the first POST; reads any later one, holds it 0.3 s (a prefill) and closes its
    connection without a byte (the engine died).  A second attempt would be a third POST."""

    def serve(self, conn: socket.socket, n: int) -> bool:
        if n == 1:
            conn.sendall(STREAM[0] + b"".join(_chunk(p) for p in STREAM[1:]) + b"0\r\n\r\n")
            return True
        time.sleep(0.3)
        return False


async def test_a_close_before_any_answer_is_upstream_disconnect_sent_once_with_the_time_held(
        engine_factory: Any, proxy_factory: Any, tmp_path: Path) -> None:
    engine = engine_factory(AnswersOnceThenHoldsAndCloses)
    client = await proxy_factory(engine.port)
    body = {"prompt": "p", "stream": True, "max_tokens": 2}
    assert (await client.post("/vllm/v1/completions", json=body)).status == 200
    resp = await client.post("/vllm/v1/completions", json=body)
    assert resp.status == 502
    first, second = await wait_for_records(tmp_path, 2)
    assert first["outcome"] == "success"
    assert second["reason"] == "upstream_disconnect", second
    assert "before answering anything" in second["detail"] and "not sent again" in second["detail"]
    assert second["e2e_s"] >= 0.3  # the time the engine held the request
    # never a second attempt: one would have reached the engine before this next request, which
    # the engine holds 0.3 s before it closes (so the count is read after the engine read both)
    assert (await client.post("/vllm/v1/completions", json=body)).status == 502
    await wait_for_records(tmp_path, 3)
    assert engine.requests == 3


def test_the_request_path_never_polls() -> None:
    """No sleep and no timer of fixed period on one request's path: flow control and deadlines
    are events (the relay's one deadline timer is armed for the deadline itself)."""
    paths = [ROOT / "exporter" / "proxy" / "exchange.py", *(ROOT / "exporter" / "proxy" / "wire").glob("*.py")]
    assert len(paths) > 5
    for path in paths:
        source, name = path.read_text(), path.name
        assert "asyncio.sleep(" not in source and "time.sleep(" not in source, name
        assert "call_later(" not in source, name


# -- what the client receives in how many transmissions: the response's head leaves with the reads
# that came with it (exporter/proxy/wire/clientsock.py's ``cork``), as nginx sends a head with its
# first body bytes.  Counted by the client's kernel (``TCP_INFO``'s ``tcpi_data_segs_in``): on
# loopback one transmission is one segment.

#: ``struct tcp_info`` up to ``tcpi_data_segs_in`` (Linux 4.6): 8 bytes of u8 fields, 24 u32s, 4 u64s,
#: then segs_out, segs_in, notsent_bytes, min_rtt, data_segs_in
_TCP_INFO = struct.Struct("8x24I4Q5I")
WHOLE = STREAM[0] + b"".join(_chunk(p) for p in STREAM[1:]) + b"0\r\n\r\n"


def data_segments_in(sock: socket.socket) -> int:
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO.size)
    if len(raw) < _TCP_INFO.size:
        pytest.skip("this kernel's tcp_info has no tcpi_data_segs_in")
    return int(_TCP_INFO.unpack_from(raw)[-1])


class WholeAnswerAtOnce(ThreadEngine):
    def serve(self, conn: socket.socket, n: int) -> bool:
        conn.sendall(WHOLE)
        return True


class FirstTextWithTheHead(ThreadEngine):
    """The head and the first text in one write; the rest once the client has the first text."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()

    def serve(self, conn: socket.socket, n: int) -> bool:
        conn.sendall(STREAM[0] + _chunk(STREAM[1]))
        self.go.wait(10)
        conn.sendall(b"".join(_chunk(p) for p in STREAM[2:]) + b"0\r\n\r\n")
        return True


async def _send(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"prompt": "p", "stream": True, "max_tokens": 2}).encode()
    writer.write(b"POST /vllm/v1/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
    await writer.drain()
    return reader, writer


async def _until(reader: asyncio.StreamReader, data: bytes, end: bytes) -> bytes:
    while not data.endswith(end):
        part = await asyncio.wait_for(reader.read(65536), 10)
        assert part, data
        data += part
    return data


@pytest.mark.skipif(not hasattr(socket, "TCP_CORK"), reason="TCP_CORK is Linux's")
async def test_an_answer_read_whole_reaches_the_client_in_two_transmissions(
        engine_factory: Any, proxy_factory: Any, tmp_path: Path) -> None:
    """Head and body in one segment; the last chunk in another, after the request's record."""
    engine = engine_factory(WholeAnswerAtOnce)
    client = await proxy_factory(engine.port)
    reader, writer = await _send(client.port)
    data = await _until(reader, b"", b"0\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 200") and data.endswith(_chunk(STREAM[-1]) + b"0\r\n\r\n")
    assert data_segments_in(writer.get_extra_info("socket")) == 2
    (record,) = await wait_for_records(tmp_path, 1)
    assert record["outcome"] == "success"
    writer.close()


@pytest.mark.skipif(not hasattr(socket, "TCP_CORK"), reason="TCP_CORK is Linux's")
async def test_the_head_leaves_with_the_first_text_that_came_with_it(
        engine_factory: Any, proxy_factory: Any, tmp_path: Path) -> None:
    """The client's first segment holds the head and the first text; the rest follows apart."""
    engine = engine_factory(FirstTextWithTheHead)
    client = await proxy_factory(engine.port)
    reader, writer = await _send(client.port)
    first = await _until(reader, b"", _chunk(STREAM[1]))
    sock = writer.get_extra_info("socket")
    assert first.startswith(b"HTTP/1.1 200") and data_segments_in(sock) == 1
    engine.go.set()
    await _until(reader, first, b"0\r\n\r\n")
    assert data_segments_in(sock) >= 2
    (record,) = await wait_for_records(tmp_path, 1)
    assert record["outcome"] == "success" and record["completion_tokens"] == 2
    writer.close()


class HeadThenTexts(ThreadEngine):
    """The head alone; the texts once the client has it (a prefill: the head before any text)."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()

    def serve(self, conn: socket.socket, n: int) -> bool:
        conn.sendall(STREAM[0])
        self.go.wait(10)
        conn.sendall(b"".join(_chunk(p) for p in STREAM[1:]) + b"0\r\n\r\n")
        return True


async def test_a_head_that_came_alone_reaches_the_client_at_once(
        engine_factory: Any, proxy_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing holds a head that has no reads with it: the client's socket is never corked for it
    (the kernel would send a corked head after 200 ms anyway), and the client has the head while the
    engine still holds every text."""
    corked: list[bool] = []

    def cork(transport: Any, on: bool) -> bool:
        corked.append(on)
        return clientsock.cork(transport, on)

    monkeypatch.setattr(relay_module, "cork", cork)
    engine = engine_factory(HeadThenTexts)
    client = await proxy_factory(engine.port)
    reader, writer = await _send(client.port)
    head = await _until(reader, b"", b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b'"text"' not in head
    assert True not in corked
    engine.go.set()
    await _until(reader, head, b"0\r\n\r\n")
    (record,) = await wait_for_records(tmp_path, 1)
    assert record["outcome"] == "success"
    writer.close()
