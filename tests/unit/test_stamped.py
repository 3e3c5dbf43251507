"""The upstream socket's reads: every byte, in order, each read stamped, whatever their size and
however many loops read at once (the read buffer is one per thread)."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

from exporter.proxy.wire.stamped import READ_SIZE, StampedSocket


async def _read_all(sock: socket.socket) -> tuple[bytes, list[int], list[float]]:
    """Everything ``sock`` receives until its peer closes: the bytes, each read's size and stamp."""
    loop = asyncio.get_running_loop()
    got: list[bytes] = []
    stamps: list[float] = []
    done: asyncio.Future[BaseException | None] = loop.create_future()

    def received(data: bytes, stamp: float) -> None:
        got.append(data)
        stamps.append(stamp)

    StampedSocket(sock, loop, received, lambda exc: done.set_result(exc))
    assert await done is None  # EOF, not an error
    return b"".join(got), [len(g) for g in got], stamps


def _pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        ours = socket.create_connection(server.getsockname())
        theirs, _ = server.accept()
    ours.setblocking(False)
    return ours, theirs


def _send_and_close(sock: socket.socket, data: bytes) -> None:
    sock.sendall(data)
    sock.close()


async def test_a_large_answer_comes_whole_in_reads_of_at_most_the_read_size() -> None:
    ours, theirs = _pair()
    data = os.urandom(3 * READ_SIZE + 12345)
    sender = threading.Thread(target=_send_and_close, args=(theirs, data))
    before = time.time()
    sender.start()
    got, sizes, stamps = await _read_all(ours)
    sender.join()
    assert got == data
    assert max(sizes) <= READ_SIZE and len(sizes) >= 4
    assert all(before - 1 <= s <= time.time() + 1 for s in stamps)  # unix seconds, kernel or loop


def test_two_loops_reading_at_once_keep_their_own_bytes() -> None:
    results: dict[int, bytes] = {}
    sent: dict[int, bytes] = {}
    barrier = threading.Barrier(2)

    def reader(n: int) -> None:
        ours, theirs = _pair()
        sent[n] = data = bytes([n + 1]) * (2 * READ_SIZE) + os.urandom(5000)
        barrier.wait()  # both loops read while the other does
        sender = threading.Thread(target=_send_and_close, args=(theirs, data))
        sender.start()
        results[n] = asyncio.run(_read_all(ours))[0]
        sender.join()

    threads = [threading.Thread(target=reader, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert set(results) == {0, 1}
    assert results[0] == sent[0] and results[1] == sent[1]
