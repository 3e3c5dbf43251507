"""One request's relay: sent upstream once, the answer passed to the client read by read.

A :class:`Relay` owns everything of one request between the proxy's two sockets, on two clocks
with one job each: the loop's (``loop.time()``) for every deadline, the stamps' (unix seconds:
the kernel's receive time for a plain upstream socket, :mod:`exporter.proxy.wire.stamped`) for
every measurement.

* ``t0`` is when the request left for the engine: the time just before the send(2) that handed
  the kernel its last byte (``t0_source`` ``loop``: taken in the callback that sends, so neither a
  connect nor a late loop before the send is in it); it goes upstream once
  (:meth:`exporter.proxy.wire.upstream.Pool.request`).
* The first visible text's hold: from its read's kernel stamp to the moment it was written to
  the client's transport (with the request's own hold before ``t0``, the exchange's
  ``proxy_added_s``: what the proxy added to the TTFT the client saw).
* Each upstream read reaches :meth:`on_data` from the upstream socket's callback, with its stamp:
  the bytes (the usage filter's output, when the proxy asked for usage the client did not) are
  written to the client's transport, chunk-framed when its response is chunked, then fed to the
  measuring core, then to the capture.  No coroutine wakes per read.
* The stream's end is the stamp of the read that completed it (E2E at the socket).
* Deadlines: the answer's head and first body read by ``first_byte_s``, then no gap over
  ``idle_s`` (the engine's, not the client's: a back-pressure episode stops that clock), all
  within ``total_s``; one loop timer, re-armed only when it fires.
* Client back-pressure is event-driven: the client's transport calls its protocol's
  ``pause_writing`` past a small high-water mark (the kernel's send buffer for a streaming client
  is capped too, :mod:`exporter.proxy.wire.clientsock`, so a slow reader's bytes wait where they are
  seen); the relay then pauses the upstream and waits for ``resume_writing`` through the writer's
  ``drain``.  The episode is the time in between.

:meth:`Relay.run` returns one frozen :class:`Outcome`: everything the exchange reads of the relay,
once.  The contracts with aiohttp's response writer that this relies on are declared in
:mod:`exporter.proxy.wire.writer`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

from exporter.core.analysis import StreamAnalyzer
from exporter.core.content import is_event_stream
from exporter.core.usage import UsageEventFilter

from .answer import Response
from .clientsock import cork, limit_unsent
from .upstream import HOP_BY_HOP, Origin, Pool
from .writer import client_writing_paused, write_body

__all__ = ["Relay", "Outcome", "Deadlines", "Keeper", "ClientGone", "ProxyFault"]


class ClientGone(Exception):
    """The client's transport closed while the response was being passed on."""


class ProxyFault(Exception):
    """Our own code failed on a read (the analyzer, the usage filter): never the engine's fault."""


AnalyzerFactory = Callable[[float, int, bool], StreamAnalyzer]  # (t0, status, streaming) -> analyzer
#: how ``t0`` is taken: the clock read just before the send(2) of the request's last byte (the
#: kernel's transmit stamp is not taken: docs/timing.md says why)
T0_SOURCE = "loop"


class Deadlines(Protocol):
    """The relay's deadlines, in seconds (config ``timeouts``)."""

    @property
    def first_byte_s(self) -> float: ...

    @property
    def idle_s(self) -> float: ...

    @property
    def total_s(self) -> float: ...


