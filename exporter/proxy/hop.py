"""The hop: each upstream read goes to the client's transport and to the measuring core in
the callback that received it, with no coroutine wake-up per read.

The proxy's upstream client (:mod:`exporter.proxy.upstream`) parses the engine's HTTP framing
(chunked or not) with llhttp and, once the answer's headers have come and a splice is attached,
hands each body read to :meth:`Splice.on_data` from the connection's ``data_received``: stamp the
arrival time, write the bytes to the client's transport (chunk-framed when the client's response
is chunked), then feed the analyzer.  The coroutine that owns the request sleeps until the stream
ends, fails, times out, or the client's write buffer fills (then the upstream is paused until it
drains).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from .upstream import Response

__all__ = ["Splice", "ClientGone", "ProxyFault", "HIGH_WATER"]

#: client write buffer (bytes) above which the upstream is paused until the client drains
HIGH_WATER = 256 << 10
#: how often a back-pressure episode looks whether the client has caught up (seconds)
BACKPRESSURE_POLL_S = 0.005
#: bytes waiting in the client's transport above which the client is holding the stream up:
#: the transport's low-water mark, at least this (uvloop reports 16 bytes, asyncio 16 KiB)
BACKPRESSURE_MIN_BYTES = 16 << 10


class ClientGone(Exception):
    """The client's transport closed while the response was being passed on."""


class ProxyFault(Exception):
    """Our own code failed on a read (the analyzer, the usage filter): never the engine's fault."""


