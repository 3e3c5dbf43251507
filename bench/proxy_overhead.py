"""Proxy overhead, side by side in one run: direct to the upstream, through the proxy, and
through nginx (the reference of SPEC section 9) when it is installed.

    python bench/proxy_overhead.py [--requests 200] [--chunks 64] [--interval-ms 5]

Starts a paced SSE upstream (first event at once, then one event every ``--interval-ms``)
and ``llm-bench-exporter serve`` in front of it, then, at concurrency 1 and 32, alternates
batches sent directly and through the proxy, measuring each request's TTFT (first
non-empty text, the project's own definition) on the client.  A saturated pass-through
phase (no pacing; four rounds, the paths in a rotated order each round) gives chunks per second
both ways and the proxy's CPU time per chunk (from /proc).  Prints a table of p50/p99 TTFT, the added latency and the ratios.  Speed is
measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.core.analysis import RequestSpec, StreamAnalyzer  # noqa: E402
from exporter.core.stats import percentile  # noqa: E402
from exporter.harness.stack import Child, exporter_argv, free_port, wait_http  # noqa: E402

from bench.timing_procs import cpu_of_tree  # noqa: E402


def sse_event(i: int) -> bytes:
    doc = {"id": "cmpl-bench", "object": "text_completion", "created": 1, "model": "m",
           "choices": [{"index": 0, "text": f" tok{i}", "logprobs": None, "finish_reason": None, "stop_reason": None}]}
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


#: vLLM's per-request metrics (``--enable-per-request-metrics``), on the usage chunk when a request
#: carries ``X-Engine-Metrics`` (the engine's own clock, for bench/cost_table.py)
ENGINE_METRICS = (b',"metrics":{"time_to_first_token_ms":40.0,"generation_time_ms":120.0,"queue_time_ms":10.0,'
                  b'"mean_itl_ms":2.0,"tokens_per_second":500.0}')


def upstream_app(chunks: int, interval_s: float) -> web.Application:
    events = [sse_event(i) for i in range(chunks)]
    usage_doc = (b'data: {"id":"cmpl-bench","object":"text_completion","created":1,"model":"m","choices":[],'
                 b'"usage":{"prompt_tokens":8,"total_tokens":' + str(8 + chunks).encode() +
                 b',"completion_tokens":' + str(chunks).encode() + b"}")
    usage = usage_doc + b"}\n\ndata: [DONE]\n\n"
    usage_timed = usage_doc + ENGINE_METRICS + b"}\n\ndata: [DONE]\n\n"

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        pace = float(request.headers.get("X-Pace", interval_s))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, ev in enumerate(events):
            if i and pace:
                await asyncio.sleep(pace)
            await resp.write(ev)
        await resp.write(usage_timed if "X-Engine-Metrics" in request.headers else usage)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", handle)
    app.router.add_get("/health", lambda r: asyncio.sleep(0, web.Response(text="")))
    return app


async def one(session: aiohttp.ClientSession, url: str, pace: float | None) -> tuple[float | None, int]:
    headers = {"X-Pace": str(pace)} if pace is not None else {}
    body = b'{"prompt":"x","max_tokens":64,"stream":true,"stream_options":{"include_usage":true}}'
    t0 = time.monotonic()
    async with session.post(url, data=body, headers={"Content-Type": "application/json", **headers}) as r:
        an = StreamAnalyzer(t0, r.status, RequestSpec(stream=True), streaming=True)
        async for chunk in r.content.iter_any():
            an.feed(chunk, time.monotonic())
    res = an.finish(time.monotonic())
    return res.ttft_s, res.events


async def batch(session: aiohttp.ClientSession, url: str, n: int, conc: int, pace: float | None) -> list[tuple[float | None, int]]:
    it = iter(range(n))
    out: list[tuple[float | None, int]] = []

    async def worker() -> None:
        for _ in it:
            out.append(await one(session, url, pace))

    await asyncio.gather(*(worker() for _ in range(conc)))
    return out


async def run(args: argparse.Namespace, paths: dict[str, str], pids: dict[str, int]) -> None:
    """``paths``: name -> URL, "direct" first; ``pids``: name -> process whose CPU to count."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        for url in paths.values():
            await batch(s, url, 20, 4, None)  # warm-up every path
        print(f"{'conc':>4} {'path':<7} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'added p50 ms':>13} {'added p99 ms':>13}")
        for conc in (1, 32):
            ttft: dict[str, list[float]] = {name: [] for name in paths}
            per = max(conc, args.requests // 10)
            for _ in range(max(1, args.requests // per)):  # interleave so drift hits every path alike
                for name, url in paths.items():
                    ttft[name] += [t for t, _ in await batch(s, url, per, conc, None) if t is not None]
            d50, d99 = percentile(ttft["direct"], 50), percentile(ttft["direct"], 99)
            assert d50 is not None and d99 is not None
            for name in paths:
                p50, p99 = percentile(ttft[name], 50), percentile(ttft[name], 99)
                assert p50 is not None and p99 is not None
                added = "" if name == "direct" else f" {(p50 - d50) * 1e3:>+13.3f} {(p99 - d99) * 1e3:>+13.3f}"
                print(f"{conc:>4} {name:<7} {p50 * 1e3:>12.3f} {p99 * 1e3:>12.3f}{added}")
        # saturated pass-through: no pacing, 32 streams; the paths in a rotated order each round, so
        # that no path is always measured first
        names = list(paths)
        totals = {name: [0, 0.0, 0.0] for name in names}  # events, seconds, CPU seconds
        for r in range(SATURATED_ROUNDS):
            for name in names[r % len(names):] + names[:r % len(names)]:
                pid = pids.get(name)
                cpu0 = cpu_of_tree(pid) if pid else 0.0
                t0 = time.monotonic()
                res = await batch(s, paths[name], max(32, args.requests // SATURATED_ROUNDS), 32, 0.0)
                total = totals[name]
                total[1] += time.monotonic() - t0
                total[0] += sum(e for _, e in res)
                total[2] += cpu_of_tree(pid) - cpu0 if pid else 0.0
        rates: dict[str, tuple[float, float | None]] = {
            name: (events / elapsed, cpu / max(1, events) if pids.get(name) else None)
            for name, (events, elapsed, cpu) in totals.items()}
        print("\nsaturated pass-through, 32 streams:")
        for name, (rate, cpu) in rates.items():
            extra = "" if cpu is None else f", {cpu * 1e6:.1f} µs CPU per event"
            print(f"  {name:<7} {rate:>10,.0f} events/s (x{rate / rates['direct'][0]:.2f} of direct){extra}")
        for name in ("proxy", "before"):
            if "nginx" in rates and name in rates:
                (pr, pc), (nr, nc) = rates[name], rates["nginx"]
                assert pc is not None and nc is not None
                print(f"  {name} vs nginx: {pr / nr:.2f}x the events/s, {pc / nc:.1f}x the CPU per event")


#: the saturated phase's rounds, each path once a round in a rotated order
SATURATED_ROUNDS = 4

NGINX_CONF = """
worker_processes 1;
master_process off;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/nginx-body;
  proxy_temp_path {tmp}/nginx-proxy;
  fastcgi_temp_path {tmp}/nginx-fastcgi;
  uwsgi_temp_path {tmp}/nginx-uwsgi;
  scgi_temp_path {tmp}/nginx-scgi;
  upstream up {{ server 127.0.0.1:{up_port}; keepalive 128; }}
  server {{
    listen 127.0.0.1:{port};
    location /up/ {{
      proxy_pass http://up/;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
    }}
  }}
}}
"""


def nginx_binary() -> str | None:
    """nginx where it is installed (Debian's is in /usr/sbin, which a user's PATH may lack)."""
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--chunks", type=int, default=64)
    ap.add_argument("--interval-ms", type=float, default=5.0)
    ap.add_argument("--no-nginx", action="store_true", help="leave nginx out even when installed")
    ap.add_argument("--before", type=Path, metavar="DIR",
                    help="also run the proxy of another source tree (e.g. `git archive HEAD | tar -x -C DIR`) "
                         "as path 'before', side by side")
    ap.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_upstream:
        web.run_app(upstream_app(args.chunks, args.interval_ms / 1000), host="127.0.0.1",
                    port=args.serve_upstream, print=None, access_log=None)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # children are stopped in `finally`
    tmp = Path(tempfile.mkdtemp(prefix="llmbench-bench-"))
    up_port, proxy_port = free_port(), free_port()
    children = [Child("upstream", [sys.executable, __file__, "--serve-upstream", str(up_port), "--chunks",
                                   str(args.chunks), "--interval-ms", str(args.interval_ms)], tmp)]
    cfg = tmp / "bench.yaml"
    cfg.write_text(f"listen: 127.0.0.1:{proxy_port}\nengines:\n  - name: up\n    upstream: http://127.0.0.1:{up_port}\n"
                   f"records_dir: {tmp / 'records'}\ncapture_raw_sse: none\n")
    children.append(Child("proxy", exporter_argv("serve", "--config", str(cfg)), tmp))
    paths = {"direct": f"http://127.0.0.1:{up_port}/v1/completions",
             "proxy": f"http://127.0.0.1:{proxy_port}/up/v1/completions"}
    if args.before:
        before_port = free_port()
        cfg_before = tmp / "before.yaml"
        cfg_before.write_text(cfg.read_text().replace(f":{proxy_port}\n", f":{before_port}\n", 1)
                              .replace("/records", "/records-before"))
        code = f"import sys; sys.path.insert(0, {str(args.before.resolve())!r}); from exporter.cli import main; sys.exit(main())"
        children.append(Child("before", [sys.executable, "-c", code, "serve", "--config", str(cfg_before)], tmp))
        paths["before"] = f"http://127.0.0.1:{before_port}/up/v1/completions"
    nginx = nginx_binary()
    if nginx and not args.no_nginx:
        nginx_port = free_port()
        (tmp / "nginx.conf").write_text(NGINX_CONF.format(tmp=tmp, up_port=up_port, port=nginx_port))
        children.append(Child("nginx", [nginx, "-c", str(tmp / "nginx.conf"), "-p", str(tmp)], tmp))
        paths["nginx"] = f"http://127.0.0.1:{nginx_port}/up/v1/completions"
    try:
        wait_http(f"http://127.0.0.1:{up_port}/health", 30, children[0])
        wait_http(f"http://127.0.0.1:{proxy_port}/-/ready", 30, children[1])
        if "before" in paths:
            wait_http(paths["before"].replace("/up/v1/completions", "/-/ready"), 30, children[2])
        if "nginx" in paths:
            wait_http(paths["nginx"].replace("/v1/completions", "/health"), 30, children[-1])
        elif not args.no_nginx:
            print("nginx not found (apt-get install nginx-light): no reference proxy in this run")
        print(f"{args.chunks} events a stream, paced {args.interval_ms} ms; {args.requests} requests per cell\n")
        pids = {c.name: c.proc.pid for c in children[1:] if c.name in paths}
        asyncio.run(run(args, paths, pids))
    finally:
        for c in reversed(children):
            c.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
