"""Where a lone request's ``proxy_added_s`` goes, step by step, on the clock of the kernel's stamps.

    python bench/request_anatomy.py [--requests 300] [--gap-ms 10]

One proxy in this process, served as ``serve``'s workers serve it (``exporter.proxy.wire.server``
on uvloop), in front of bench/proxy_overhead.py's upstream (a process of its own: 4 events, the
first with the answer's head when ``--pace-ms`` is 0, else paced).  One client thread sends its
requests one at a time, ``--gap-ms`` apart: with a gap the proxy sleeps between requests, as it does
in front of a real engine at low concurrency (its caches go cold, the machine's other processes
run); with ``--gap-ms 0`` it is kept hot.  Named steps of the request path are wrapped to take
``time.time()`` (the kernel stamps' clock) on their way in or out; the table gives each step's
median over the requests, then the two holds the record's ``proxy_added_s`` is made of:

* the request's hold: the kernel's receive stamp of its first read to the send(2) upstream (t0);
* the first text's hold: the kernel's receive stamp of the read that brought it to its write to
  the client's transport.

The wrappers add a few microseconds to each step they wrap.  Speed is measured here, never
asserted in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import http.client
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiohttp import web, web_protocol  # noqa: E402

from exporter.harness.stack import Child, free_port, wait_http  # noqa: E402
from exporter.proxy import exchange  # noqa: E402
from exporter.proxy.app import create_app  # noqa: E402
from exporter.proxy.config import validate  # noqa: E402
from exporter.proxy.wire import relay, server, upstream  # noqa: E402

BODY = b'{"prompt":"hello","max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}'
#: (from, to, what): the steps, in the order a request takes them
STEPS = [
    ("arrived", "read", "kernel's receipt -> the proxy's read of it (the loop's wake-up)"),
    ("read", "parsed", "  the read (recvmsg, its stamp) and aiohttp's parse of it"),
    ("parsed", "dispatched", "  aiohttp's request task runs"),
    ("dispatched", "handler", "  routing to the handler, the exchange made"),
    ("handler", "inspect", "  the exchange's start, the body read"),
    ("inspect", "inspected", "  the request's spec (the core's body scan)"),
    ("inspected", "relay", "  the relay and the request's head made"),
    ("relay", "send", "  the relay's start, the upstream connection taken"),
    ("send", "sent", "  the send(2) upstream"),
    ("arrived", "sent", "the request's hold (arrival -> t0)"),
    ("head_read", "head_parsed", "the answer's head: its read -> llhttp's callback"),
    ("head_parsed", "woken", "  the request's task wakes"),
    ("woken", "prepared", "  the client's response head prepared and sent"),
    ("text_read", "written", "the first text's hold (its read's stamp -> written)"),
]


class Marks:
    """One request's named times; the finished requests' marks."""

    def __init__(self) -> None:
        self.now: dict[str, float] = {}
        self.done: list[dict[str, float]] = []

    def take(self, name: str, at: float | None = None) -> None:
        self.now[name] = time.time() if at is None else at


MARKS = Marks()


def _wrap(owner: Any, name: str, before: str | None = None, after: str | None = None) -> None:
    """``owner.name`` takes mark ``before`` on the way in and ``after`` on the way out."""
    inner = getattr(owner, name)
    if asyncio.iscoroutinefunction(inner):
        @functools.wraps(inner)
        async def wrapped_async(*args: Any, **kwargs: Any) -> Any:
            if before:
                MARKS.take(before)
            out = await inner(*args, **kwargs)
            if after:
                MARKS.take(after)
            return out
        setattr(owner, name, wrapped_async)
        return

    @functools.wraps(inner)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if before:
            MARKS.take(before)
        out = inner(*args, **kwargs)
        if after:
            MARKS.take(after)
        return out
    setattr(owner, name, wrapped)


def instrument() -> None:
    conn_cls = server.ClientConnection
    on_readable = conn_cls._on_readable

    def readable(self: Any) -> None:  # a request's first read: the arrival, the read, the parse
        first = not self.began
        t = time.time()
        on_readable(self)
        if first and self.began:
            MARKS.now = {"read": t, "parsed": time.time()}
    conn_cls._on_readable = readable  # type: ignore[method-assign]

    _wrap(web_protocol.RequestHandler, "_handle_request", before="dispatched")
    init = exchange.Exchange.__init__

    def exchange_init(self: Any, *args: Any, **kwargs: Any) -> None:
        MARKS.take("handler")
        init(self, *args, **kwargs)
        MARKS.take("arrived", self.arrived if self.arrived_stamped else None)
    exchange.Exchange.__init__ = exchange_init  # type: ignore[method-assign]
    _wrap(exchange.Exchange, "_inspect", before="inspect", after="inspected")
    _wrap(relay.Relay, "run", before="relay")
    send = upstream._Connection.send

    def connection_send(self: Any, *args: Any, **kwargs: Any) -> Any:
        MARKS.take("send")
        out = send(self, *args, **kwargs)
        MARKS.take("sent", self.io.sent_at or time.time())
        return out
    upstream._Connection.send = connection_send  # type: ignore[method-assign]
    headers_complete = upstream._Connection.on_headers_complete

    def head(self: Any) -> None:
        MARKS.take("head_read", self._stamp)
        MARKS.take("head_parsed")
        headers_complete(self)
    upstream._Connection.on_headers_complete = head  # type: ignore[method-assign]
    _wrap(relay.Relay, "_pass_on", before="woken")
    _wrap(relay.Relay, "_open_client", after="prepared")
    on_data = relay.Relay.on_data

    def data(self: Any, chunk: bytes, stamp: float) -> None:
        had = self.first_hold_s is not None
        on_data(self, chunk, stamp)
        if not had and self.first_hold_s is not None:
            MARKS.take("text_read", stamp)
            MARKS.take("written")
            MARKS.done.append(dict(MARKS.now))
    relay.Relay.on_data = data  # type: ignore[method-assign]


def client(port: int, n: int, gap_s: float, pace_s: float) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    for _ in range(n):
        conn.request("POST", "/up/v1/completions", body=BODY,
                     headers={"Content-Type": "application/json", "X-Pace": str(pace_s)})
        conn.getresponse().read()
        if gap_s:
            time.sleep(gap_s)
    conn.close()


async def serve_and_drive(up_port: int, tmp: Path, args: argparse.Namespace) -> None:
    config = validate({"engines": [{"name": "up", "upstream": f"http://127.0.0.1:{up_port}"}],
                       "records_dir": str(tmp / "records")})
    runner = web.AppRunner(create_app(config), access_log=None, handler_cancellation=True)
    await runner.setup()
    sock = socket.create_server(("127.0.0.1", 0))
    srv = await server.start(runner, sock)
    loop = asyncio.get_running_loop()
    try:
        port = sock.getsockname()[1]
        await loop.run_in_executor(None, client, port, 30, args.gap_ms / 1000, args.pace_ms / 1000)  # warm
        MARKS.done.clear()
        await loop.run_in_executor(None, client, port, args.requests, args.gap_ms / 1000, args.pace_ms / 1000)
    finally:
        srv.close()
        await runner.cleanup()


def table(done: list[dict[str, float]]) -> list[tuple[str, float, int]]:
    rows = []
    for start, end, what in STEPS:
        spans = [(m[end] - m[start]) * 1e6 for m in done if start in m and end in m]
        rows.append((what, statistics.median(spans) if spans else float("nan"), len(spans)))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--gap-ms", type=float, default=10.0, help="the client's pause between requests (0: hot)")
    ap.add_argument("--pace-ms", type=float, default=0.0,
                    help="the upstream's pause between events (0: the first text comes with the head)")
    args = ap.parse_args()
    import uvloop

    instrument()
    tmp = Path(tempfile.mkdtemp(prefix="llmbench-anatomy-"))
    up = free_port()
    kid = Child("upstream", [sys.executable, str(Path(__file__).parent / "proxy_overhead.py"), "--serve-upstream",
                             str(up), "--chunks", "4", "--interval-ms", "0"], tmp)
    try:
        wait_http(f"http://127.0.0.1:{up}/health", 30, kid)
        uvloop.run(serve_and_drive(up, tmp, args))
    finally:
        kid.stop()
    print(f"{len(MARKS.done)} requests, one at a time, {args.gap_ms:g} ms apart; medians in µs\n")
    for what, median, n in table(MARKS.done):
        print(f"{what:66s} {median:8.1f}   ({n})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
