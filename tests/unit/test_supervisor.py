"""``serve``'s set-up, in this process: two workers' apps with multiprocess values and the
shared scenario state, and the supervisor's renderer on its unix socket (what
exporter/proxy/workers.py runs after the fork).  Round gauges stay bounded whatever the
number of workers, /metrics speaks the format and the compression the scraper asks for, and
``GET /-/scenarios`` says what may be set."""

from __future__ import annotations

import asyncio
import gzip
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from prometheus_client import values
from prometheus_client.exposition import choose_encoder
from prometheus_client.parser import text_string_to_metric_families

from exporter.proxy import shown
from exporter.proxy.exposition import render
from exporter.proxy.scenarios import END_NAME, MAX_ROUNDS, START_NAME
from exporter.proxy.shared import SharedScenarios
from exporter.proxy.valuefiles import use_multiprocess_values
from exporter.proxy.workers import render_forever, supervisor_registry, worker_app

from tests.helpers import make_config, read_records

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
REQUEST = {"prompt": "x", "max_tokens": 2, "ignore_eos": True, "stream": True,
           "stream_options": {"include_usage": True}}


@pytest.fixture
async def workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, upstream: Any,
                  aiohttp_client: Any) -> AsyncIterator[list[TestClient]]:
    run_dir = tmp_path / "serve"
    run_dir.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(run_dir))
    monkeypatch.setattr(values, "ValueClass", values.ValueClass)  # restored after the test
    use_multiprocess_values()
    SharedScenarios.create(run_dir / "scenarios.state").close()
    config = make_config(tmp_path, upstream[1].port)
    stop = asyncio.Event()
    renderer = asyncio.create_task(render_forever(config, run_dir, stop, nice=0))
    for _ in range(500):
        if (run_dir / "metrics.sock").exists() or renderer.done():
            break
        await asyncio.sleep(0.01)
    assert (run_dir / "metrics.sock").exists(), renderer
    clients = [await aiohttp_client(worker_app(config, i, 2, run_dir, "run-under-test")) for i in range(2)]
    yield clients
    stop.set()
    await renderer


def _rounds(text: str, name: str) -> dict[str, list[int]]:
    """Rounds per engine in gauge ``name``, in the order rendered."""
    out: dict[str, list[int]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out.setdefault(s.labels["engine"], []).append(int(s.labels["round"]))
    return out


async def test_400_rounds_leave_the_newest_256_whatever_the_workers(workers: list[TestClient]) -> None:
    total = 400
    for rnd in range(total):  # alternately through each worker, as the kernel would spread them
        resp = await workers[rnd % 2].post("/-/scenario", json={"scenario": "short-c1", "round": rnd})
        assert resp.status == 200
    text = await (await workers[0].get("/metrics", headers={"Accept-Encoding": "identity"})).text()
    newest = list(range(total - MAX_ROUNDS, total))
    starts, ends = _rounds(text, START_NAME), _rounds(text, END_NAME)
    assert set(starts) == set(ends) == {"vllm", "sglang"}
    for engine in ("vllm", "sglang"):
        assert sorted(starts[engine]) == newest  # no more than 256, and the newest
        assert sorted(ends[engine]) == newest[:-1]  # the last one still runs
    info = [s.labels for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "llmbench_scenario_info"]
    assert sorted(x["engine"] for x in info) == ["sglang", "vllm"] and {x["round"] for x in info} == {"399"}


async def test_the_supervisor_answers_in_the_asked_format_and_gzips(workers: list[TestClient]) -> None:
    asked = {"Accept": OPENMETRICS, "Accept-Encoding": "gzip"}
    resp = await workers[1].get("/metrics", headers=asked, auto_decompress=False)
    assert resp.status == 200 and resp.headers["Content-Encoding"] == "gzip"
    assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
    body = gzip.decompress(await resp.read())
    assert body.endswith(b"# EOF\n") and b"llmbench_requests_total" in body
    plain = await workers[1].get("/metrics", headers={"Accept-Encoding": "identity"})
    assert plain.headers["Content-Type"].startswith("text/plain") and "Content-Encoding" not in plain.headers
    assert not (await plain.read()).endswith(b"# EOF\n")
    bare = await workers[0].get("/metrics", skip_auto_headers=("Accept-Encoding",), auto_decompress=False)
    assert "Content-Encoding" not in bare.headers  # a scraper that asked for no encoding gets none
    assert b"llmbench_requests_total" in await bare.read()


async def test_workers_warm_up_off_the_record(workers: list[TestClient], upstream: Any, tmp_path: Path) -> None:
    """Before its first request each worker opened a connection to each engine (GET /health),
    and judged nothing: no record, no count."""
    assert [s["path"] for s in upstream[0].seen] == ["/health"] * 4  # 2 workers x 2 engines
    text = await (await workers[0].get("/metrics")).text()
    assert sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "llmbench_requests_total") == 0
    assert not (tmp_path / "run" / "requests.jsonl").read_bytes()