class Keeper(Protocol):
    """Where the answer's reads are kept when the config asks for raw captures."""

    def add(self, chunk: bytes, offset: float) -> None: ...


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one relay did, as the exchange reads it: once, at the request's end (or at its
    cancellation, as far as it got)."""

    t0: float  # the request left for the engine (unix seconds, the stamps' clock)
    t0_source: str  # "kernel": its last byte's transmit stamp; "loop": time.time() at the write
    end_t: float | None  # the stamp of the read that ended the stream (None: not ended)
    done_t: float | None  # the stamp of the read that completed ``data: [DONE]``
    analyzer: StreamAnalyzer | None  # None: no answer's head came
    response: web.StreamResponse | None  # the client's, once its head was prepared
    kernel_stamps: bool  # every read of the answer carried the kernel's stamp
    backpressure_s: float  # time the client left bytes untaken
    error: BaseException | None  # ClientGone, TimeoutError, the upstream's error or our ProxyFault
    first_hold_s: float | None  # the first visible text: its read's stamp to its write to the client


class Relay:
    """Sends one request upstream once and passes its answer on; see the module's docstring."""

    def __init__(self, request: web.Request, timeouts: Deadlines, stream: bool, analyzer_for: AnalyzerFactory,
                 usage_filter: UsageEventFilter | None, capture: Keeper | None, request_id: str) -> None:
        self.request = request
        self.stream = stream  # what the client asked (the content type decides where it is vague)
        self.timeouts = timeouts
        self.analyzer_for = analyzer_for
        self.filter = usage_filter
        self.capture = capture
        self.request_id = request_id
        self.t0 = time.time()  # reset when the request leaves
        self.analyzer: StreamAnalyzer | None = None
        self.response: web.StreamResponse | None = None
        self.end_t: float | None = None  # stamp of the read that ended the stream
        self.done_t: float | None = None  # stamp of the read that completed data: [DONE]
        self.kernel_stamps = False  # every read of the answer carried the kernel's stamp
        self.ended = False
        self.error: BaseException | None = None
        self.backpressure_s = 0.0
        self.first_hold_s: float | None = None
        self._reads = 0
        self._clock: Callable[[], float] = time.monotonic  # the loop's, once it runs
        self._last = 0.0  # loop time of the last read (the idle deadline's origin)
        self._total_due = self._first_due = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._writer: AbstractStreamWriter | None = None
        self._client: asyncio.Transport | None = None
        self._chunked = False
        self._upstream: Response | None = None
        self._held_since: float | None = None  # a back-pressure episode's start (unix)
        self._corked = False  # the client's socket holds partial segments (clientsock.cork)

    # -- the request's coroutine --------------------------------------------------------------

    async def run(self, pool: Pool, origin: Origin, head: bytes, body: bytes) -> Outcome:
        """Send the request, pass the answer on until it ends; its outcome, whose ``error`` says
        how it failed (ClientGone, TimeoutError, UpstreamConnectError, UpstreamClosed, or our own
        ProxyFault).  A bug of ours beyond a read's callback still raises."""
        loop = asyncio.get_running_loop()
        self._clock = loop.time
        t = self.timeouts
        start = loop.time()
        self._total_due = start + t.total_s
        self._first_due = min(start + t.first_byte_s, self._total_due)
        self.t0 = time.time()
        try:
            async with asyncio.timeout_at(self._first_due):
                upstream = await pool.request(origin, head, body)
        except (OSError, TimeoutError) as exc:  # no answer's head: connect error, closed, timed out
            self.error = exc
            return self.outcome()
        sent = upstream.sent_at
        if sent is not None:
            self.t0 = sent
        try:
            await self._pass_on(upstream, loop)
        except ClientGone as exc:
            self.error = exc
        finally:
            self.kernel_stamps = upstream.kernel_stamps
            upstream.release()
        return self.outcome()

    def outcome(self) -> Outcome:
        """What the relay did so far (the whole of it once :meth:`run` returned)."""
        return Outcome(t0=self.t0, t0_source=T0_SOURCE, end_t=self.end_t, done_t=self.done_t,
                       analyzer=self.analyzer, response=self.response, kernel_stamps=self.kernel_stamps,
                       backpressure_s=self.backpressure_s, error=self.error, first_hold_s=self.first_hold_s)

    async def _pass_on(self, upstream: Response, loop: asyncio.AbstractEventLoop) -> None:
        streaming = is_event_stream(upstream.headers.get("Content-Type"), self.stream)
        self.analyzer = self.analyzer_for(self.t0, upstream.status, streaming)
        if upstream.status != 200 or not streaming:
            self.filter = None
        try:
            await self._open_client(upstream, streaming)
            self._upstream = upstream
            for data, stamp in upstream.take_pending():  # came with the head, or while it went out
                self.on_data(data, stamp)
        finally:
            self._uncork()  # the head and what came with it leave together, now
        if upstream.exception() is not None or upstream.is_eof():
            self.end(upstream.exception(), upstream.end_stamp or time.time())
        else:
            upstream.attach(self)
            self._arm(loop)
        try:
            while not self.ended:
                if self._held_since is not None:
                    await self._until_drained(loop)
                else:
                    self._waiter = loop.create_future()
                    await self._waiter
            # An episode still open ends with the stream: the request is counted and recorded now,
            # at its end, so that a scrape after its end counts it (exact counts per window).
        finally:
            upstream.detach()
            self.ended = True
            if self._timer is not None:
                self._timer.cancel()
            self._end_episode()

    async def _open_client(self, upstream: Response, streaming: bool) -> None:
        """The client's response head: the upstream's status and end-to-end headers, chunked."""
        resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for k, v in upstream.headers.items():
            if k.lower() not in HOP_BY_HOP:
                resp.headers.add(k, v)
        # Always chunked (HTTP/1.1 clients): the client sees the end of the body only after
        # the request's record is written (a Content-Length body would end with its last byte).
        resp.headers["X-LLMBench-Request-Id"] = self.request_id
        self.response = resp
        if upstream.has_pending():  # the head waits for the reads that came with it
            self._corked = cork(self.request.transport, True)
        try:
            writer = await resp.prepare(self.request)
        except ConnectionError as exc:
            raise ClientGone() from exc
        client = self.request.transport
        if writer is None or client is None or client.is_closing():
            raise ClientGone()
        if streaming:
            limit_unsent(client)  # a slow reader's bytes wait where pause_writing sees them
        writer.send_headers()  # writer.py: the head is on the transport now
        self._writer, self._client = writer, client
        self._chunked = bool(getattr(writer, "chunked", False))

    # -- called from the upstream socket's callback -------------------------------------------

    def on_data(self, data: bytes, stamp: float) -> None:
        if self.ended:
            return
        self._reads += 1
        self._last = self._clock()
        analyzer = self.analyzer
        assert analyzer is not None and self._client is not None
        try:
            filt = self.filter
            written = time.time() if self.first_hold_s is None else 0.0  # until the first text is out
            write_body(self._client, filt.feed(data) if filt is not None else data, self._chunked)
            done = analyzer.done
            analyzer.feed(data, stamp)
            if analyzer.done and not done:
                self.done_t = stamp
            if self.first_hold_s is None and analyzer.first_t is not None:
                self.first_hold_s = max(0.0, written - analyzer.first_t)
            if self.capture is not None:
                self.capture.add(data, stamp - self.t0)
        except ConnectionError:  # the client's transport is closing
            self.end(ClientGone(), stamp)
            return
        except Exception as exc:  # a fault of ours: never the engine's
            fault = ProxyFault(f"{type(exc).__name__}: {exc}")
            fault.__cause__ = exc
            self.end(fault, stamp)
            return
        if self._held_since is None and client_writing_paused(self.request):
            self._held_since = time.time()  # the client's buffer is full: an episode starts
            if self._upstream is not None:
                self._upstream.pause_reading()
            self._wake()

    def end(self, error: BaseException | None, stamp: float) -> None:
        """The stream ended (``error`` None) or failed, at ``stamp``; the first call wins."""
        if self.ended:
            return
        self.ended = True
        self.error = error
        self.end_t = stamp
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- deadlines (loop time) ----------------------------------------------------------------

    def _due(self) -> float:
        if self._held_since is not None:  # the client holds the stream up, not the engine
            return self._total_due
        due = self._first_due if self._reads == 0 else self._last + self.timeouts.idle_s
        return min(due, self._total_due)

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = loop.call_at(self._due(), self._on_deadline, loop)

    def _on_deadline(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        if self.ended:
            return
        if loop.time() >= self._due():
            self.end(TimeoutError(), time.time())
        else:  # reads came since it was armed: the deadline moved on
            self._arm(loop)

    # -- client back-pressure -----------------------------------------------------------------

    async def _until_drained(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait for the client's ``resume_writing`` (or the stream's end), end the episode and
        resume the upstream."""
        assert self._writer is not None
        drained = asyncio.ensure_future(self._writer.drain())
        self._waiter = loop.create_future()
        try:
            await asyncio.wait((drained, self._waiter), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not drained.done():
                drained.cancel()
        if drained.done() and not drained.cancelled() and drained.exception() is not None:
            self.end(ClientGone(), time.time())
        if drained.done():
            self._end_episode()
            self._last = loop.time()
            if self._upstream is not None and not self.ended:
                self._upstream.resume_reading()

    def _end_episode(self) -> None:
        since = self._held_since
        if since is not None:
            self.backpressure_s += max(0.0, time.time() - since)
            self._held_since = None

    # -- the end of the client's response -----------------------------------------------------

    async def close_client(self, cut: bool) -> None:
        """End the client's response: cut, the way the upstream's ended, or completed (with
        what the usage filter still held)."""
        resp = self.response
        if resp is None:
            return
        if cut:
            client = self.request.transport
            if client is not None:
                client.abort()
            return
        try:
            await resp.write_eof(self.filter.flush() if self.filter is not None else b"")
        except ConnectionError:
            pass

    def _uncork(self) -> None:
        """Send what the client's socket held; a first text written while it was held left now."""
        if self._corked:
            self._corked = False
            now = time.time()
            cork(self.request.transport, False)
            first = self.analyzer.first_t if self.analyzer is not None else None
            if self.first_hold_s is not None and first is not None:
                self.first_hold_s = max(0.0, now - first)