class Splice:
    """Passes one response's body from the upstream to the client, read by read.

    ``on_read(data, now)`` sees the upstream's bytes after they were written to the client;
    ``transform`` (optional) gives the bytes the client gets instead (usage filter)."""

    def __init__(
        self,
        client: asyncio.Transport,
        chunked: bool,
        on_read: Callable[[bytes, float], None],
        transform: Callable[[bytes], bytes] | None = None,
    ) -> None:
        self.client = client
        self.chunked = chunked
        self.on_read = on_read
        self.transform = transform
        self.last_read = 0.0
        self.reads = 0
        self.ended = False
        self.error: BaseException | None = None
        self.paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._upstream: Response | None = None  # the answer being passed on (pause/resume reading)
        self._timer: asyncio.TimerHandle | None = None
        # client back-pressure: upstream bytes waiting in the client transport's write buffer
        # above its low-water mark (the client's socket is full); one timestamp pair per episode
        try:
            low = int(client.get_write_buffer_limits()[0])
        except (AttributeError, NotImplementedError):  # pragma: no cover - a transport without limits
            low = 0
        self._low_water = max(low, BACKPRESSURE_MIN_BYTES)
        self._bp_since: float | None = None
        self._bp_seen = 0.0  # the last moment the episode's bytes were seen still waiting
        self._bp_total = 0.0
        self._bp_timer: asyncio.TimerHandle | None = None

    def backpressure_s(self, now: float) -> float:
        """Seconds so far during which the client had not taken bytes it was sent."""
        since = self._bp_since
        return self._bp_total + (now - since if since is not None else 0.0)

    def _poll_backpressure(self) -> None:
        self._bp_timer = None
        if self._bp_since is None:
            return
        if self.ended or self.client.is_closing() or self.client.get_write_buffer_size() <= self._low_water:
            self._end_backpressure(self._bp_seen)  # drained since it was last seen waiting
        else:
            self._bp_seen = time.monotonic()
            self._bp_timer = asyncio.get_running_loop().call_later(BACKPRESSURE_POLL_S, self._poll_backpressure)

    def _end_backpressure(self, now: float) -> None:
        if self._bp_since is not None:
            self._bp_total += now - self._bp_since
            self._bp_since = None
        if self._bp_timer is not None:
            self._bp_timer.cancel()
            self._bp_timer = None

    # -- called from the upstream protocol's data_received ----------------------------------

    def on_data(self, data: bytes) -> None:
        if self.ended:
            return
        now = time.monotonic()
        self.last_read = now
        self.reads += 1
        try:
            self._write(self.transform(data) if self.transform is not None else data)
            self.on_read(data, now)
        except ClientGone as exc:
            self.end(exc)
            return
        except Exception as exc:  # a fault of ours: never the engine's
            fault = ProxyFault(f"{type(exc).__name__}: {exc}")
            fault.__cause__ = exc
            self.end(fault)
            return
        waiting = self.client.get_write_buffer_size()
        if waiting > self._low_water:
            self._held_up(now, waiting)

    def _held_up(self, now: float, waiting: int) -> None:
        """The client has not taken what it was sent: a back-pressure episode starts (unless one
        runs); past the high-water mark the upstream is paused."""
        if self._bp_since is None:
            self._bp_since = self._bp_seen = now
            self._bp_timer = asyncio.get_running_loop().call_later(BACKPRESSURE_POLL_S, self._poll_backpressure)
        if waiting > HIGH_WATER and not self.paused:
            self.paused = True
            if self._upstream is not None:
                self._upstream.pause_reading()
            self._wake()

    def _write(self, out: bytes) -> None:
        if not out:
            return
        client = self.client
        if client.is_closing():
            raise ClientGone()
        if not self.chunked:
            client.write(out)
        elif len(out) < 16384:
            client.write(b"%x\r\n%b\r\n" % (len(out), out))
        else:  # large reads: no copy
            client.writelines((b"%x\r\n" % len(out), out, b"\r\n"))

    def end(self, error: BaseException | None) -> None:
        """The stream ended (``error`` None) or failed; the first call wins."""
        if self.ended:
            return
        self.ended = True
        self.error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- the request's coroutine --------------------------------------------------------------

    def _check_deadline(self, loop: asyncio.AbstractEventLoop, first_byte_at: float, idle_s: float) -> None:
        """Fail with TimeoutError when no read came by ``first_byte_at`` (monotonic) or for
        ``idle_s`` since the last one; else look again when that could next happen."""
        if self.ended:
            return
        due = first_byte_at if self.reads == 0 else self.last_read + idle_s
        left = due - time.monotonic()
        if left <= 0:
            self.end(TimeoutError())
            return
        self._timer = loop.call_later(left + 0.001, self._check_deadline, loop, first_byte_at, idle_s)

    async def run(self, upstream: Response, writer: Any, first_byte_at: float, idle_s: float) -> None:
        """Pass the body on until it ends; raise its error (ClientGone, TimeoutError, the
        upstream's UpstreamClosed, or our own fault)."""
        loop = asyncio.get_running_loop()
        self._upstream = upstream
        await self._first(upstream, writer)
        if upstream.exception() is not None:
            self.end(upstream.exception())
        elif upstream.is_eof():
            self.end(None)
        if not self.ended:
            rest = upstream.take_pending()  # came while the headers were being written
            if rest:
                self.on_data(rest)
            upstream.attach(self)
            self._check_deadline(loop, first_byte_at, idle_s)
        try:
            while not self.ended:
                if not self.paused:  # a re-pause right after a resume must not wait for a wake-up
                    self._waiter = loop.create_future()
                    await self._waiter
                if self.paused and not self.ended:
                    await self._drain(writer)
        finally:
            upstream.detach()
            self.ended = True
            if self._timer is not None:
                self._timer.cancel()
            if self._bp_since is not None:  # still waiting now, or drained since last seen waiting
                waiting = not self.client.is_closing() and self.client.get_write_buffer_size() > self._low_water
                self._end_backpressure(time.monotonic() if waiting else self._bp_seen)
        if self.error is not None:
            raise self.error

    async def _first(self, upstream: Response, writer: Any) -> None:
        """Body bytes that came with the headers go out with them, in one write (the response's
        headers are still buffered in aiohttp's writer); without any, the headers go alone."""
        pending = upstream.take_pending() if upstream.exception() is None else b""
        if not pending:
            writer.send_headers()
            return
        now = time.monotonic()
        self.last_read = now
        self.reads += 1
        try:
            out = self.transform(pending) if self.transform is not None else pending
            # headers and chunk framing: aiohttp's writer; no drain here, so that a slow
            # client's bytes wait where the splice sees them (back-pressure, pausing)
            if out:
                await writer.write(out, drain=False)
            else:
                writer.send_headers()
            self.on_read(pending, now)
        except ConnectionError as exc:
            raise ClientGone() from exc
        except Exception as exc:
            raise ProxyFault(f"{type(exc).__name__}: {exc}") from exc

    async def _drain(self, writer: Any) -> None:
        client = self.client
        while client.get_write_buffer_size() > HIGH_WATER // 4 and not client.is_closing():
            await writer.drain()  # returns at once when aiohttp has not paused the protocol
            if client.get_write_buffer_size() > HIGH_WATER // 4:
                await asyncio.sleep(0.001)
        self.paused = False
        if self._upstream is not None and not self.ended:
            self._upstream.resume_reading()
