"""What the proxy added to a client's TTFT (SPEC 27): the request's hold from its arrival to ``t0``
plus the first visible text's hold from its arrival to its write to the client.  A client's TTFT
is the record's ``ttft_s + proxy_added_s``; ``ttft_s`` stays the engine's span as the sockets saw
it, whatever the proxy's loop did."""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from exporter.proxy.wire.stamped import SO_TIMESTAMPNS, kernel_stamp

from tests.helpers import metric_value, wait_for_records
from tests.unit.test_relay import STREAM, ThreadEngine, _chunk, engine_factory  # noqa: F401  (a fixture)

BODY = b'{"prompt": "p", "stream": true, "max_tokens": 2}'
#: how long the test holds the proxy's loop while the client's request waits in its receive queue
HELD_S = 0.5


class Prompt(ThreadEngine):
    """Answers at once, from its own thread."""

    def serve(self, conn: socket.socket, n: int) -> bool:
        conn.sendall(STREAM[0])
        for part in STREAM[1:]:
            conn.sendall(_chunk(part))
        conn.sendall(b"0\r\n\r\n")
        return True


class StampedClient(threading.Thread):
    """A client on its own thread: its reads stamped by the kernel, as a careful bench client's
    would be; ``ttft`` runs from its send to the kernel's stamp of the read that brought the first
    text."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS or 0, 1)
        self.sent = threading.Event()
        self.ttft: float | None = None

    def run(self) -> None:
        head = (b"POST /vllm/v1/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(BODY))
        start = time.time()
        self.sock.sendall(head + BODY)
        self.sent.set()
        got = b""
        while b'"hi"' not in got:
            data, anc, _, _ = self.sock.recvmsg(65536, socket.CMSG_SPACE(struct.calcsize("@qq")))
            if not data:
                return
            got += data
            stamp = kernel_stamp(anc)
            if b'"hi"' in got and stamp is not None:
                self.ttft = stamp - start
        while data and not got.endswith(b"0\r\n\r\n"):  # the rest of the answer, to its last chunk
            data = self.sock.recv(65536)
            got += data
        self.sock.close()


@pytest.mark.skipif(SO_TIMESTAMPNS is None, reason="the kernel's receive stamps are Linux's")
async def test_a_request_held_in_the_receive_queue_is_added_by_the_proxy_not_the_engine(
        engine_factory: Any, proxy_factory: Any, tmp_path: Path) -> None:  # noqa: F811
    """The client's request waits unseen while the proxy's loop is busy for half a second: the
    engine answers at once, so ``ttft_s`` has none of that wait and ``proxy_added_s`` all of it,
    and the two add up to the TTFT the client measured (to the kernel tick's milliseconds)."""
    engine = engine_factory(Prompt)
    proxy = await proxy_factory(engine.port)
    client = StampedClient(proxy.server.port)  # type: ignore[union-attr]
    client.start()
    assert client.sent.wait(10)
    time.sleep(HELD_S)  # the proxy's loop is this test's: the request waits in the receive queue
    (record,) = await wait_for_records(tmp_path, 1)
    client.join(10)
    assert record["outcome"] == "success" and record["t0_source"] in ("kernel", "loop")
    assert record["ttft_s"] < HELD_S / 2  # the engine's span: the wait before t0 is not in it
    assert record["proxy_added_s"] >= HELD_S - 0.01
    assert client.ttft is not None
    assert abs(client.ttft - (record["ttft_s"] + record["proxy_added_s"])) < 0.02, (client.ttft, record)
    text = await (await proxy.get("/metrics")).text()
    assert metric_value(text, "llmbench_proxy_added_seconds_count", engine="vllm", scenario="none") == 1
    assert metric_value(text, "llmbench_proxy_added_seconds_bucket", engine="vllm", scenario="none", le="0.25") == 0


async def test_a_request_that_never_reached_the_engine_has_no_proxy_added(proxy_factory: Any, tmp_path: Path) -> None:
    """No upstream (connect refused): no first text, so nothing to add to; the record says so."""
    proxy = await proxy_factory(1)
    resp = await proxy.post("/vllm/v1/completions", data=BODY)
    assert resp.status == 502
    (record,) = await wait_for_records(tmp_path, 1)
    assert record["reason"] == "connect_error" and record["proxy_added_s"] is None
