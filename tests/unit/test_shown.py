"""/metrics shows a scenario's series once it is used or announced (exporter/proxy/shown.py): a
fresh proxy with 2 engines x 10 scenarios answers a quarter of the fourth wave's page or less,
the values it leaves off still count, and an announcement waits until a scraper that scrapes at
an interval has read the round's zeros."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.proxy import shown
from exporter.proxy.app import STATE, create_app
from exporter.proxy.drain import OVERDUE_S, SEEN_S, ScrapeLog
from exporter.proxy.metrics import TTFT_BUCKETS

from tests.helpers import make_config, metric_value, wait_for_records

#: SPEC 27: at most a quarter of the fourth wave's page (782 KB) at 2 engines x 10 scenarios
QUARTER = 782_000 // 4
SCENARIOS = [f"s{i}" for i in range(10)]
REQUEST = {"prompt": "x", "max_tokens": 2, "ignore_eos": True, "stream": True,
           "stream_options": {"include_usage": True}}


@pytest.fixture(autouse=True)
def past_the_first_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxies made here are past their start-up minute, where every series is shown."""
    monkeypatch.setattr(shown, "SHOW_ALL_S", 0.0)


async def _proxy(aiohttp_client: Any, tmp_path: Path, port: int) -> TestClient:
    return await aiohttp_client(create_app(make_config(tmp_path, port, scenarios=SCENARIOS)))


def _pairs(text: str, family_type: str) -> set[tuple[str, str]]:
    """(engine, scenario) of every sample of the families of ``family_type``."""
    return {(s.labels["engine"], s.labels["scenario"]) for f in text_string_to_metric_families(text)
            if f.type == family_type for s in f.samples if "scenario" in s.labels}


async def test_a_fresh_proxy_shows_scenario_none_only_and_a_quarter_of_the_page(
        aiohttp_client: Any, tmp_path: Path, upstream: Any) -> None:
    client = await _proxy(aiohttp_client, tmp_path, upstream[1].port)
    first = await (await client.get("/metrics", headers={"Accept-Encoding": "identity"})).read()
    # the first scrape answered shows every series at zero (a restart's zero sample), then no more
    assert ("vllm", "s7") in _pairs(first.decode(), "histogram")
    body = await (await client.get("/metrics", headers={"Accept-Encoding": "identity"})).read()
    assert len(body) <= QUARTER, len(body)
    shown = _pairs(body.decode(), "histogram") | _pairs(body.decode(), "counter")
    assert shown == {("vllm", "none"), ("sglang", "none")}
    # the series are made all the same, at zero: left off the page, not out of the registry
    whole = generate_latest(client.app[STATE].registry).decode()
    assert ("vllm", "s7") in _pairs(whole, "histogram")
    assert len(whole.encode()) > 4 * len(body)


async def test_a_scenario_named_by_a_header_is_shown_from_its_first_count(
        aiohttp_client: Any, tmp_path: Path, upstream: Any) -> None:
    client = await _proxy(aiohttp_client, tmp_path, upstream[1].port)
    resp = await client.post("/vllm/v1/completions", json=REQUEST, headers={"X-Bench-Scenario": "s3"})
    assert resp.status == 200
    await resp.read()
    (record,) = await wait_for_records(tmp_path, 1)
    assert record["scenario"] == "s3" and record["outcome"] == "success"
    await client.get("/metrics")  # the first scrape answered shows every series
    text = await (await client.get("/metrics")).text()
    assert metric_value(text, "llmbench_time_to_first_token_seconds_count", engine="vllm", scenario="s3") == 1
    # every family of the pair, the ones nothing was observed in too, and only that engine's
    hist = _pairs(text, "histogram")
    assert ("vllm", "s3") in hist and ("sglang", "s3") not in hist
    buckets = [s for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "llmbench_time_to_first_token_seconds_bucket" and s.labels["scenario"] == "s3"]
    assert len(buckets) == len(TTFT_BUCKETS) + 1
    assert metric_value(text, "llmbench_empty_text_responses_total", engine="vllm", scenario="s3") == 0
    assert 'llmbench_empty_text_responses_total{engine="vllm",scenario="s3"} 0.0' in text


async def test_an_announcement_waits_until_a_scraper_has_read_the_rounds_zeros(
        aiohttp_client: Any, tmp_path: Path, upstream: Any) -> None:
    client = await _proxy(aiohttp_client, tmp_path, upstream[1].port)
    scrapes = client.app[STATE].scrapes
    now = [1000.0]
    scrapes.clock = lambda: now[0]  # frozen: the scraper's next scrape never falls overdue here
    for _ in range(2):  # two scrapes: a scraper with an interval
        assert (await client.get("/metrics")).status == 200
        now[0] += 5.0
    announce = asyncio.create_task(client.post("/-/scenario", json={"scenario": "s5", "round": 1}))
    shown = client.app[STATE].shown
    for _ in range(500):  # the announcement asks for the pairs to be shown, then waits
        if {("vllm", "s5"), ("sglang", "s5")} <= shown.requested:
            break
        await asyncio.sleep(0.01)
    assert not announce.done()
    # the round is set after the wait, so that its span does not hold it
    assert (await (await client.get("/-/scenarios")).json())["active"]["vllm"] is None
    text = await (await client.get("/metrics")).text()
    assert 'llmbench_time_to_first_token_seconds_count{engine="vllm",scenario="s5"} 0.0' in text
    assert 'llmbench_time_to_first_token_seconds_count{engine="sglang",scenario="s5"} 0.0' in text
    answer = await (await announce).json()
    assert answer["scenario"] == "s5" and "warning" not in answer
    assert (await (await client.get("/-/scenarios")).json())["active"]["vllm"] == {"scenario": "s5", "round": 1}
    # shown now: announcing it again waits for nothing
    again = await (await client.post("/-/scenario", json={"scenario": "s5", "round": 2})).json()
    assert again["waited_s"] == 0


