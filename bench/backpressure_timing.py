"""The relay's back-pressure, timed: how far an upstream gets while the client reads nothing,
and how soon it writes again once the client reads.

    python bench/backpressure_timing.py [--episodes 10] [--mib 24]

The upstream, the proxy (``create_app``, in-process) and a client with a 16 KiB receive buffer
share one event loop.  Each episode: the client sends a request and reads nothing until the
upstream has written nothing for 0.2 s; then it reads the answer to its end.  Printed per
episode and as medians: the MiB the upstream wrote before it stalled, the milliseconds from
the client's first read to the upstream's next completed write (the resume), and the
record's ``client_backpressure_s``.  ``tests/unit/test_relay_backpressure.py`` checks the same
behaviour by bytes, not by time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.proxy.app import create_app  # noqa: E402
from exporter.proxy.config import validate  # noqa: E402

EVENT = b"data: %b\n\n" % json.dumps({"choices": [{"index": 0, "text": "y" * 16_000}]}).encode()
TAIL = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\ndata: [DONE]\n\n'


async def _site(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, int(runner.addresses[0][1])


async def _episode(proxy_port: int, writes: list[float], count: int) -> tuple[float, float, bytes]:
    """(MiB written before the stall, ms from the first read to the next write, the answer)."""
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
    raw.setblocking(False)
    await asyncio.get_running_loop().sock_connect(raw, ("127.0.0.1", proxy_port))
    reader, writer = await asyncio.open_connection(sock=raw, limit=1 << 20)
    req = json.dumps({"prompt": "x", "stream": True, "stream_options": {"include_usage": True}}).encode()
    writer.write(b"POST /e/v1/completions HTTP/1.1\r\nHost: p\r\nConnection: close\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(req), req))
    writes.clear()
    seen = -1
    while len(writes) != seen and len(writes) < count:  # until 0.2 s without a write
        seen = len(writes)
        await asyncio.sleep(0.2)
    stalled = len(writes) * len(EVENT) / (1 << 20)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    t_read = time.monotonic()
    answer = await reader.read()
    writer.close()
    later = [t for t in writes if t > t_read]
    return stalled, (later[0] - t_read) * 1e3 if later else float("nan"), answer


async def run(episodes: int, mib: int, records: Path) -> list[tuple[float, float, float]]:
    count = mib * (1 << 20) // len(EVENT)
    writes: list[float] = []

    async def flood(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(count):
            await resp.write(EVENT)
            writes.append(time.monotonic())
        await resp.write(TAIL)
        await resp.write_eof()
        return resp

    upstream = web.Application()
    upstream.router.add_post("/v1/completions", flood)
    up_runner, up_port = await _site(upstream)
    proxy = create_app(validate({"engines": [{"name": "e", "upstream": f"http://127.0.0.1:{up_port}"}],
                                 "records_dir": str(records)}))
    px_runner, px_port = await _site(proxy)
    rows = []
    try:
        for _ in range(episodes):
            stalled, resume_ms, answer = await _episode(px_port, writes, count)
            if not answer.startswith(b"HTTP/1.1 200"):
                raise SystemExit(f"unexpected answer: {answer[:200]!r}")
            await asyncio.sleep(0.05)  # the record is written after the last byte went out
            last = (records / "requests.jsonl").read_text().splitlines()[-1]
            rows.append((stalled, resume_ms, float(json.loads(last)["client_backpressure_s"])))
    finally:
        await px_runner.cleanup()
        await up_runner.cleanup()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=10, help="slow-client requests (default 10)")
    ap.add_argument("--mib", type=int, default=24, help="MiB of each answer (default 24)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = asyncio.run(run(args.episodes, args.mib, Path(tmp)))
    print("episode  stalled MiB  resume ms  back-pressure s")
    for i, (stalled, resume_ms, bp) in enumerate(rows, 1):
        print(f"{i:7d} {stalled:12.2f} {resume_ms:10.3f} {bp:16.3f}")
    cols: list[Any] = list(zip(*rows))
    print(f"median  {statistics.median(cols[0]):12.2f} {statistics.median(cols[1]):10.3f} "
          f"{statistics.median(cols[2]):16.3f}   (answers of {args.mib} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
