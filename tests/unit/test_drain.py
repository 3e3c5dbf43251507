"""A graceful stop that loses no count (:mod:`exporter.proxy.drain`): after the stop begins, ``/-/ready``
fails, new engine requests get 503 with ``Connection: close`` and are counted as refused (not as requests),
requests in flight finish, and ``/metrics`` answers until each scraper seen in the last minute has made two
complete scrapes that began once the counts were final."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from exporter.proxy.app import create_app
from exporter.proxy.drain import READS, SEEN_S, ScrapeLog, stop_gracefully
from exporter.proxy.state import STATE

from tests.helpers import OK_EVENTS, Upstream, make_config, metric_value, read_records
from tests.transcripts import sse

BODY = {"prompt": "p", "stream": True, "max_tokens": 2, "stream_options": {"include_usage": True}}


def test_each_scraper_of_the_last_minute_owes_two_reads_begun_after_the_counts_were_final() -> None:
    now = [930.0]
    log = ScrapeLog(lambda: now[0])
    log.completed("old", 930.0)  # seen 70 s before: not waited for
    now[0] = 930.0 + SEEN_S + 10
    log.completed("a", now[0] - 0.5)
    log.final()
    assert set(log.owed(now[0])) == {"a"}
    log.completed("a", now[0] - 0.1)  # began before the counts were final: it may not hold them
    now[0] += 1
    log.completed("a", now[0])
    assert log.reads == {"a": 1} and set(log.owed(now[0])) == {"a"}
    log.completed("a", now[0])
    assert log.reads == {"a": READS} and log.owed(now[0]) == {}
    log.completed("b", now[0])  # a scraper first seen during the wait is owed its two reads too
    assert set(log.owed(now[0])) == {"b"}
    assert log.owed(now[0] + SEEN_S) == {}  # gone for a minute: no longer waited for


async def test_the_wait_ends_on_the_second_scrape_or_at_its_timeout() -> None:
    log = ScrapeLog()
    log.completed("a", log.clock())
    log.final()
    assert await log.wait_read(0.0) is False  # owed, and no time left
    waiting = asyncio.create_task(log.wait_read(60.0))
    await asyncio.sleep(0)  # the waiter is parked on its event
    for _ in range(READS):
        log.completed("a", log.clock())
    assert await asyncio.wait_for(waiting, 10.0) is True
    quiet = ScrapeLog()
    quiet.final()
    assert await quiet.wait_read(60.0) is True  # no scraper seen: nothing to wait for


async def test_a_stop_refuses_new_requests_finishes_those_in_flight_and_waits_for_two_scrapes(
        aiohttp_server: Any, aiohttp_client: Any, tmp_path: Any) -> None:
    upstream, reached, gate = Upstream(), asyncio.Event(), asyncio.Event()

    async def held(request: web.Request) -> web.StreamResponse:  # the first event, then the rest once let go
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(sse(OK_EVENTS[0]))
        reached.set()
        await gate.wait()
        await resp.write(sse(*OK_EVENTS[1:]))
        await resp.write_eof()
        return resp

    upstream.handler = held
    server = await aiohttp_server(upstream.app())
    app = create_app(make_config(tmp_path, server.port))
    client = await aiohttp_client(app, server_kwargs={"handler_cancellation": True})
    state = app[STATE]
    scraper = {"User-Agent": "Prometheus/test"}
    assert (await client.get("/metrics", headers=scraper)).status == 200  # a scraper seen before the stop

    async def in_flight() -> tuple[int, bytes]:
        resp = await client.post("/vllm/v1/completions", json=BODY)
        return resp.status, await resp.read()

    first = asyncio.create_task(in_flight())
    await asyncio.wait_for(reached.wait(), 10.0)
    stopping = asyncio.create_task(stop_gracefully(state))
    await asyncio.sleep(0)  # the stop's first step: draining from now
    assert state.draining
    assert (await client.get("/-/ready")).status == 503
    refused = await client.post("/vllm/v1/completions", json=BODY)
    assert refused.status == 503 and refused.headers["Connection"] == "close"
    gate.set()
    status, body = await asyncio.wait_for(first, 10.0)
    assert status == 200 and b"[DONE]" in body  # the request in flight finished whole
    deadline = time.monotonic() + 10.0
    texts = []
    while not stopping.done():  # scrape until the stop ends: it needs two reads of the final counts
        assert time.monotonic() < deadline, "the stop never ended"
        resp = await client.get("/metrics", headers=scraper)
        texts.append(await resp.text())
    assert stopping.result() is True
    (key,) = state.scrapes.reads
    assert key.endswith("Prometheus/test") and state.scrapes.reads[key] >= READS and len(texts) >= READS
    final = texts[-1]
    assert metric_value(final, "llmbench_requests_total", engine="vllm") == 1  # the refused one is not a request
    assert metric_value(final, "llmbench_requests_total", engine="vllm", outcome="success") == 1
    assert metric_value(final, "llmbench_requests_refused_total", engine="vllm", reason="draining") == 1
    assert metric_value(final, "llmbench_requests_refused_total", engine="sglang", reason="draining") == 0
    assert [r["outcome"] for r in read_records(tmp_path)] == ["success"]  # a record per answered request only


async def test_a_read_of_some_names_is_answered_and_not_a_complete_scrape(aiohttp_client: Any, tmp_path: Any) -> None:
    """``/metrics?name[]=`` shows those names only: a stop's wait for two reads of the final counts, or
    an announcement's for its series, is not ended by it."""
    app = create_app(make_config(tmp_path, 9))
    client = await aiohttp_client(app)
    scrapes = app[STATE].scrapes
    scraper = {"User-Agent": "Prometheus/test"}
    scrapes.final()
    some = await client.get("/metrics", headers=scraper, params=[("name[]", "llmbench_arrivals_total")])
    assert some.status == 200 and "llmbench_arrivals_total" in await some.text()
    assert scrapes.reads == {} and not scrapes.answered()
    whole = await client.get("/metrics", headers=scraper)
    assert whole.status == 200 and "llmbench_arrivals_total" in await whole.text()
    assert list(scrapes.reads.values()) == [1] and scrapes.answered()
