"""The proxy's own timing error against ground truth (SPEC section 10), side by side in one run.

    python bench/timing_error.py [--seconds 6] [--events 64] [--workers 1,2] [--levels 8:20,32:10,64:5,128:5] [--before DIR]

An upstream (its own process) streams SSE events at a fixed gap and stamps the wall-clock
moment it wrote each request's first text event (right after the ``write(2)``).  The proxy's
first-text stamp is ``start_unix + ttft_s`` from its record; the error is the difference.  At
each load level (concurrent streams : gap between events in ms) the run is repeated with and
without a scraper hitting ``/metrics`` every second, with 2 engines x 10 scenarios configured
(about 4,600 series), for each ``--workers`` count.  A ``direct`` row per level gives the
harness's own floor: the client's first-text stamp, straight from the upstream.

Pinning (``--pin``, default on with 2+ CPUs): with one worker the proxy's processes run on
CPU 0 and the upstream and client on CPU 1, as in issue 9's measurement; with more workers
the proxy may use every CPU (there is no free core left to pin to on two).

Reports per row: events/s, the proxy's CPU (all its processes: workers and the supervisor
that renders /metrics, in % of one core), error p50/p99/max (ms), loop-lag p99 (ms, from the
proxy's own histogram over the row), the share of requests whose ``timing_uncertainty_s``
covers their error, and the largest shortfall among those it does not cover (``miss max``), the
share stamped by the kernel, and the size of ``/metrics`` at the row's end (``page kB``,
uncompressed).  Each proxy first runs ``--settle`` seconds idle: past its start-up minute, in which
``/metrics`` shows every series (exporter/proxy/shown.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.core.stats import percentile  # noqa: E402
from exporter.harness.stack import Child, exporter_argv, free_port, wait_http  # noqa: E402

from bench.timing_procs import cpu_of_tree, lag_quantile, pin  # noqa: E402


def upstream_app(events: int) -> web.Application:
    stamps: dict[str, float] = {}

    def event(i: int) -> bytes:
        doc = {"id": "cmpl-b", "object": "text_completion", "created": 1, "model": "m",
               "choices": [{"index": 0, "text": f" t{i}", "logprobs": None, "finish_reason": None}]}
        return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"

    body = [event(i) for i in range(events)]
    tail = (b'data: {"id":"cmpl-b","object":"text_completion","created":1,"model":"m","choices":[],'
            b'"usage":{"prompt_tokens":8,"completion_tokens":%d,"total_tokens":%d}}\n\ndata: [DONE]\n\n'
            % (events, events + 8))

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        gap = float(request.headers["X-Gap"])
        rid = request.headers.get("X-Request-Id", "")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(gap)  # "prefill": the first text comes after the headers
        for i, ev in enumerate(body):
            if i:
                await asyncio.sleep(gap)
            await resp.write(ev)
            if i == 0:
                stamps[rid] = time.time()  # just after the write(2) of the first text event
        await resp.write(tail)
        await resp.write_eof()
        return resp

    async def take(request: web.Request) -> web.Response:
        out = dict(stamps)
        stamps.clear()
        return web.json_response(out)

    app = web.Application()
    app.router.add_post("/v1/completions", handle)
    app.router.add_get("/stamps", take)
    app.router.add_get("/health", lambda r: asyncio.sleep(0, web.Response(text="")))
    return app


async def _stream(session: aiohttp.ClientSession, url: str, gap: float, rid: str,
                  firsts: dict[str, float]) -> int:
    body = b'{"prompt":"x","max_tokens":64,"stream":true,"stream_options":{"include_usage":true}}'
    headers = {"Content-Type": "application/json", "X-Gap": str(gap), "X-Request-Id": rid,
               "X-Bench-Scenario": "s3"}
    n = 0
    async with session.post(url, data=body, headers=headers) as r:
        async for chunk in r.content.iter_any():
            if rid not in firsts and b'"text":" t' in chunk:
                firsts[rid] = time.time()
            n += chunk.count(b"\n\n")
    return n


async def drive(url: str, conc: int, gap: float, seconds: float, scrape: str | None) -> tuple[int, float, dict[str, float]]:
    """Closed loop of ``conc`` streams for ``seconds``; (events, elapsed, client first-text stamps)."""
    firsts: dict[str, float] = {}
    events = 0
    stop = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def worker(w: int) -> None:
            nonlocal events
            i = 0
            while time.monotonic() < stop:
                n = await _stream(s, url, gap, f"w{w}-{i}-{time.monotonic_ns()}", firsts)
                events += n  # (not `events += await ...`: that reads `events` before the await)
                i += 1

        async def scraper() -> None:
            while scrape and time.monotonic() < stop:
                async with s.get(scrape) as r:
                    await r.read()
                await asyncio.sleep(1.0)

        t0 = time.monotonic()
        await asyncio.gather(scraper(), *(worker(w) for w in range(conc)))
        return events, time.monotonic() - t0, firsts


def _config(tmp: Path, port: int, up_port: int) -> Path:
    cfg = tmp / f"proxy-{port}.yaml"
    cfg.write_text(json.dumps({
        "listen": f"127.0.0.1:{port}", "records_dir": str(tmp / f"records-{port}"), "capture_raw_sse": "none",
        "scenarios": [f"s{i}" for i in range(10)],
        "engines": [{"name": "up", "upstream": f"http://127.0.0.1:{up_port}"},
                    {"name": "other", "upstream": f"http://127.0.0.1:{up_port}"}],
    }))
    return cfg


def _records(path: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        out[rec["client_request_id"]] = rec
    return out


def _row(name: str, events: int, elapsed: float, cpu: float | None, errors: list[float],
         lag99: float | None, covered: float | None, miss: float | None = None,
         kernel: float | None = None, page: int | None = None) -> str:
    def ms(v: float | None) -> str:
        return "      -" if v is None else f"{v * 1e3:7.3f}"

    p50, p99 = percentile(errors, 50), percentile(errors, 99)
    abs99 = percentile([abs(e) for e in errors], 99)
    return (f"{name:<26} {events / elapsed:>9,.0f} {'    -' if cpu is None else f'{cpu * 100:4.0f}%'} "
            f"{ms(p50)} {ms(p99)} {ms(max(errors) if errors else None)} {ms(min(errors) if errors else None)} "
            f"{ms(abs99)} {ms(lag99)} "
            f"{'     -' if covered is None else f'{covered * 100:5.1f}%'} {ms(miss)} "
            f"{'     -' if kernel is None else f'{kernel * 100:5.1f}%'} {len(errors):>6}"
            f"{'' if page is None else f' {page / 1000:7.0f}'}")


async def _one_row(args: argparse.Namespace, up: str, proxy: str | None, pid: int | None,
                   conc: int, gap: float, scrape: bool
                   ) -> tuple[int, float, float | None, dict[str, float], float | None, int | None]:
    """(events, seconds, CPU, first-text stamps, loop-lag p99, /metrics bytes at the row's end)."""
    url = f"{proxy}/up/v1/completions" if proxy else f"{up}/v1/completions"
    before = await _get(f"{proxy}/metrics") if proxy else ""
    cpu0 = cpu_of_tree(pid) if pid else 0.0
    events, elapsed, firsts = await drive(url, conc, gap, args.seconds, f"{proxy}/metrics" if scrape and proxy else None)
    cpu = (cpu_of_tree(pid) - cpu0) / elapsed if pid else None
    after = await _get(f"{proxy}/metrics") if proxy else ""
    lag99 = lag_quantile(before, after, 0.99) if proxy else None
    return events, elapsed, cpu, firsts, lag99, len(after.encode()) if proxy else None


async def _get(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return await r.text()


async def measure(args: argparse.Namespace, up_url: str, proxy_url: str, pid: int, records: Path,
                  label: str) -> None:
    dump: list[dict[str, Any]] = []
    for conc, gap_ms in args.levels:
        gap = gap_ms / 1000
        for scrape in (False, True):
            events, elapsed, cpu, firsts, lag99, page = await _one_row(args, up_url, proxy_url, pid, conc, gap, scrape)
            await asyncio.sleep(0.5)  # the last records
            stamps = json.loads(await _get(f"{up_url}/stamps"))
            recs = _records(records)
            errors, covered, miss, kernel = [], 0, 0.0, 0
            for rid, stamp in stamps.items():
                rec = recs.get(rid)
                if rec is None or rec.get("ttft_s") is None:
                    continue
                err = rec["start_unix"] + rec["ttft_s"] - stamp
                errors.append(err)
                kernel += rec.get("stamps") == "kernel"
                covered += rec["timing_uncertainty_s"] >= err
                miss = max(miss, err - rec["timing_uncertainty_s"])
            name = f"{label} C{conc}/{gap_ms:g}ms{' scrape' if scrape else ''}"
            print(_row(name, events, elapsed, cpu, errors, lag99, covered / len(errors) if errors else None,
                       miss if errors else None, kernel / len(errors) if errors else None, page), flush=True)
            if args.json:
                dump.append({"row": name, "errors": errors, "uncertainty": [
                    recs[r]["timing_uncertainty_s"] for r in stamps if r in recs and recs[r].get("ttft_s") is not None]})
        if args.direct and label == "proxy w1":
            events, elapsed, _, firsts, _, _ = await _one_row(args, up_url, None, None, conc, gap, False)
            stamps = json.loads(await _get(f"{up_url}/stamps"))
            errors = [firsts[r] - s for r, s in stamps.items() if r in firsts]
            print(_row(f"direct C{conc}/{gap_ms:g}ms", events, elapsed, None, errors, None, None), flush=True)
            if args.json:
                dump.append({"row": f"direct C{conc}/{gap_ms:g}ms", "errors": errors})
    if args.json:
        old = json.loads(args.json.read_text()) if args.json.exists() else []
        args.json.write_text(json.dumps(old + dump))


def _serve_argv(tree: Path | None, argv: list[str]) -> list[str]:
    """``llm-bench-exporter ARGV`` from this tree, or from ``tree``."""
    if tree is None:
        return exporter_argv(*argv)
    code = f"import sys; sys.path.insert(0, {str(tree.resolve())!r}); from exporter.cli import main; sys.exit(main())"
    return [sys.executable, "-c", code, *argv]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=6.0, help="per row")
    ap.add_argument("--events", type=int, default=64, help="text events per stream")
    ap.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    ap.add_argument("--levels", default="8:20,32:10,64:5,128:5", help="CONCURRENCY:GAP_MS,...")
    ap.add_argument("--no-pin", dest="pin", action="store_false")
    ap.add_argument("--no-direct", dest="direct", action="store_false", help="leave out the harness-floor rows")
    ap.add_argument("--before", type=Path, metavar="DIR",
                    help="also run the proxy of another source tree (e.g. `git archive HEAD | tar -x -C DIR`) "
                         "as rows 'before', after each worker count's own rows")
    ap.add_argument("--json", type=Path, metavar="FILE", help="also write each row's errors (s) to FILE")
    ap.add_argument("--settle", type=float, default=65.0, metavar="S",
                    help="seconds between a proxy's start and its first row (default 65: past the start-up "
                         "minute in which /metrics shows every series)")
    ap.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_upstream:
        import uvloop

        web.run_app(upstream_app(args.events), host="127.0.0.1", port=args.serve_upstream, print=None,
                    access_log=None, loop=uvloop.new_event_loop())
        return 0
    args.levels = [(int(c), float(g)) for c, g in (x.split(":") for x in args.levels.split(","))]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cpus = os.cpu_count() or 1
    tmp = Path(tempfile.mkdtemp(prefix="llmbench-timing-"))
    up_port = free_port()
    upstream = Child("upstream", [sys.executable, __file__, "--serve-upstream", str(up_port), "--events", str(args.events)], tmp)
    children = [upstream]
    try:
        wait_http(f"http://127.0.0.1:{up_port}/health", 30, upstream)
        if args.pin and cpus >= 2:
            pin(upstream.proc.pid, {1})
            pin(os.getpid(), {1})
        print(f"{args.events} events a stream, {args.seconds:g} s a row, 2 engines x 10 scenarios configured, "
              f"pinned: {args.pin and cpus >= 2}, CPUs: {cpus}\n")
        print(f"{'row':<26} {'events/s':>9} {'CPU':>5} {'err p50':>7} {'err p99':>7} {'err max':>7} "
              f"{'err min':>7} {'|e| p99':>7} {'lag p99':>7} {'covered':>6} {'miss max':>8} {'kernel':>6} {'reqs':>6} "
              f"{'page kB':>7}")
        trees: dict[str, Path | None] = {"proxy": None, **({"before": args.before} if args.before else {})}
        for workers in (int(w) for w in args.workers.split(",")):
            for name, tree in trees.items():
                port = free_port()
                argv = ["serve", "--config", str(_config(tmp, port, up_port)), "--workers", str(workers)]
                proxy = Child(f"{name}-w{workers}", _serve_argv(tree, argv), tmp)
                children.append(proxy)
                wait_http(f"http://127.0.0.1:{port}/-/ready", 30, proxy)
                if args.pin and cpus >= 2:
                    pin(proxy.proc.pid, {0} if workers == 1 else set(range(cpus)), tree=True)
                time.sleep(args.settle)
                asyncio.run(measure(args, f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{port}",
                                    proxy.proc.pid, tmp / f"records-{port}" / "requests.jsonl", f"{name} w{workers}"))
                proxy.stop()
    finally:
        for c in reversed(children):
            c.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