async def test_without_a_scraper_an_announcement_answers_at_once(
        aiohttp_client: Any, tmp_path: Path, upstream: Any) -> None:
    client = await _proxy(aiohttp_client, tmp_path, upstream[1].port)
    assert (await client.get("/metrics")).status == 200  # one read: a curl, not a scraper
    answer = await (await client.post("/-/scenario", json={"scenario": "s2", "round": 1})).json()
    assert answer["waited_s"] == 0 and "warning" not in answer
    cleared = await (await client.post("/-/scenario", json={"scenario": None})).json()
    assert "waited_s" not in cleared


async def test_every_series_is_shown_in_the_first_minute_and_then_only_the_used(
        aiohttp_client: Any, tmp_path: Path, upstream: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shown, "SHOW_ALL_S", 60.0)
    client = await _proxy(aiohttp_client, tmp_path, upstream[1].port)
    first = await (await client.get("/metrics")).text()
    # zeros for every pair: a scraper's sample of each after a start (a restart that lost the counts)
    assert ("sglang", "s9") in _pairs(first, "histogram")
    assert 'llmbench_requests_total{engine="vllm",outcome="success",reason="none",scenario="s9"} 0.0' in first
    announced = await (await client.post("/-/scenario", json={"scenario": "s4", "round": 1})).json()
    assert announced["waited_s"] == 0  # its zeros are on the page already
    client.app[STATE].shown.all_until = 0.0  # the minute is over
    later = await (await client.get("/metrics")).text()
    assert _pairs(later, "histogram") == {(e, s) for e in ("vllm", "sglang") for s in ("none", "s4")}


async def test_a_later_announcement_that_came_while_one_waited_is_the_one_set(
        aiohttp_client: Any, tmp_path: Path, upstream: Any) -> None:
    client = await _proxy(aiohttp_client, tmp_path, upstream[1].port)
    scrapes = client.app[STATE].scrapes
    now = [1000.0]
    scrapes.clock = lambda: now[0]
    for _ in range(2):
        assert (await client.get("/metrics")).status == 200
        now[0] += 5.0
    waiting = asyncio.create_task(client.post("/-/scenario", json={"scenario": "s6", "round": 1, "engine": "vllm"}))
    for _ in range(500):
        if ("vllm", "s6") in client.app[STATE].shown.requested:
            break
        await asyncio.sleep(0.01)
    cleared = await client.post("/-/scenario", json={"scenario": None, "engine": "vllm"})  # a clear overtakes it
    assert cleared.status == 200
    await client.get("/metrics")  # the scrape the first one waited for
    late = await waiting
    assert late.status == 409 and (await late.json())["error"]["type"] == "superseded"
    assert (await (await client.get("/-/scenarios")).json())["active"]["vllm"] is None


async def test_a_scraper_due_after_the_wait_is_not_waited_for_and_the_answer_says_so() -> None:
    now = [0.0]
    log = ScrapeLog(clock=lambda: now[0])
    log.completed("slow", began=0.0)
    now[0] = 45.0
    log.completed("slow", began=44.0)  # every 45 s: its next scrape after a 20 s wait
    assert await log.wait_scraped(after=45.0, timeout_s=20.0) is False


def test_only_a_scraper_with_an_interval_is_owed_and_only_until_it_is_overdue() -> None:
    now = [100.0]
    log = ScrapeLog(clock=lambda: now[0])
    log.completed("curl", began=99.0)
    assert log.unread(after=100.0, now=100.0) == {}  # a one-off reader
    log.completed("prom", began=99.5)
    now[0] = 115.0
    log.completed("prom", began=114.9)  # every 15 s
    assert log.unread(after=115.0, now=115.0) == {"prom": 115.0 + 15.0 + OVERDUE_S}
    assert log.unread(after=114.0, now=115.0) == {}  # its last scrape began after: read
    assert log.unread(after=115.0, now=115.0 + 15.0 + OVERDUE_S) == {}  # overdue: not waited for
    log.completed("slow", began=0.0)
    now[0] = 200.0
    log.completed("slow", began=199.0)  # a minute and more apart: owed until it leaves the last minute
    assert log.unread(after=200.0, now=200.0)["slow"] == 200.0 + SEEN_S


async def test_a_scrape_that_began_before_the_announcement_does_not_count() -> None:
    now = [10.0]
    log = ScrapeLog(clock=lambda: now[0])
    log.completed("prom", began=0.0)
    now[0] = 20.0
    log.completed("prom", began=19.0)
    waiter = asyncio.create_task(log.wait_scraped(after=20.0, timeout_s=60.0))
    await asyncio.sleep(0)
    log.completed("prom", began=19.5)  # began before: still owed
    await asyncio.sleep(0)
    assert not waiter.done()
    log.completed("prom", began=20.5)
    assert await waiter is True
