"""The proxy's cost table (SPEC 27): CPU microseconds per SSE event for each feature on the request
path, beside nginx's figure from the same run.

    python bench/cost_table.py [--requests 300] [--rounds 3] [--before DIR] [--only FEATURE ...] [--pace-ms MS]
                               [--chunks 64]

One paced-off upstream (64 events a stream, bench/proxy_overhead.py's), nginx in front of it, and
one ``serve`` per configuration, each measured in turn, ``--rounds`` times interleaved (the medians
are printed), saturated at 32 concurrent streams; CPU is every process of the proxy's (or nginx's)
tree, from /proc, divided by the SSE events the clients received, and split into user time (the
proxy's own code) and kernel time (the sockets' system calls: much the same for nginx and the
proxy, so the gap between them shows in the user column; the kernel samples the split at its clock
tick, so it is coarse where a run is short).  The configurations add one
feature at a time to the default proxy:

* ``default``: the relay, the strict analysis, the records, the metrics (what every request pays);
* ``+ engine clock``: the upstream's usage chunk carries vLLM's per-request ``metrics``;
* ``+ sessions``: each client sends ``X-Session-ID`` (turn numbers kept per session);
* ``+ usage inject``: the client asks no usage, the proxy asks upstream and filters it out;
* ``+ trace``: config ``trace`` (each prompt tokenized and block-hashed in the trace thread);
* ``+ OTLP``: config ``otlp`` to a local sink (the GenAI metrics every 10 s);
* ``+ raw captures``: ``capture_raw_sse: all`` (every stream's reads kept, hashed and written).

The default's own parts come from the same run, measured in the bench's process on the same
stream: the strict analysis per event (the core's analyzer over the 65 events), the record and the
metrics per request (a record built and written, the histograms and counters moved), both divided
by the events of a request; the plain relay is what is left of ``default``.  With ``--before DIR``
the default configuration of another source tree runs beside (``before``).  Speed is measured
here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.harness.cliutil import positive_int  # noqa: E402
from exporter.harness.stack import Child, exporter_argv, free_port, wait_http  # noqa: E402

from bench.proxy_overhead import NGINX_CONF, nginx_binary  # noqa: E402
from bench.timing_procs import cpu_split_of_tree  # noqa: E402

CHUNKS = 64
BODY = b'{"prompt":"%s","max_tokens":64,"stream":true%s}'
WITH_USAGE = b',"stream_options":{"include_usage":true}'
#: configuration name -> (extra config YAML, request headers, whether the client asks for usage)
FEATURES: dict[str, tuple[str, dict[str, str], bool]] = {
    "default": ("", {}, True),
    "+ engine clock": ("", {"X-Engine-Metrics": "1"}, True),
    "+ sessions": ("", {"X-Session-ID": "s"}, True),
    "+ usage inject": ("", {}, False),
    "+ trace": ("trace:\n  tokenizer: {tokenizer}\n  block_size: 16\n", {}, True),
    "+ OTLP": ("otlp:\n  endpoint: http://127.0.0.1:{sink}\n  interval_s: 1\n", {}, True),
    "+ raw captures": ("", {}, True),
}


async def _stream(session: aiohttp.ClientSession, url: str, headers: dict[str, str], body: bytes,
                  pace_s: float) -> int:
    async with session.post(url, data=body, headers={"Content-Type": "application/json", "X-Pace": str(pace_s),
                                                     **headers}) as r:
        data = await r.read()
    return data.count(b"data: ")


async def saturate(url: str, n: int, headers: dict[str, str], usage: bool, conc: int = 32, pace_s: float = 0.0) -> int:
    """``n`` requests at ``conc`` streams at once, ``pace_s`` between a stream's events (0: saturated,
    the reads of several events merge); the events the clients received."""
    it = iter(range(n))
    counted = [0]

    async def worker(w: int) -> None:
        mine = {k: f"{v}{w}" if k == "X-Session-ID" else v for k, v in headers.items()}
        body = BODY % ((b"word " * 40).strip(), WITH_USAGE if usage else b"")
        async with aiohttp.ClientSession() as s:
            for _ in it:
                got = await _stream(s, url, mine, body, pace_s)  # awaited first: += would read the count before
                counted[0] += got

    await asyncio.gather(*(worker(w) for w in range(conc)))
    return counted[0]


def _config(tmp: Path, name: str, port: int, up_port: int, extra: str, tree: str) -> Path:
    usage = "    usage: inject\n" if name == "+ usage inject" else ""
    capture = "all" if name == "+ raw captures" else "none"
    path = tmp / f"{tree}-{port}.yaml"
    path.write_text(f"listen: 127.0.0.1:{port}\nengines:\n  - name: up\n    upstream: http://127.0.0.1:{up_port}\n"
                    f"{usage}records_dir: {tmp / f'records-{port}'}\ncapture_raw_sse: {capture}\n{extra}")
    return path


def in_process_parts(chunks: int = CHUNKS) -> dict[str, float]:
    """µs per event of the always-on parts, measured here on the bench's stream."""
    from prometheus_client import CollectorRegistry

    from exporter.core.analysis import RequestSpec, StreamAnalyzer
    from exporter.proxy.config import validate
    from exporter.proxy.finish import Identity, Measurement
    from exporter.proxy.metrics import ProxyMetrics
    from exporter.proxy.records import JsonlWriter

    from bench.proxy_overhead import sse_event

    reads = [sse_event(i) for i in range(chunks)]
    reads.append(b'data: {"id":"cmpl-bench","object":"text_completion","created":1,"model":"m","choices":[],'
                 b'"usage":{"prompt_tokens":8,"total_tokens":72,"completion_tokens":64}}\n\ndata: [DONE]\n\n')
    spec = RequestSpec(stream=True, expected_tokens=chunks)
    n = 400
    t = time.process_time()
    for _ in range(n):
        an = StreamAnalyzer(0.0, 200, spec, streaming=True)
        for i, r in enumerate(reads):
            an.feed(r, i * 0.001)
        result = an.finish(1.0)
    analysis = (time.process_time() - t) / n / len(reads)
    with tempfile.TemporaryDirectory() as d:
        cfg = validate({"engines": [{"name": "up", "upstream": "http://127.0.0.1:1"}], "records_dir": d})
        metrics = ProxyMetrics(CollectorRegistry(), cfg)
        metrics.initialise("up", ["none"], timed=frozenset(["none"]))
        writer = JsonlWriter(Path(d) / "requests.jsonl")
        ident = Identity(id="x" * 32, client_request_id=None, engine="up", scenario="none", round=None,
                         route="/v1/completions", stream=True, model=None)
        m = Measurement(identity=ident, run_id="r", result=result, start_unix=time.time(), usage_injected=False,
                        timing_uncertainty_s=0.0, kernel_stamps=True, client_backpressure_s=0.0, capture=None,
                        capture_meta={})
        t = time.process_time()
        for _ in range(n):
            writer.write(m.record(cfg.slo))
        records = (time.process_time() - t) / n / len(reads)
        t = time.process_time()
        for _ in range(n):
            metrics.observe_request("up", "none", result, "met", 0.0, 0.0)
        observed = (time.process_time() - t) / n / len(reads)
    return {"strict analysis": analysis, "records": records, "metrics": observed}


