"""Helpers shared by the tests: in-process upstreams, configs, records, a live stack.

Tests import from here, never from ``conftest`` or from one another.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest
from aiohttp import web

from exporter.evidence.promapi import Prometheus
from exporter.harness.load import Cell, Driver, Plan, Stage
from exporter.harness.sim import FAULTS
from exporter.harness.stack import Child, LocalStack, scrapes_since, wait_http
from exporter.proxy.config import Config, validate
from exporter.proxy.engines import PROBE_USER_AGENT

from .transcripts import sse

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

OK_EVENTS = [
    '{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"Hel","logprobs":null,"finish_reason":null,"stop_reason":null}]}',
    '{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"lo","logprobs":null,"finish_reason":"length","stop_reason":null}]}',
    '{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":4,"total_tokens":6,"completion_tokens":2}}',
    "[DONE]",
]
OK_BODY = sse(*OK_EVENTS)


async def stream_events(request: web.Request, events: list[bytes], delay: float = 0.0,
                        headers: dict[str, str] | None = None) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **(headers or {})})
    await resp.prepare(request)
    for ev in events:
        if delay:
            await asyncio.sleep(delay)
        await resp.write(ev)
    await resp.write_eof()
    return resp


class Upstream:
    """An in-process aiohttp upstream whose behaviour each test sets."""

    def __init__(self) -> None:
        self.handler: Handler = self.ok
        self.seen: list[dict[str, Any]] = []
        self.probes: list[str] = []  # the engine watch's requests (paths), kept apart from ``seen``
        self.probe_times: list[float] = []  # when each probe came (monotonic)

    async def ok(self, request: web.Request) -> web.StreamResponse:
        return await stream_events(request, [e.encode() + b"\n\n" for e in (f"data: {x}" for x in OK_EVENTS)])

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        if PROBE_USER_AGENT in request.headers.get("User-Agent", ""):  # the proxy's engine watch: off the record
            self.probes.append(request.path_qs)
            self.probe_times.append(time.monotonic())
            return web.Response(status=200 if request.path == "/health" else 404)
        body = await request.read()
        self.seen.append({"path": request.path, "headers": dict(request.headers), "body": body})
        return await self.handler(request)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self.dispatch)
        return app


def make_config(tmp_path: Path, port: int, **extra: Any) -> Config:
    data = {
        "engines": [{"name": "vllm", "upstream": f"http://127.0.0.1:{port}"},
                    {"name": "sglang", "upstream": f"http://127.0.0.1:{port}"}],
        "scenarios": ["short-c1", "short-c32"],
        "records_dir": str(tmp_path / "run"),
        **extra,
    }
    return validate(data)


def read_records(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "run" / "requests.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


async def wait_for_records(tmp_path: Path, n: int, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """The records once there are ``n`` (an aborted request is recorded after the client left)."""
    for _ in range(int(timeout_s / 0.02)):
        records = read_records(tmp_path)
        if len(records) >= n:
            return records
        await asyncio.sleep(0.02)
    return read_records(tmp_path)


def announcements(path: Path) -> list[dict[str, Any]]:
    """The round announcements of a ``scenarios.jsonl``, in order, without the ``cell`` lines that
    ``load`` has the proxy write beside them (what each round measures)."""
    return [d for d in map(json.loads, path.read_text().splitlines()) if d.get("event") != "cell"]


def samples(text: str, name: str) -> list[Any]:
    """The samples named ``name`` in Prometheus text format, read by prometheus_client's own parser
    from that series' lines only (a page holds thousands of others; parsing them all made up a
    tenth of the fast loop)."""
    from prometheus_client.parser import text_string_to_metric_families

    lines = "\n".join(line for line in text.splitlines()
                       if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "))
    return [s for family in text_string_to_metric_families(lines) for s in family.samples if s.name == name]


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples that match ``labels`` in Prometheus text format (0 when none)."""
    return sum(s.value for s in samples(text, name) if all(s.labels.get(k) == v for k, v in labels.items()))


#: simulated fault -> the reason the proxy must give it
INTENDED = {
    None: None, "empty_text": "empty_text", "disconnect": "upstream_disconnect", "sse_error": "sse_error",
    "missing_usage": "missing_usage", "missing_done": "missing_done", "http_500": "http_status",
    "http_503": "http_status", "slow_first_byte": None,
}
assert set(INTENDED) - {None} == set(FAULTS)