async def test_scenarios_route_names_what_may_be_set(workers: list[TestClient], tmp_path: Path) -> None:
    assert (await workers[0].post("/vllm/v1/completions", json=REQUEST)).status == 200
    for client in workers:
        doc = await (await client.get("/-/scenarios")).json()
        assert doc == {"scenarios": ["short-c1", "short-c32"], "engines": ["vllm", "sglang"],
                       "run_id": "run-under-test", "active": {"vllm": None, "sglang": None}}
    assert [r["run_id"] for r in read_records(tmp_path)] == ["run-under-test"]
    # what one worker was told, every worker says (the shared scenario state)
    await workers[0].post("/-/scenario", json={"scenario": "short-c32", "round": 3, "engine": "sglang"})
    for client in workers:
        doc = await (await client.get("/-/scenarios")).json()
        assert doc["active"] == {"vllm": None, "sglang": {"scenario": "short-c32", "round": 3}}


async def test_the_in_process_app_negotiates_too(upstream: Any, proxy_factory: Any) -> None:
    client = await proxy_factory(upstream[1].port)
    resp = await client.get("/metrics", headers={"Accept": OPENMETRICS, "Accept-Encoding": "gzip"},
                            auto_decompress=False)
    assert resp.headers["Content-Encoding"] == "gzip"
    assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
    assert gzip.decompress(await resp.read()).endswith(b"# EOF\n")
    only = await client.get("/metrics", params=[("name[]", "llmbench_arrivals_total")])
    names = {f.name for f in text_string_to_metric_families(await only.text())}
    assert names == {"llmbench_arrivals"}


async def test_name_filter_answers_under_serve_as_in_process(workers: list[TestClient]) -> None:
    """``name[]`` keeps those names' families on the supervisor's page too (its collectors describe
    no names, so prometheus_client's restricted registry alone found none)."""
    assert (await workers[0].post("/vllm/v1/completions", json=REQUEST)).status == 200
    wanted = [("name[]", "llmbench_requests_total"), ("name[]", "llmbench_time_to_first_token_seconds_bucket")]
    only = await workers[1].get("/metrics", params=wanted)
    families = {f.name: f for f in text_string_to_metric_families(await only.text())}
    assert set(families) == {"llmbench_requests", "llmbench_time_to_first_token_seconds"}
    assert {s.name for s in families["llmbench_time_to_first_token_seconds"].samples} == {
        "llmbench_time_to_first_token_seconds_bucket"}
    assert sum(s.value for s in families["llmbench_requests"].samples if s.name == "llmbench_requests_total") == 1
    none = await workers[1].get("/metrics", params=[("name[]", "no_such_metric")])
    assert none.status == 200 and not list(text_string_to_metric_families(await none.text()))