async def _sink() -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.router.add_post("/v1/metrics", lambda r: asyncio.sleep(0, web.Response(status=200)))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


def _tokenizer(tmp: Path) -> Path:
    from bench.trace_cost import build

    build(tmp)
    return tmp / "tokenizer.json"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=positive_int, default=300, help="requests per configuration and round")
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--before", type=Path, metavar="DIR", help="another source tree's default proxy beside")
    ap.add_argument("--only", action="append", choices=list(FEATURES), metavar="FEATURE",
                    help="measure only these configurations (repeatable; default: every one)")
    ap.add_argument("--pace-ms", type=float, default=0.0,
                    help="ms between a stream's events (default 0: saturated; paced, each event is a read of its own)")
    ap.add_argument("--chunks", type=positive_int, default=CHUNKS,
                    help=f"events a stream (default {CHUNKS}); a longer stream spreads each request's own cost thinner, "
                         "so two runs apart tell the cost per request from the cost per event")
    args = ap.parse_args()
    if args.only and "default" not in args.only:
        args.only.append("default")  # every row is read beside it
    return asyncio.run(_main(args))


async def _main(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="llmbench-cost-"))
    runner, sink = await _sink()
    up_port = free_port()
    children = [Child("upstream", [sys.executable, str(Path(__file__).parent / "proxy_overhead.py"), "--serve-upstream",
                                   str(up_port), "--chunks", str(args.chunks), "--interval-ms", "0"], tmp)]
    urls: dict[str, tuple[str, Child]] = {}
    tokenizer = _tokenizer(tmp)
    try:
        wait_http(f"http://127.0.0.1:{up_port}/health", 30, children[0])
        nginx = nginx_binary()
        if nginx is not None:
            port = free_port()
            (tmp / "nginx.conf").write_text(NGINX_CONF.format(tmp=tmp, up_port=up_port, port=port))
            child = Child("nginx", [nginx, "-c", str(tmp / "nginx.conf"), "-p", str(tmp)], tmp)
            children.append(child)
            wait_http(f"http://127.0.0.1:{port}/up/health", 30, child)
            urls["nginx"] = (f"http://127.0.0.1:{port}/up/v1/completions", child)
        trees = [("proxy", None)] + ([("before", args.before)] if args.before else [])
        for tree, where in trees:
            for name, (extra, _, _) in FEATURES.items():
                if (tree == "before" and name != "default") or (args.only and name not in args.only):
                    continue
                port = free_port()
                cfg = _config(tmp, name, port, up_port, extra.format(tokenizer=tokenizer, sink=sink), tree)
                argv = exporter_argv("serve", "--config", str(cfg)) if where is None else [
                    sys.executable, "-c", f"import sys; sys.path.insert(0, {str(where.resolve())!r}); "
                    "from exporter.cli import main; sys.exit(main())", "serve", "--config", str(cfg)]
                child = Child(f"{tree} {name}", argv, tmp)
                children.append(child)
                wait_http(f"http://127.0.0.1:{port}/-/ready", 60, child)
                urls[name if tree == "proxy" else "before (default)"] = (
                    f"http://127.0.0.1:{port}/up/v1/completions", child)
        cpu: dict[str, list[tuple[float, float]]] = {name: [] for name in urls}  # (user, kernel) µs/event
        for _ in range(args.rounds):  # interleaved: a drift of the machine hits every row alike
            for name, (url, child) in urls.items():
                _, headers, usage = FEATURES.get(name.replace("before (default)", "default"), FEATURES["default"])
                await saturate(url, 20, headers, usage, pace_s=args.pace_ms / 1000)  # warm
                user0, kernel0 = cpu_split_of_tree(child.proc.pid)
                events = await saturate(url, args.requests, headers, usage, pace_s=args.pace_ms / 1000)
                user, kernel = cpu_split_of_tree(child.proc.pid)
                per = 1e6 / max(1, events)
                cpu[name].append(((user - user0) * per, (kernel - kernel0) * per))
        _print(cpu, in_process_parts(args.chunks), args.pace_ms, args.chunks)
    finally:
        for c in reversed(children):
            c.stop()
        await runner.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _print(cpu: dict[str, list[tuple[float, float]]], parts: dict[str, float], pace_ms: float, chunks: int) -> None:
    """The table: each row's median total, and the medians of its user and kernel time (the
    kernel's: the sockets' system calls, much the same for every proxy; the user's: the proxy's
    own code, where the rows differ)."""
    med = {name: statistics.median(u + k for u, k in v) for name, v in cpu.items()}
    split = {name: (statistics.median(u for u, _ in v), statistics.median(k for _, k in v)) for name, v in cpu.items()}
    nginx = med.get("nginx")
    base = med["default"]

    def row(name: str, us: float, added: str, user_kernel: tuple[float, float] | None = None) -> None:
        ratio = f"{us / nginx:5.2f}x" if nginx else "    -"
        uk = f"{user_kernel[0]:>9.2f} {user_kernel[1]:>9.2f}" if user_kernel else ""
        print(f"{name:<26} {us:>9.2f} {added:>12} {ratio:>9} {uk}".rstrip())

    paced = f"paced {pace_ms:g} ms" if pace_ms else "saturated"
    rounds = " / ".join(f"{u + k:.2f}" for u, k in cpu["default"])
    print(f"CPU µs per SSE event, {chunks} events a stream ({paced}), 32 streams, median of {len(cpu['default'])} rounds "
          f"(each round: {rounds} for default)\n")
    print(f"{'feature':<26} {'µs/event':>9} {'added':>12} {'x nginx':>9} {'user':>9} {'kernel':>9}")
    if nginx:
        row("nginx (reference)", nginx, "", split["nginx"])
    relay = base - sum(parts.values()) * 1e6
    row("plain relay (derived)", relay, "")
    for name, us in parts.items():
        row(f"  {name} (in process)", us * 1e6, f"+{us * 1e6:.2f}")
    for name, us in med.items():
        if name != "nginx":
            row(name, us, "" if name in ("default", "before (default)") else f"{us - base:+.2f}", split[name])
    if nginx:
        print(f"\nbudget (SPEC 27): at most 2x nginx, {2 * nginx:.2f} µs per event; "
              f"user and kernel are medians of their own, at the clock tick's resolution")


if __name__ == "__main__":
    sys.exit(main())
