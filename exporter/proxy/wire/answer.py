"""One answer from an engine, as the request's side sees it: status and headers, then its body,
read by read, each with the moment it arrived (:mod:`exporter.proxy.wire.upstream` fills it)."""

from __future__ import annotations

import asyncio
from typing import Protocol

from multidict import CIMultiDict

__all__ = ["Response", "Sink", "Connection"]


class Sink(Protocol):
    """Where a response's body goes once attached: each read with its stamp (unix seconds),
    then the end (``error`` None) or the failure, with the stamp of the read or moment it came."""

    def on_data(self, data: bytes, stamp: float) -> None: ...

    def end(self, error: BaseException | None, stamp: float) -> None: ...


class Connection(Protocol):
    """What an answer asks of the connection it came on."""

    def kernel_stamps(self) -> bool: ...

    def request_sent(self) -> float | None: ...

    def io_pause(self) -> None: ...

    def io_resume(self) -> None: ...

    def finished(self, resp: Response) -> None: ...


class Response:
    """One answer: its status line and headers, then its body, read by read."""

    __slots__ = ("status", "reason", "headers", "_conn", "_pending", "_sink", "_error", "_eof",
                 "until_close", "head", "end_stamp")

    def __init__(self, conn: Connection, head: asyncio.Future[None]) -> None:
        self.status = 0
        self.reason = ""
        self.headers: CIMultiDict[str] = CIMultiDict()
        self._conn = conn
        self._pending: list[tuple[bytes, float]] = []
        self._sink: Sink | None = None
        self._error: BaseException | None = None
        self._eof = False
        self.until_close = False  # neither Content-Length nor chunked: the body ends with the connection
        self.head = head
        self.end_stamp: float | None = None  # when the answer ended or failed (unix seconds)

    # -- the request's side -----------------------------------------------------------------

    @property
    def kernel_stamps(self) -> bool:
        """Every read so far was stamped by the kernel."""
        return self._conn.kernel_stamps()

    @property
    def sent_at(self) -> float | None:
        """Unix time just before the request's last byte went to the kernel (None: not yet)."""
        return self._conn.request_sent()

    def has_pending(self) -> bool:
        """Body reads arrived before a sink was attached."""
        return bool(self._pending)

    def take_pending(self) -> list[tuple[bytes, float]]:
        """Body reads that arrived before a sink was attached, with their stamps."""
        pending, self._pending = self._pending, []
        return pending

    def exception(self) -> BaseException | None:
        return self._error

    def is_eof(self) -> bool:
        return self._eof

    def attach(self, sink: Sink) -> None:
        """From now on each body read calls ``sink.on_data``; the end or a failure ``sink.end``."""
        self._sink = sink

    def detach(self) -> None:
        self._sink = None

    def pause_reading(self) -> None:
        self._conn.io_pause()

    def resume_reading(self) -> None:
        self._conn.io_resume()

    async def read(self) -> bytes:
        """The whole body (a short one: a health check, a model list); raises its error."""
        parts = [data for data, _ in self.take_pending()]
        if not (self._eof or self._error is not None):
            ended = asyncio.get_running_loop().create_future()
            self.attach(_Collect(parts, ended))
            try:
                await ended
            finally:
                self.detach()
        if self._error is not None:
            raise self._error
        return b"".join(parts)

    def release(self) -> None:
        """Done with the answer: a connection that ended it cleanly is pooled, else closed."""
        self._sink = None
        self._conn.finished(self)

    # -- the connection's side ----------------------------------------------------------------

    def data_received(self, data: bytes, stamp: float) -> None:
        """A body read, to the sink once attached; until then it waits, in order."""
        sink = self._sink
        if sink is not None:
            sink.on_data(data, stamp)
        else:
            self._pending.append((data, stamp))

    def connection_lost(self, error: BaseException | None, stamp: float) -> None:
        """The answer ended (``error`` None) or failed, at ``stamp``; the first call wins."""
        if self._eof or self._error is not None:
            return
        self.end_stamp = stamp
        if error is None:
            self._eof = True
        else:
            self._error = error
        if not self.head.done():
            if error is None:
                self.head.set_result(None)
            else:
                self.head.set_exception(error)
        sink = self._sink
        if sink is not None:
            sink.end(error, stamp)


class _Collect:
    """A sink that keeps a body's reads and says when it ended."""

    def __init__(self, parts: list[bytes], ended: asyncio.Future[None]) -> None:
        self.parts = parts
        self.ended = ended

    def on_data(self, data: bytes, stamp: float) -> None:
        self.parts.append(data)

    def end(self, error: BaseException | None, stamp: float) -> None:
        if not self.ended.done():
            self.ended.set_result(None)