def test_a_read_of_some_names_leaves_the_whole_pages_bytes_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole page keeps each unchanged family's bytes between scrapes; a ``name[]`` read in
    between encodes its part and leaves them (the next whole scrape encodes nothing again)."""
    from prometheus_client import CollectorRegistry, Counter, Histogram

    from exporter.proxy import exposition

    registry = CollectorRegistry()
    Counter("llmbench_test_things", "Things.", registry=registry).inc()
    Histogram("llmbench_test_seconds", "Seconds.", registry=registry).observe(0.1)

    class Frozen:  # the same family objects on every collect, as the supervisor's merge gives them
        families = list(registry.collect())

        def collect(self) -> list[Any]:
            return self.families

    frozen = Frozen()
    encoded: list[str] = []
    whole = exposition._Encoding.whole

    def counted(self: Any, family: Any) -> bytes:
        encoded.append(family.name)
        return whole(self, family)

    monkeypatch.setattr(exposition._Encoding, "whole", counted)
    monkeypatch.setattr(exposition, "_ENCODINGS", {})
    page = render(frozen, OPENMETRICS, "")[0]
    assert sorted(encoded) == ["llmbench_test_seconds", "llmbench_test_things"]
    part = render(frozen, OPENMETRICS, "", ["llmbench_test_things_total"])[0]
    assert b"llmbench_test_things_total 1.0" in part and b"llmbench_test_seconds" not in part
    encoded.clear()
    assert render(frozen, OPENMETRICS, "")[0] == page and encoded == []


async def test_a_scrape_parses_the_shared_state_once_and_only_after_a_change(
        workers: list[TestClient], monkeypatch: pytest.MonkeyPatch) -> None:
    parses: list[int] = []
    read = SharedScenarios.read

    def counted(self: SharedScenarios) -> tuple[int, dict[str, Any]]:
        if self is shared:  # the supervisor's; the workers (in this process here) pull their own
            parses.append(1)
        return read(self)

    monkeypatch.setattr(SharedScenarios, "read", counted)
    shared = SharedScenarios(Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]) / "scenarios.state")
    shown_series = shown.ShownSeries(supervisor_registry(Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]), shared),
                        shared.active_pairs, lambda: False)
    await workers[0].post("/-/scenario", json={"scenario": "short-c1", "round": 1})
    first = render(shown_series, OPENMETRICS, "")[0]
    assert b'llmbench_scenario_info{engine="vllm",round="1",scenario="short-c1"} 1.0' in first
    assert len(parses) == 1  # the series shown and the round gauges: one parse
    assert render(shown_series, OPENMETRICS, "")[0] == first and len(parses) == 1  # unchanged: none
    await workers[0].post("/-/scenario", json={"scenario": "short-c32", "round": 2})
    assert b'scenario="short-c32"} 1.0' in render(shown_series, OPENMETRICS, "")[0]
    assert len(parses) == 2


@pytest.mark.parametrize("accept", [OPENMETRICS, "application/openmetrics-text", "text/plain;version=0.0.4", ""])
async def test_the_openmetrics_shortcut_gives_the_encoders_bytes(workers: list[TestClient], accept: str) -> None:
    """The supervisor's render equals prometheus_client's own encoder on the same state."""
    for rnd in range(3):
        await workers[0].post("/-/scenario", json={"scenario": "short-c1", "round": rnd})
    await workers[0].post("/vllm/v1/completions", json=REQUEST)
    registry = supervisor_registry(Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]))
    encoder, _ = choose_encoder(accept)
    assert render(registry, accept, "")[0] == encoder(registry)


@pytest.fixture
def past_the_first_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    """A renderer made now is past its start-up minute, where every series is shown."""
    monkeypatch.setattr(shown, "SHOW_ALL_S", 0.0)


@pytest.mark.usefixtures("past_the_first_minute")
async def test_the_supervisor_shows_a_round_once_announced_and_the_worker_waits_for_its_scrape(
        workers: list[TestClient]) -> None:
    identity = {"Accept-Encoding": "identity"}
    zero = 'llmbench_time_to_first_token_seconds_count{engine="sglang",scenario="short-c1"} 0.0'
    assert zero in await (await workers[0].get("/metrics", headers=identity)).text()  # the first: everything
    second = await (await workers[0].get("/metrics", headers=identity)).text()
    assert zero not in second and 'scenario="none"' in second  # a configured scenario no request used
    announce = asyncio.create_task(workers[1].post("/-/scenario", json={"scenario": "short-c1", "round": 1}))
    shown = []
    for _ in range(500):  # a scraper at work until the announcement is answered
        text = await (await workers[0].get("/metrics", headers=identity)).text()
        shown += [text] if zero in text else []
        if announce.done():
            break
        await asyncio.sleep(0.01)
    # the zeros were read before the round was set: the first scrape that shows them has no round yet
    assert shown and 'llmbench_scenario_info{engine="sglang",round="1",scenario="short-c1"}' not in shown[0]
    answer = await (await announce).json()
    # the supervisor, which renders every scrape, answered the worker: no warning that it could not say
    assert answer["scenario"] == "short-c1" and "warning" not in answer, answer
    assert answer["waited_s"] > 0
    after = await (await workers[0].get("/metrics", headers=identity)).text()
    assert 'llmbench_scenario_info{engine="sglang",round="1",scenario="short-c1"} 1.0' in after