def skip_or_fail(why: str | None, demand: str) -> None:
    """Skip a test that cannot run here (``why``: the reason; None when it can), or fail it where
    CI demands that it runs (``$demand`` is 1)."""
    if why:
        if os.environ.get(demand) == "1":
            pytest.fail(why)
        pytest.skip(why)


def require_prometheus() -> None:
    """Skip without prometheus/promtool, unless CI demands them (LLMBENCH_REQUIRE_PROMETHEUS=1)."""
    missing = [b for b in ("prometheus", "promtool") if shutil.which(b) is None]
    if missing:
        skip_or_fail(f"{', '.join(missing)} not installed (apt-get install -y --no-install-recommends prometheus)",
                     "LLMBENCH_REQUIRE_PROMETHEUS")


SCENARIOS = ["short-c2", "short-c8", "chat-c2"]


@dataclass
class LiveStack:
    prom: str
    proxy: str
    records: Path
    start: float
    end: float
    summaries: list[dict[str, Any]] = field(default_factory=list)
    windows: dict[str, tuple[float, float]] = field(default_factory=dict)

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        return Prometheus(self.prom).query(expr, at)

    def query_range(self, expr: str, step: float = 5.0) -> list[dict[str, Any]]:
        return Prometheus(self.prom).query_range(expr, self.start, self.end, step)


#: the engine's server of a :class:`RealStack`
Server = TypeVar("Server")


