"""A graceful stop of ``serve --workers 2`` (SPEC section 29), with real processes and a real SIGTERM.

A request is held in flight by the upstream; SIGTERM; ``/-/ready`` fails; new requests are refused with 503 and
``Connection: close``; the held request is let go and finishes whole; ``/metrics`` keeps answering until the
scraper seen before the stop has read the final counts twice; serve exits 0.  What the client saw equals what
was counted: each answered request is one count and one record, each refused one a refusal and neither.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiohttp import web

from exporter.harness.stack import Child, exporter_argv, free_port, wait_http

from tests.helpers import OK_EVENTS, metric_value, scrape_until_exit
from tests.transcripts import sse

pytestmark = pytest.mark.slow
BODY = {"prompt": "p", "stream": True, "max_tokens": 2, "stream_options": {"include_usage": True}}
SCRAPER = {"User-Agent": "Prometheus/drain-test"}


class HeldUpstream:
    """An upstream on its own thread: the first completion is held after its first event until :attr:`gate`."""

    def __init__(self, port: int) -> None:
        self.port, self.reached, self.gate = port, threading.Event(), threading.Event()
        self.loop = asyncio.new_event_loop()
        self.held = False
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self.complete)
        app.router.add_get("/{tail:.*}", self.none)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def none(self, request: web.Request) -> web.Response:  # the engine watch's probes
        return web.Response(status=404)

    async def complete(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(sse(OK_EVENTS[0]))
        if not self.held:
            self.held = True
            self.reached.set()
            await asyncio.get_running_loop().run_in_executor(None, self.gate.wait, 60)
        await resp.write(sse(*OK_EVENTS[1:]))
        await resp.write_eof()
        return resp

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def _post(url: str) -> tuple[int, str | None, bytes]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        async with s.post(f"{url}/vllm/v1/completions", json=BODY) as r:
            return r.status, r.headers.get("Connection"), await r.read()


def test_sigterm_drains_refuses_and_waits_for_the_last_scrapes(tmp_path: Path) -> None:
    ports = {name: free_port() for name in ("upstream", "proxy")}
    url = f"http://127.0.0.1:{ports['proxy']}"
    upstream = HeldUpstream(ports["upstream"])
    cfg = tmp_path / "proxy.yaml"
    cfg.write_text(yaml.safe_dump({
        "listen": f"127.0.0.1:{ports['proxy']}", "records_dir": str(tmp_path / "run"),
        "engines": [{"name": "vllm", "upstream": f"http://127.0.0.1:{ports['upstream']}"}]}))
    proxy = Child("proxy", exporter_argv("serve", "--config", str(cfg), "--workers", "2"), tmp_path)
    seen: list[tuple[int, str | None]] = []
    try:
        wait_http(f"{url}/-/ready", 30, proxy)
        assert _get(f"{url}/metrics", SCRAPER)[0] == 200  # a scraper seen before the stop

        async def scenario() -> tuple[int, str | None, bytes]:
            held = asyncio.create_task(_post(url))
            assert await asyncio.get_running_loop().run_in_executor(None, upstream.reached.wait, 30)
            proxy.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 30
            while _get(f"{url}/-/ready")[0] != 503:  # fails at once: the signal's delivery is all it waits for
                assert time.monotonic() < deadline, "/-/ready never failed"
            while len(seen) < 4:  # new requests: refused (one that reached a worker before its signal is answered)
                status, connection, _ = await _post(url)
                seen.append((status, connection))
                assert time.monotonic() < deadline, seen
            upstream.gate.set()
            return await held

        status, _, body = asyncio.run(scenario())
        assert status == 200 and b"[DONE]" in body  # the request in flight finished whole
        texts = scrape_until_exit(url, proxy.proc, SCRAPER)
        assert proxy.proc.returncode == 0 and len(texts) >= 2
    finally:
        upstream.gate.set()
        proxy.stop()
        upstream.close()
    refused = [s for s in seen if s[0] == 503]
    assert refused and all(c == "close" for _, c in refused) and all(s in (200, 503) for s, _ in seen)
    answered = 1 + sum(1 for s, _ in seen if s == 200)
    final = texts[-1]
    assert metric_value(final, "llmbench_requests_total", engine="vllm") == answered
    assert metric_value(final, "llmbench_requests_refused_total", engine="vllm", reason="draining") == len(refused)
    records = [json.loads(x) for x in (tmp_path / "run" / "requests.jsonl").read_text().splitlines()]
    assert len(records) == answered and all(r["outcome"] == "success" for r in records)
    log = proxy.log_path.read_text()
    assert "Traceback" not in log and "drained in" in log, log
