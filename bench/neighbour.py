"""The proxy's two timing promises with a CPU-bound process on its core, against kernel stamps at
both ends:

* ``ttft_s + proxy_added_s`` (the record) against the TTFT a kernel-stamped client measures (its
  clock just before the send(2) of the request, to the kernel's receive stamp of the read that
  brought the first text);
* ``ttft_s`` against the engine's own span (the kernel's receive stamp of the read that completed
  the request on the engine's socket, to its clock just before the send(2) of the first text).

    python bench/neighbour.py [--requests 300] [--concurrency 4]

The engine and the clients are blocking sockets on threads, pinned to CPU 1; ``serve --workers 1``
is pinned to CPU 0, first alone, then beside a busy loop pinned to CPU 0 too (``nice`` 0, as the
proxy).  Each row gives p50, p99 and the largest absolute error of both comparisons and how many
requests they cover.  Speed is measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.core.stats import percentile  # noqa: E402
from exporter.harness.stack import Child, exporter_argv, free_port, wait_http  # noqa: E402

from bench.timing_procs import pin  # noqa: E402

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_NS = struct.Struct("@qq")
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
FIRST = b'data: {"choices":[{"index":0,"text":"hi","finish_reason":null}]}\n\n'
REST = [b'data: {"choices":[{"index":0,"text":" t%d","finish_reason":null}]}\n\n' % i for i in range(7)]
TAIL = (b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":8,"total_tokens":9}}\n\n'
        b"data: [DONE]\n\n")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def _stamped_read(sock: socket.socket) -> tuple[bytes, float]:
    data, anc, _, _ = sock.recvmsg(65536, socket.CMSG_SPACE(_NS.size))
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            sec, nsec = _NS.unpack_from(raw)
            return data, sec + nsec * 1e-9
    return data, time.time()


class Engine:
    """Answers each POST after ``prefill_s``: the head and the first text in one send, then 7 more
    texts ``gap_s`` apart; keeps the engine's span per ``X-Request-Id``."""

    def __init__(self, prefill_s: float, gap_s: float) -> None:
        self.prefill_s, self.gap_s = prefill_s, gap_s
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.spans: dict[str, float] = {}
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            conn.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._conn, args=(conn,), daemon=True).start()

    def _conn(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    data, arrived = _stamped_read(conn)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = int(m.group(1)) if (m := re.search(rb"(?i)content-length: *(\d+)", head)) else 0
                while len(buf) < length:
                    data, arrived = _stamped_read(conn)
                    buf += data
                buf = buf[length:]
                if not head.startswith(b"POST"):
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
                    continue
                rid = m.group(1).decode() if (m := re.search(rb"(?i)x-request-id: *(\S+)", head)) else ""
                time.sleep(self.prefill_s)
                sent = time.time()
                conn.sendall(HEAD + _chunk(FIRST))
                self.spans[rid] = sent - arrived
                for ev in REST:
                    time.sleep(self.gap_s)
                    conn.sendall(_chunk(ev))
                conn.sendall(_chunk(TAIL) + b"0\r\n\r\n")


def _client(port: int, ids: list[str], out: dict[str, float]) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    body = b'{"prompt":"p","stream":true,"max_tokens":8}'
    with sock:
        for rid in ids:
            req = (b"POST /up/v1/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
                   b"X-Request-Id: %b\r\nContent-Length: %d\r\n\r\n%b" % (rid.encode(), len(body), body))
            sent = time.time()
            sock.sendall(req)
            data, first = b"", None
            while not data.endswith(b"0\r\n\r\n"):
                part, stamp = _stamped_read(sock)
                if not part:
                    return
                data += part
                if first is None and b'"text":"hi"' in data:
                    first = stamp
            if first is not None:
                out[rid] = first - sent


def _row(name: str, records: Path, client: dict[str, float], spans: dict[str, float]) -> str:
    recs = [json.loads(line) for line in records.read_text().splitlines()]
    by_id = {r["client_request_id"]: r for r in recs if r.get("ttft_s") is not None}
    seen = [(by_id[i], client[i], spans[i]) for i in client if i in by_id and i in spans]
    client_err = [r["ttft_s"] + (r["proxy_added_s"] or 0.0) - c for r, c, _ in seen]
    engine_err = [r["ttft_s"] - s for r, _, s in seen]
    uncertain = sum(r["timing_uncertainty_s"] for r, _, _ in seen) / max(1, len(seen))

    def stats(errors: list[float]) -> str:
        p50, p99 = percentile(errors, 50), percentile(errors, 99)
        worst = max((abs(e) for e in errors), default=None)
        return " ".join("      -" if v is None else f"{v * 1e3:7.3f}" for v in (p50, p99, worst))

    return f"{name:<22} {len(seen):>5} {stats(client_err)}   {stats(engine_err)}   {uncertain * 1e3:8.3f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--prefill-ms", type=float, default=20.0)
    ap.add_argument("--gap-ms", type=float, default=5.0)
    args = ap.parse_args()
    if (os.cpu_count() or 1) < 2:
        print("two CPUs are needed: the proxy and its neighbour on one, the engine and clients on the other")
        return 2
    pin(os.getpid(), {1})
    engine = Engine(args.prefill_ms / 1000, args.gap_ms / 1000)
    tmp = Path(tempfile.mkdtemp(prefix="llmbench-neighbour-"))
    print(f"C{args.concurrency}, {args.requests} requests a row, prefill {args.prefill_ms:g} ms, 8 texts "
          f"{args.gap_ms:g} ms apart; errors in ms (record minus ground truth)\n")
    print(f"{'row':<22} {'reqs':>5} {'client: p50':>11} {'p99':>7} {'|max|':>7}   {'engine: p50':>11} {'p99':>7} "
          f"{'|max|':>7}   {'uncert. mean':>8}")
    for neighbour in (False, True):
        port = free_port()
        records = tmp / f"records-{port}"
        cfg = tmp / f"proxy-{port}.json"
        cfg.write_text(json.dumps({"listen": f"127.0.0.1:{port}", "records_dir": str(records),
                                   "engines": [{"name": "up", "upstream": f"http://127.0.0.1:{engine.port}"}]}))
        proxy = Child("proxy", exporter_argv("serve", "--config", str(cfg), "--workers", "1"), tmp)
        hog = None
        try:
            wait_http(f"http://127.0.0.1:{port}/-/ready", 30, proxy)
            pin(proxy.proc.pid, {0}, tree=True)
            if neighbour:
                hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                pin(hog.pid, {0})
            client: dict[str, float] = {}
            ids = [f"r{neighbour:d}-{i}" for i in range(args.requests)]
            threads = [threading.Thread(target=_client, args=(port, ids[c::args.concurrency], client))
                       for c in range(args.concurrency)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            time.sleep(0.5)  # the last records
            name = "beside a busy loop" if neighbour else "alone on its core"
            print(_row(name, records / "requests.jsonl", client, engine.spans), flush=True)
        finally:
            if hog is not None:
                hog.kill()
            proxy.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