@dataclass
class RealStack(Generic[Server]):
    """A real engine's ``server`` behind the real proxy (records under ``out``), scraped by a real
    Prometheus (``prom``), since ``start`` (unix seconds): an end-to-end module's fixture."""

    server: Server
    proxy: str
    prom: str
    out: Path
    start: float

    def records(self) -> list[dict[str, Any]]:
        return read_records(self.out)

    def record(self, client_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """The proxy's record of the request sent with ``X-Request-Id: client_id``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [r for r in self.records() if r["client_request_id"] == client_id]
            if found:
                assert len(found) == 1, found
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"no record of {client_id} within {timeout_s:.0f} s")


@contextlib.contextmanager
def run_live_stack(tmp: Path) -> Iterator[LiveStack]:
    with LocalStack(tmp) as local:
        local.start(scenarios=SCENARIOS + ["warmup"], speed=1, vllm_faults=["--fault-empty-text", "0.1"],
                    gpu="sim:4", gpu_interval_s=1)
        prom = local.start_prometheus()
        proxy_url = local.proxy_url
        start = time.time()
        plan = Plan([Stage("core", [
            Cell("short-c2", input_tokens=64, output_tokens=32, requests=6, concurrency=2, rounds=1),
            # rounds of 10-14 s each: longer than two scrape intervals, so scenario_info sees them
            Cell("short-c8", input_tokens=256, output_tokens=128, requests=64, concurrency=8, rounds=2),
            # chat: its answer text gives every board's TTFO (the first answer token) data
            Cell("chat-c2", input_tokens=32, output_tokens=16, requests=4, concurrency=2, rounds=1, chat=True),
        ])])
        stack = LiveStack(prom, proxy_url, tmp / "records", start, start)
        for engine in ("sglang", "vllm"):
            t0 = time.time()

            async def drive(e: str = engine) -> dict[str, Any]:
                async with Driver(f"{proxy_url}/{e}", tmp / "load" / e, seed=3) as d:
                    return await d.run_plan(plan)

            stack.summaries.append(asyncio.run(drive()))
            stack.windows[engine] = (t0, time.time())
        # two scrapes of the proxy after the load, and the rules evaluated after them
        scrapes_since(prom, proxy_url.removeprefix("http://"), time.time(), n=2, rules=True)
        stack.end = time.time()
        yield stack


def just_after_a_scrape(prom_url: str, instance: str, timeout_s: float = 30.0) -> float:
    """Wait for a fresh scrape of ``instance`` to be stored and return its timestamp: load started
    now is clear of that scrape (a scrape's samples carry its start, while the proxy reads its
    counters later, the more so on a busy machine) and has most of an interval before the next."""
    prom = Prometheus(prom_url)
    query = f'timestamp(up{{instance="{instance}"}})'

    def last() -> float | None:
        result = prom.query(query)
        return float(result[0]["value"][1]) if result else None

    seen = last()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = last()
        if now is not None and now != seen:
            return now
        time.sleep(0.05)
    raise TimeoutError(f"no new scrape of {instance} within {timeout_s:.0f} s")


def start_prometheus_on_port_0(config: Path, data_dir: Path, log_dir: Path) -> tuple[Child, str]:
    """Debian's ``prometheus`` as ``exporter.harness.stack.start_prometheus`` runs it, but bound to
    port 0 and the port read back: no other process can take a port between its choice and the
    bind.  Its URL once ``/-/ready`` answers."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise FileNotFoundError("prometheus")
    child = Child("prometheus", [binary, f"--config.file={config}", f"--storage.tsdb.path={data_dir}",
                                 "--web.listen-address=127.0.0.1:0", "--web.enable-lifecycle",
                                 "--storage.tsdb.retention.time=7d"], log_dir)
    return child, ready_on_its_port(child, "/-/ready")


def start_victoriametrics_on_port_0(data_dir: Path, log_dir: Path, *flags: str, prefix: str = "") -> tuple[Child, str]:
    """Single-node VictoriaMetrics bound to port 0, the port read back; its URL (with the
    ``-http.pathPrefix`` ``prefix``) once ``/health`` answers."""
    child = Child("victoria-metrics", ["victoria-metrics", f"-storageDataPath={data_dir}", "-httpListenAddr=127.0.0.1:0",
                                       *([f"-http.pathPrefix={prefix}"] if prefix else []), *flags], log_dir)
    return child, ready_on_its_port(child, "/health", prefix)


def ready_on_its_port(child: Child, health: str, prefix: str = "") -> str:
    """The URL of ``child``, started on port 0, once ``health`` answers there (stopped if not)."""
    try:
        url = f"http://127.0.0.1:{listening_port(child.proc.pid)}{prefix}"
        wait_http(f"{url}{health}", 60, child)
    except BaseException:
        child.stop()
        raise
    return url


def listening_port(pid: int, timeout_s: float = 60.0) -> int:
    """The TCP port process ``pid`` listens on, once it does (Linux: its sockets in /proc): a
    child started on port 0 says here which port it bound.  One listening port is expected."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        inodes = set()
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
        ports = set()
        for table in ("tcp", "tcp6"):
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                    fields = line.split()
                    if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                        ports.add(int(fields[1].rpartition(":")[2], 16))
        if len(ports) > 1:
            raise AssertionError(f"process {pid} listens on several ports: {sorted(ports)}")
        if ports:
            return ports.pop()
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
                time.sleep(0.05)
                continue
        raise RuntimeError(f"process {pid} ended before it listened")
    raise TimeoutError(f"process {pid} listens on no port after {timeout_s:.0f} s")


class AppOnPort:
    """An aiohttp app on a fixed loopback port that can be stopped and started again (an engine
    that goes away and comes back)."""

    def __init__(self, make: Callable[[], web.Application], port: int) -> None:
        self.make, self.port = make, port
        self.runner: web.AppRunner | None = None

    async def start(self) -> AppOnPort:
        self.runner = web.AppRunner(self.make())
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


async def eventually(check: Callable[[], Awaitable[Any]], timeout_s: float = 8.0) -> Any:
    """The first truthy result of ``check()``, asked every 50 ms; AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = await check()
        if got:
            return got
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s: {check}")


def has_data(series: list[dict[str, Any]]) -> bool:
    """A range query's answer holds at least one value that is a number."""
    return any(not math.isnan(float(v)) for s in series for _, v in s["values"])


def scrape_until_exit(url: str, proc: Any, headers: dict[str, str] | None = None, timeout_s: float = 60.0) -> list[str]:
    """Scrape ``url``'s /metrics (as the scraper ``headers`` name) until the process ``proc`` exits: a
    graceful stop answers /metrics until its scrapers have read the final counts.  The complete scrapes'
    texts."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    texts = []
    while proc.poll() is None:
        assert time.monotonic() < deadline, "the process did not exit"
        try:
            with urllib.request.urlopen(urllib.request.Request(f"{url}/metrics", headers=headers or {}),
                                        timeout=10) as resp:
                texts.append(resp.read().decode())
        except OSError:  # refused as it exits (HTTPError too: an answer that is not a scrape)
            pass
    return texts
