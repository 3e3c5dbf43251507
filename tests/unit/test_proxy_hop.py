"""The hop (exporter/proxy/hop.py): upstream reads passed to the client transport and fed to
the analyzer in the same callback; verdicts and bytes do not depend on how reads are split."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.streams import StreamReader

from exporter.core.analysis import RequestSpec, StreamAnalyzer, analyze_bytes
from exporter.proxy.hop import HIGH_WATER, ClientGone, Splice

from tests.helpers import OK_BODY, read_records
from tests.transcripts import CASES, Case


class _Protocol:
    """What a StreamReader needs of the connection's protocol."""

    def __init__(self) -> None:
        self.paused = 0
        self.resumed = 0
        self.connected = True
        self._reading_paused = False  # aiohttp 3.12-3.13's StreamReader reads it

    def pause_reading(self) -> None:
        self.paused += 1
        self._reading_paused = True

    def resume_reading(self, resume_parser: bool = True) -> None:
        self.resumed += 1
        self._reading_paused = False


class _Transport(asyncio.Transport):
    """A client transport that keeps what it was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = bytearray()
        self.closing = False
        self.backlog = 0

    def write(self, data: Any) -> None:
        self.sent += data

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.sent += data

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return self.backlog


def _dechunk(data: bytes) -> bytes:
    out, pos = bytearray(), 0
    while pos < len(data):
        end = data.index(b"\r\n", pos)
        size = int(data[pos:end], 16)
        out += data[end + 2:end + 2 + size]
        assert data[end + 2 + size:end + 4 + size] == b"\r\n"
        pos = end + 4 + size
    return bytes(out)


async def _splice(case: Case, pieces: list[bytes], chunked: bool = True):
    loop = asyncio.get_running_loop()
    reader = StreamReader(_Protocol(), 1 << 16, loop=loop)  # type: ignore[arg-type]
    reader.feed_data(pieces[0])  # the first read came with the headers
    spec = RequestSpec(stream=case.streaming, expected_tokens=case.expected)
    analyzer = StreamAnalyzer(0.0, case.status, spec, streaming=case.streaming)
    client = _Transport()
    splice = Splice(client, chunked, analyzer.feed)
    task = asyncio.create_task(splice.run(reader, reader._protocol, None, loop.time() + 60, 60))
    await asyncio.sleep(0)
    for piece in pieces[1:]:
        reader.feed_data(piece)  # what aiohttp's HTTP parser calls, read by read
    reader.feed_eof()
    await asyncio.wait_for(task, 5)
    assert type(reader) is StreamReader  # switched back
    sent = _dechunk(bytes(client.sent)) if chunked else bytes(client.sent)
    return sent, analyzer.finish(1.0)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
async def test_reads_split_at_every_byte(case: Case) -> None:
    """One byte per read: the client gets the same bytes, the verdict is the table's."""
    body = case.body
    pieces = [body[i:i + 1] for i in range(len(body))] or [b""]
    sent, result = await _splice(case, pieces)
    assert sent == body
    whole = analyze_bytes([(0.5, body)], status=case.status,
                          spec=RequestSpec(stream=case.streaming, expected_tokens=case.expected),
                          streaming=case.streaming)
    assert (result.reason, result.completion_tokens, result.visible_chars, result.events) == \
        (case.reason, case.completion_tokens, whole.visible_chars, whole.events)


async def test_every_two_way_split_of_a_stream() -> None:
    case = CASES[0]
    for cut in range(1, len(case.body)):
        sent, result = await _splice(case, [case.body[:cut], case.body[cut:]], chunked=cut % 2 == 0)
        assert sent == case.body and result.reason == case.reason, cut


async def test_a_closed_client_ends_the_splice() -> None:
    loop = asyncio.get_running_loop()
    reader = StreamReader(_Protocol(), 1 << 16, loop=loop)  # type: ignore[arg-type]
    client = _Transport()
    reads: list[bytes] = []
    splice = Splice(client, True, lambda data, now: reads.append(data))
    task = asyncio.create_task(splice.run(reader, reader._protocol, None, loop.time() + 60, 60))
    await asyncio.sleep(0)
    reader.feed_data(b"data: 1\n\n")
    client.closing = True
    reader.feed_data(b"data: 2\n\n")
    with pytest.raises(ClientGone):
        await asyncio.wait_for(task, 5)
    assert reads == [b"data: 1\n\n"]  # nothing is analysed that the client was not sent


async def test_a_full_client_buffer_pauses_the_upstream() -> None:
    loop = asyncio.get_running_loop()
    protocol = _Protocol()
    reader = StreamReader(protocol, 1 << 16, loop=loop)  # type: ignore[arg-type]
    client = _Transport()

    class Writer:
        def send_headers(self) -> None:
            pass

        async def drain(self) -> None:
            await asyncio.sleep(0.01)
            client.backlog = 0

    splice = Splice(client, True, lambda data, now: None)
    task = asyncio.create_task(splice.run(reader, protocol, Writer(), loop.time() + 60, 60))
    await asyncio.sleep(0)
    client.backlog = HIGH_WATER + 1
    reader.feed_data(b"x" * 100)
    assert protocol.paused == 1
    await asyncio.sleep(0.05)
    assert protocol.resumed == 1 and not splice.paused
    reader.feed_eof()
    await asyncio.wait_for(task, 5)


async def test_no_read_within_first_byte_is_a_timeout() -> None:
    loop = asyncio.get_running_loop()
    reader = StreamReader(_Protocol(), 1 << 16, loop=loop)  # type: ignore[arg-type]
    import time

    splice = Splice(_Transport(), True, lambda data, now: None)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(splice.run(reader, None, None, time.monotonic() + 0.05, 60), 5)


async def test_through_the_proxy_one_byte_per_write(upstream, proxy_factory, tmp_path: Path) -> None:
    """The same through real sockets: one upstream write per byte."""
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
    req = {"prompt": "x", "max_tokens": 2, "ignore_eos": True, "stream": True,
           "stream_options": {"include_usage": True}}
    resp = await client.post("/vllm/v1/completions", json=req)
    assert hashlib.sha256(await resp.read()).digest() == hashlib.sha256(OK_BODY).digest()
    rec, = read_records(tmp_path)
    assert rec["outcome"] == "success" and rec["bytes"] == len(OK_BODY)
