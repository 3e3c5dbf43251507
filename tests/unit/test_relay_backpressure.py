"""The relay (exporter/proxy/wire/relay.py), through its public path: a real aiohttp upstream, the real
proxy app and real client sockets.  The client gets the upstream's bytes however the reads
are split, and the verdict does not depend on the split; a client that stops reading pauses
the upstream until it drains; a client that leaves ends the relay.

How long a pause takes to resume is timed in ``bench/backpressure_timing.py``, never here."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from exporter.core.analysis import RequestSpec, analyze_bytes

from tests.helpers import OK_BODY, OK_EVENTS, read_records, wait_for_records
from tests.transcripts import CASES, Case

STREAM_REQ = {"model": "m", "prompt": "x", "stream": True, "stream_options": {"include_usage": True}}


class LockStep:
    """An upstream that writes its body in ``pieces``, each only once the client has read
    every byte before it through the proxy: the proxy gets each piece in a read of its own.
    ``length``: a Content-Length body instead of a chunked one."""

    def __init__(self, pieces: list[bytes], status: int = 200, content_type: str = "text/event-stream",
                 length: bool = False) -> None:
        self.pieces = pieces
        self.status = status
        self.content_type = content_type
        self.length = length
        self.client_read = 0
        self._moved = asyncio.Event()

    async def handler(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=self.status, headers={"Content-Type": self.content_type})
        if self.length:
            resp.content_length = sum(len(p) for p in self.pieces)
        await resp.prepare(request)
        sent = 0
        for piece in self.pieces:
            await resp.write(piece)
            sent += len(piece)
            while self.client_read < sent:  # the proxy passed it on: the next write is a new read
                self._moved.clear()
                await self._moved.wait()
        await resp.write_eof()
        return resp

    async def fetch(self, client: Any, req: dict[str, Any]) -> bytes:
        """POST ``req`` through the proxy, reading the answer as it comes."""
        got = bytearray()
        async with asyncio.timeout(30):  # only against a hang
            resp = await client.post("/vllm/v1/completions", json=req)
            while chunk := await resp.content.readany():
                got += chunk
                self.client_read = len(got)
                self._moved.set()
        return bytes(got)


def _request(case: Case) -> dict[str, Any]:
    req: dict[str, Any] = {"model": "m", "prompt": "x", "stream": case.streaming}
    if case.streaming:
        req["stream_options"] = {"include_usage": True}
    if case.expected is not None:
        req |= {"max_tokens": case.expected, "ignore_eos": True}
    return req


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
async def test_reads_split_at_every_byte(upstream, proxy_factory, tmp_path: Path, case: Case) -> None:
    """One byte per read (the capture lists the proxy's reads): the client gets the same
    bytes, the verdict is the table's and the same as for the body read whole."""
    up, server = upstream
    body = case.body
    step = LockStep([body[i:i + 1] for i in range(len(body))], case.status,
                    "text/event-stream" if case.streaming else "application/json")
    up.handler = step.handler
    client = await proxy_factory(server.port, capture_raw_sse="all")
    assert await step.fetch(client, _request(case)) == body
    rec, = read_records(tmp_path)
    reads = json.loads(Path(rec["capture"]).with_suffix(".json").read_text())["reads"]
    assert [n for _, n, _ in reads] == [1] * len(body)
    whole = analyze_bytes([(0.5, body)], status=case.status,
                          spec=RequestSpec(stream=case.streaming, expected_tokens=case.expected),
                          streaming=case.streaming)
    assert (rec["reason"], rec["completion_tokens"], rec["visible_chars"], rec["events"], rec["bytes"]) == \
        (case.reason, case.completion_tokens, whole.visible_chars, whole.events, len(body))


async def test_every_two_way_split_of_a_stream(upstream, proxy_factory, tmp_path: Path) -> None:
    """Every cut of one stream into two reads, the upstream's body chunked and not in turn."""
    case = CASES[0]
    up, server = upstream
    client = await proxy_factory(server.port)
    cuts = range(1, len(case.body))
    for cut in cuts:
        step = LockStep([case.body[:cut], case.body[cut:]], length=cut % 2 == 1)
        up.handler = step.handler
        assert await step.fetch(client, _request(case)) == case.body, cut
    records = read_records(tmp_path)
    assert len(records) == len(cuts)
    assert {(r["reason"], r["completion_tokens"], r["bytes"]) for r in records} == \
        {(case.reason, case.completion_tokens, len(case.body))}


async def test_through_the_proxy_one_byte_per_write(upstream, proxy_factory, tmp_path: Path) -> None:
    """One upstream write per byte as fast as it goes (reads split wherever the kernel splits them)."""
    up, server = upstream

    async def bytewise(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(len(OK_BODY)):
            await resp.write(OK_BODY[i:i + 1])
        await resp.write_eof()
        return resp

    up.handler = bytewise
    client = await proxy_factory(server.port)
    resp = await client.post("/vllm/v1/completions", json={**STREAM_REQ, "max_tokens": 2, "ignore_eos": True})
    assert hashlib.sha256(await resp.read()).digest() == hashlib.sha256(OK_BODY).digest()
    rec, = read_records(tmp_path)
    assert rec["outcome"] == "success" and rec["bytes"] == len(OK_BODY)


class Flood:
    """An upstream that writes ``events`` as fast as the proxy takes them, counting its bytes."""

    def __init__(self, events: list[bytes]) -> None:
        self.events = events
        self.body = b"".join(events)
        self.written = 0
        self.done = False
        self.transport: asyncio.Transport | None = None

    async def handler(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        self.transport = request.transport
        sock = request.transport.get_extra_info("socket") if request.transport is not None else None
        if sock is not None:  # a small kernel buffer on this side: the proxy's pause shows sooner
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 256 << 10)
        for event in self.events:
            await resp.write(event)
            self.written += len(event)
        await resp.write_eof()
        self.done = True
        return resp

    def blocked(self) -> bool:
        """The upstream's own write buffer is over its high-water mark: its socket is full."""
        t = self.transport
        return t is not None and t.get_write_buffer_size() > t.get_write_buffer_limits()[1]

    async def until_stuck(self, polls: int = 50) -> None:
        """Until the body is written, or the upstream has been blocked without writing a byte
        for ``polls`` turns of the loop that also runs the proxy (a proxy that reads on lets it
        write on within a turn or two; the kernel's own timers, within tens of milliseconds)."""
        still, last = 0, -1
        while not self.done and still < polls:
            await asyncio.sleep(0.01)
            if self.written == last and self.blocked():
                still += 1
            else:
                still, last = 0, self.written


async def _slow_client(host: str, port: int, req: dict[str, Any]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client socket with a small receive buffer that sends ``req`` and reads nothing yet."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)  # no autotuning: it stays small
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
    body = json.dumps(req).encode()
    writer.write(b"POST /vllm/v1/completions HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
    return reader, writer


def _dechunk(data: bytes) -> bytes:
    out, pos = bytearray(), 0
    while True:
        end = data.index(b"\r\n", pos)
        size = int(data[pos:end], 16)
        if size == 0:
            return bytes(out)
        out += data[end + 2:end + 2 + size]
        assert data[end + 2 + size:end + 4 + size] == b"\r\n"
        pos = end + 4 + size


def _flood() -> Flood:
    """24 MiB of events: several times what the socket buffers on the way hold."""
    event = b"data: %b\n\n" % json.dumps({"choices": [{"index": 0, "text": "x" * 16_000}]}).encode()
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1536}}\n\n'
    return Flood([event] * 1536 + [usage, b"data: [DONE]\n\n"])


async def _read_late(client: Any, flood: Flood) -> None:
    """One request from a client that reads nothing until the upstream is stuck, then all."""
    reader, writer = await _slow_client(client.host, client.port, STREAM_REQ)
    async with asyncio.timeout(30):  # only against a hang
        await flood.until_stuck()
    assert not flood.done and flood.written < len(flood.body) // 2
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)  # now read fast
    async with asyncio.timeout(60):
        answer = await reader.read()  # to the end: Connection: close
    writer.close()
    head, _, chunked = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and flood.done
    assert hashlib.sha256(_dechunk(chunked)).digest() == hashlib.sha256(flood.body).digest()


async def test_a_client_that_stops_reading_pauses_the_upstream(upstream, proxy_factory, tmp_path: Path) -> None:
    """While the client reads nothing, the proxy stops reading the upstream: the upstream's
    socket fills and its writes stop, far short of the body.  Once the client reads, the
    upstream resumes and the client gets every byte; the record counts the back-pressure."""
    up, server = upstream
    flood = _flood()
    up.handler = flood.handler
    client = await proxy_factory(server.port)
    await _read_late(client, flood)
    rec, = await wait_for_records(tmp_path, 1)
    assert (rec["outcome"], rec["bytes"]) == ("success", len(flood.body))
    assert rec["client_backpressure_s"] > 0


async def test_back_pressure_is_counted_on_a_pooled_upstream_connection(upstream, proxy_factory,
                                                                       tmp_path: Path) -> None:
    """The second slow client's request reuses the upstream connection: its answer goes
    through the relay too, and its back-pressure is counted."""
    up, server = upstream
    client = await proxy_factory(server.port)
    for _ in range(2):
        flood = _flood()
        up.handler = flood.handler
        await _read_late(client, flood)
    records = await wait_for_records(tmp_path, 2)
    assert [r["outcome"] for r in records] == ["success", "success"]
    assert all(r["client_backpressure_s"] > 0 for r in records), [r["client_backpressure_s"] for r in records]


async def test_a_client_that_leaves_ends_the_relay(upstream, proxy_factory, tmp_path: Path) -> None:
    """The client reads the first event and hangs up: the request is the client's abort, and
    nothing is analysed that the client was not sent (the upstream's next event is written
    only once the record is)."""
    up, server = upstream
    first = f"data: {OK_EVENTS[0]}\n\n".encode()
    late = asyncio.Event()

    async def two_parts(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(first)
        await late.wait()
        try:
            for e in OK_EVENTS[1:]:
                await resp.write(f"data: {e}\n\n".encode())
        except ConnectionError:
            pass  # the proxy closed this connection when the client left
        return resp

    up.handler = two_parts
    client = await proxy_factory(server.port)
    try:
        resp = await client.post("/vllm/v1/completions", json=STREAM_REQ)
        got = b""
        while len(got) < len(first):
            got += await resp.content.readany()
        resp.close()
        rec, = await wait_for_records(tmp_path, 1, timeout_s=30)
    finally:
        late.set()
    assert got == first
    assert (rec["outcome"], rec["reason"], rec["bytes"], rec["done"]) == ("client_abort", "client_abort",
                                                                           len(first), False)


async def test_no_read_within_idle_s_is_a_timeout(upstream, proxy_factory, tmp_path: Path) -> None:
    """The upstream sends one event and then nothing: the relay's idle deadline ends it (the
    first-byte deadline: ``test_proxy.py::test_slow_first_byte_after_headers``)."""
    up, server = upstream
    release = asyncio.Event()

    async def stalls(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(f"data: {OK_EVENTS[0]}\n\n".encode())
        await release.wait()
        return resp

    up.handler = stalls
    client = await proxy_factory(server.port, timeouts={"idle_s": 0.2})
    try:
        async with asyncio.timeout(20):  # only against a hang (a deadline that never fires)
            resp = await client.post("/vllm/v1/completions", json=STREAM_REQ)
            with pytest.raises(aiohttp.ClientPayloadError):  # the client's stream is cut, not completed
                await resp.read()
    finally:
        release.set()
    rec, = read_records(tmp_path)
    assert rec["reason"] == "timeout" and "idle_s=0.2" in rec["detail"]
    assert rec["bytes"] == len(f"data: {OK_EVENTS[0]}\n\n")
