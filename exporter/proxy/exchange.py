"""One proxied, measured request: who it is, its relay, its measurement, its record.

The :class:`exporter.proxy.wire.relay.Relay` sends the request upstream once and passes the answer
on read by read, byte for byte, feeding the measuring core (:mod:`exporter.core.analysis`) in the
callback that received each read, and returns one frozen
:class:`~exporter.proxy.wire.relay.Outcome`.  The exchange orchestrates: the request's typed
:class:`~exporter.proxy.finish.Identity`, the relay, and the :class:`Measurement` it hands over.
Every request that reaches a measured route gets exactly one record, whatever happens: a header
that cannot be parsed counts as absent, and a fault of the proxy itself is recorded as
``proxy_error``, never blamed on the engine or the client.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
import uuid

from aiohttp import web

from exporter.core.analysis import RequestSpec, Result, StreamAnalyzer
from exporter.core.endpoints import endpoint_of
from exporter.core.usage import UsageEventFilter, ask_token_ids, inject_usage

from .config import Engine
from .finish import Identity, Measurement
from .records import Capture
from .scenarios import MAX_ROUND
from .state import ProxyState
from .trace import Traced
from .wire.clientsock import received_at
from .wire.errors import transport_reason
from .wire.relay import ClientGone, Outcome, Relay
from .wire.server import take_arrival
from .wire.upstream import origin_of, request_head

__all__ = ["Exchange", "json_error"]

log = logging.getLogger("llmbench.proxy")

_SAFE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_ROUND = re.compile(r"[0-9]{1,7}")  # ASCII digits only: "²" passes str.isdigit() but not int()


def json_error(status: int, message: str, kind: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "code": status}, "object": "error"}
    return web.json_response(body, status=status)


def _safe_id(value: str | None) -> str | None:
    """A client's id header when it is a safe id (letters, digits, ``._:-``, 1-128), else None."""
    return value if value and _SAFE_ID.fullmatch(value) else None


#: a request the kernel received this much before the handler ran waited in the receive queue
#: (the kernel's figure has its tick's resolution: a few milliseconds)
QUEUED_S = 0.005


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


class Exchange:
    """One proxied request: forwards it through its relay, measures it, records it exactly once."""

    def __init__(self, state: ProxyState, request: web.Request, engine: Engine, path: str) -> None:
        # first: no relay means this is its t0 too.  The kernel's stamp of the read that brought the
        # request where the proxy reads the client's socket itself (wire.server), else the handler's
        # clock (or TCP_INFO's, where that is clearly earlier: _book)
        now = time.time()
        stamped = take_arrival(request.transport)
        if stamped is not None and stamped > now:  # not a stamp of this clock's past: not taken
            stamped = None
        self.arrived_stamped = stamped is not None
        self.arrived = now if stamped is None else stamped
        self.state = state
        self.request = request
        self.engine = engine
        self.path = path
        # the scenario is the one current at the request's arrival, whenever the rest is booked
        self._scenario = self._resolve_scenario(request.headers.get("X-Bench-Scenario"))
        self._turn = self._take_turn()  # at arrival too: turns follow the order requests came in
        self.spec = RequestSpec()
        self._unread: bytes | None = None  # the body, its spec read by _book (once the request left)
        self.relay: Relay | None = None  # while it runs: a cancelled request reads how far it got
        self.outcome: Outcome | None = None  # what the relay did, once it ran
        self.capture: Capture | None = None
        self.refused: web.HTTPException | None = None  # answered before forwarding (413)
        self.usage_injected = False
        self.trace: asyncio.Future[Traced] | None = None  # the prompt's hashes (config trace)
        self._booked = False  # _book ran: the id, the identity, the loop-lag mark, the arrival counted
        self._counted = False  # the in-flight gauge counts it (its decrement waits for this)
        self.id = ""
        self.identity: Identity
        self.lag_mark = 0.0

    async def run(self) -> web.StreamResponse:
        state = self.state
        task = asyncio.current_task()
        if task is not None:
            state.exchanges.add(task)
        # What the send upstream does not need waits until the request has left (or its end):
        # the loop runs it as soon as this task first yields, before the engine's answer is read.
        asyncio.get_running_loop().call_soon(self._book)
        try:
            try:
                error, detail = await self._guarded()
            except asyncio.CancelledError:
                if self.outcome is None and self.relay is not None:
                    self.outcome = self.relay.outcome()  # as far as it got
                error, detail = self._cancel_reason()
                self._finish(error, detail)
                raise
        finally:
            self._book()
            if self._counted:
                state.metrics.child(state.metrics.in_flight, self.engine.name).dec()
            state.exchanges.discard(task)
        result, pending = self._finish(error, detail)
        if pending is not None:  # shielded: a client that leaves now must not cost the record
            await asyncio.shield(pending)
        return await self._close_client(result)

    def _book(self) -> None:
        """The request's bookkeeping, once: its id and identity, the loop-lag probe's mark, the
        arrival and in-flight counts, and the kernel's arrival stamp where the loop was late.
        None of it is needed to send the request, so it is done after (the request's
        hold before ``t0`` is what the proxy adds)."""
        if self._booked:
            return
        unread, self._unread = self._unread, None
        if unread is not None:
            self._read_spec(unread)
        self._booked = True
        # the kernel's figure is when the client's last data came: read after the send it is the
        # same unless the client sent more since (a body still coming in while the loop ran)
        kernel = None if self.arrived_stamped else received_at(self.request.transport)
        if kernel is not None and kernel < self.arrived - QUEUED_S:
            self.arrived = kernel
        self.id = uuid.uuid4().hex
        try:
            self.identity = self._identity()
        except Exception:  # a bug of ours must not cost the record: its labels say "none"
            log.exception("request %s: labels not read", self.id)
            self.identity = Identity(id=self.id, client_request_id=None, engine=self.engine.name, scenario="none",
                                     round=None, route="/" + self.path, stream=self.spec.stream, model=None)
        if self.relay is not None:
            self.relay.request_id = self.id
        state = self.state
        self.lag_mark = state.loop_lag.mark()
        metrics = state.metrics
        metrics.child(metrics.in_flight, self.engine.name).inc()
        self._counted = True
        metrics.child(metrics.arrivals, self.engine.name, self.identity.scenario).inc()

    def _finish(self, error: str | None, detail: str | None) -> tuple[Result, asyncio.Task[None] | None]:
        """Hand the measurement over; with a capture to write, the record follows it (a task)."""
        self._book()
        m = self._measure(error, detail)
        return m.result, self.state.finisher.finish(m)

    def _measure(self, error: str | None, detail: str | None) -> Measurement:
        """The core's verdict on what came back, with this request's identity and timings."""
        now = time.time()
        out = self.outcome
        analyzer = out.analyzer if out is not None else None
        t0 = out.t0 if out is not None else self.arrived
        kept = self.capture if analyzer is not None else None
        if analyzer is None:  # no response at all: judge an empty one
            analyzer = StreamAnalyzer(t0, None, self.spec, streaming=False)
        end = self._end_of(out, error, now)
        result = analyzer.finish(end, error, detail)
        return Measurement(
            identity=self.identity, run_id=self.state.worker.run_id, result=result, start_unix=t0,
            usage_injected=self.usage_injected,
            timing_uncertainty_s=self.state.loop_lag.release(self.lag_mark),
            kernel_stamps=out is not None and out.kernel_stamps,
            client_backpressure_s=out.backpressure_s if out is not None else 0.0,
            t0_source=out.t0_source if out is not None else "loop",
            proxy_added_s=self._added(out),
            capture=kept,
            capture_meta={} if kept is None else {
                "status": result.status,
                "streaming": analyzer.streaming,
                "expected_tokens": result.expected_tokens,
                "inputs": self.spec.inputs,  # embeddings' inputs, rerank's documents (their success rule)
                "top_n": self.spec.top_n,
                "transport_error": error,
                "end_offset": round(now - t0, 6),
                "verdict": {"outcome": result.outcome, "reason": result.reason},
                "record": {k: getattr(self.identity, k) for k in ("engine", "scenario", "round", "route")},
            },
            trace=self.trace,
        )

    def _added(self, out: Outcome | None) -> float | None:
        """What the proxy added to the client's TTFT: the request's hold from its arrival to
        ``t0``, and the first visible text's from its arrival to its write to the client."""
        if out is None or out.first_hold_s is None:
            return None
        return max(0.0, out.t0 - self.arrived) + out.first_hold_s

    @staticmethod
    def _end_of(out: Outcome | None, error: str | None, now: float) -> float:
        """Where the request's E2E ends: the read that ended the stream; for a client that left
        after ``[DONE]``, the read that carried it; else now (a failure)."""
        if out is None or error is not None:
            return now
        if out.error is not None or out.end_t is None:  # the client left after [DONE] (_hangup_reason)
            return out.done_t if out.done_t is not None else now
        return out.end_t

    def _resolve_scenario(self, header: str | None) -> tuple[str, int | None]:
        try:
            found: tuple[str, int | None] = self.state.scenarios.resolve(self.engine.name, header)
        except Exception:  # a bug of ours must not cost the record: label it "none"
            log.exception("request to %s: scenario not resolved", self.engine.name)
            return "none", None
        return found

    def _identity(self) -> Identity:
        """The request's labels from its headers; anything unparseable counts as absent."""
        headers = self.request.headers
        scenario, rnd = self._scenario
        header_round = headers.get("X-Bench-Round", "").strip()
        if _ROUND.fullmatch(header_round) and int(header_round) <= MAX_ROUND:
            rnd = int(header_round)
        session, turn = self._turn
        return Identity(id=self.id, client_request_id=_safe_id(headers.get("X-Request-Id")),
                        engine=self.engine.name, scenario=scenario, round=rnd, route="/" + self.path,
                        stream=self.spec.stream, model=getattr(self.spec, "model", None), session_id=session,
                        turn=turn)

    def _take_turn(self) -> tuple[str | None, int | None]:
        """(session id, its turn) of a request that names a session, numbered as it arrives (a
        request that ends before an earlier one is booked keeps its place); else (None, None)."""
        headers = self.request.headers
        session = _safe_id(headers.get("X-Session-ID")) or _safe_id(headers.get("X-Correlation-ID"))
        if session is None:
            return None, None
        return session, self.state.sessions.turn(f"{self.engine.name} {session}", time.monotonic())  # one engine's

    async def _guarded(self) -> tuple[str | None, str | None]:
        """Read the request, relay it; return (transport reason, detail)."""
        try:
            body = await self.request.read()
            if self.state.tracer is not None:  # config trace: tokenized in its thread while the engine works
                self.trace = self.state.tracer.submit(body, self.path.endswith("chat/completions"))
            if self._booked or self._spec_before_send():
                self._inspect(body)
            else:  # the send does not need it: read once the request left, before its answer (_book)
                self._unread = body
            self.outcome = await self._relay(body)
            if self.outcome.error is not None:
                raise self.outcome.error
        except ClientGone:
            return self._hangup_reason()
        except web.HTTPRequestEntityTooLarge as exc:
            limit = self.state.config.max_request_body_bytes
            self.refused = exc
            return "proxy_error", f"request body over max_request_body_bytes={limit}: refused with 413"
        except Exception as exc:
            error = transport_reason(exc)
            if error is None:  # a bug of ours must not lose the record, nor be the engine's fault
                self._book()  # the log names the record's id
                log.exception("request %s failed inside the proxy", self.id)
                return "proxy_error", f"internal error: {type(exc).__name__}: {exc}"[:300]
            if error == "timeout":
                return error, self._timeout_detail()
            return error, f"{type(exc).__name__}: {exc}"[:300]
        return None, None

    def _spec_before_send(self) -> bool:
        """The request's body is changed before it is sent (``usage: inject``, ``token_ids``): its
        spec says how."""
        return self.engine.usage == "inject" or self.engine.token_ids

    def _read_spec(self, body: bytes) -> None:
        """The spec of a request that already left (from :meth:`_book`): its relay is told
        whether a stream was asked before the answer's head is read."""
        try:
            self._inspect(body)  # before the booking: no identity yet to correct
        except Exception:  # a bug of ours must not cost the record: it keeps the default spec
            log.exception("request to %s: the body's spec not read", self.path)
        if self.relay is not None:
            self.relay.stream = self.spec.stream

    def _inspect(self, body: bytes) -> None:
        self.spec = spec = RequestSpec.from_body(body, endpoint_of(self.path))
        if self._booked:  # the body came after a yield: the identity was made before its spec
            self.identity = dataclasses.replace(self.identity, stream=spec.stream, model=getattr(spec, "model", None))

    async def _relay(self, body: bytes) -> Outcome:
        state = self.state
        cfg = state.config
        pool = state.pool
        assert pool is not None, "proxy used before start-up"
        filt, body = self._inject(body)
        url = state.urls[(self.engine.name, self.path)]
        self.capture = capture = Capture(cfg.max_capture_bytes) if cfg.capture_raw_sse != "none" else None
        self.relay = relay = Relay(self.request, cfg.timeouts, self.spec.stream, self._analyzer, filt, capture, self.id)
        head = request_head(self.request.method, url, self.request.raw_headers, len(body))
        return await relay.run(pool, origin_of(url), head, body)

    def _inject(self, body: bytes) -> tuple[UsageEventFilter | None, bytes]:
        """``token_ids: true``: ask for the output token ids; ``usage: inject``: ask for usage
        upstream for a client that did not (the filter then keeps the usage-only event from it)."""
        if self.engine.token_ids and self.spec.endpoint in ("completions", "chat"):  # vLLM return_token_ids
            body = ask_token_ids(body) or body
        if self.engine.usage != "inject" or not self.spec.stream:
            return None, body
        changed = inject_usage(body, self.spec)
        if changed is None:
            return None, body
        self.usage_injected = True
        return UsageEventFilter(self.state.config.max_event_bytes), bytes(changed)

    def _analyzer(self, t0: float, status: int, streaming: bool) -> StreamAnalyzer:
        self._book()  # the answer's head came: its id goes out in the client's head
        cfg = self.state.config
        return StreamAnalyzer(t0, status, self.spec, streaming=streaming,
                              max_line_bytes=cfg.max_line_bytes, max_event_bytes=cfg.max_event_bytes,
                              stall_s=cfg.stall_s)

    def _hangup_reason(self) -> tuple[str | None, str | None]:
        """A client that hangs up after it was sent [DONE] has the whole
        response: the request is judged on the stream, which ended at [DONE]."""
        out = self.outcome
        if out is not None and out.analyzer is not None and out.analyzer.done:
            return None, None  # its E2E ends at the read that carried [DONE] (_end_of)
        return "client_abort", "client closed the connection"

    def _cancel_reason(self) -> tuple[str | None, str | None]:
        if self.state.stopping and not _client_gone(self.request):
            return "proxy_error", "the proxy shut down while the request was in flight"
        return self._hangup_reason()

    def _timeout_detail(self) -> str:
        t = self.state.config.timeouts
        out = self.outcome
        if out is None or out.analyzer is None or out.analyzer.nbytes == 0:
            return f"no response body within first_byte_s={t.first_byte_s}"
        return f"no data within idle_s={t.idle_s} or total_s={t.total_s}"

    async def _close_client(self, result: Result) -> web.StreamResponse:
        reason = result.reason
        if self.refused is not None:
            exc = self.refused
            return web.Response(status=exc.status, text=exc.text, content_type="text/plain")
        relay = self.relay
        resp = self.outcome.response if self.outcome is not None else None
        if relay is None or resp is None or not resp.prepared:
            if reason == "client_abort":
                return web.Response(status=499)
            if reason == "timeout":
                return json_error(504, result.detail or "upstream timed out", "upstream_timeout")
            return json_error(502, result.detail or "upstream unavailable", reason or "bad_gateway")
        # a failed upstream stream ends the client's cut, not completed
        await relay.close_client(cut=reason in ("upstream_disconnect", "timeout", "client_abort", "proxy_error"))
        return resp
