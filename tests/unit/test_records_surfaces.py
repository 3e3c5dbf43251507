"""What every record and the live counters say of the same request: the run, the SLO that
judged it, arrivals, client back-pressure, and one log line per upstream failure kind."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from exporter.proxy.finish import FailureLog

from ..helpers import OK_BODY, Upstream, metric_value, read_records, wait_for_records
from ..transcripts import sse

RUN_ID = re.compile(r"[0-9]{8}T[0-9]{6}Z-[0-9a-f]{6}")


async def _post(client: Any, engine: str = "vllm", scenario: str | None = None, **body: Any) -> bytes:
    headers = {"X-Bench-Scenario": scenario} if scenario else {}
    payload = {"prompt": "hi", "stream": True, "max_tokens": 2, **body}
    async with client.post(f"/{engine}/v1/completions", json=payload, headers=headers) as resp:
        return await resp.read()


async def test_records_carry_one_run_id_and_the_slo_that_judged_them(upstream: Any, proxy_factory: Any,
                                                                    tmp_path: Path) -> None:
    up, server = upstream
    client = await proxy_factory(server.port, slo={"ttft_s": 3.0, "tpot_s": 0.05},
                                 slo_by_scenario={"short-c32": {"ttft_s": 0.000001}})
    assert await _post(client, scenario="short-c1") == OK_BODY
    assert await _post(client, scenario="short-c32") == OK_BODY
    records = {r["scenario"]: r for r in await wait_for_records(tmp_path, 2)}
    assert len({r["run_id"] for r in records.values()}) == 1
    assert RUN_ID.fullmatch(records["short-c1"]["run_id"])
    assert records["short-c1"]["slo"] == {"ttft_s": 3.0, "tpot_s": 0.05}
    assert records["short-c1"]["slo_result"] == "met"
    assert records["short-c32"]["slo"] == {"ttft_s": 0.000001, "tpot_s": 0.05}
    assert records["short-c32"]["slo_result"] == "ttft_missed"
    text = await (await client.get("/metrics")).text()
    # the live counter and the record agree on the same request
    assert metric_value(text, "llmbench_slo_requests_total", scenario="short-c32", result="ttft_missed") == 1
    assert metric_value(text, "llmbench_slo_requests_total", scenario="short-c32", result="met") == 0


async def test_a_failed_request_has_no_slo_result(upstream: Any, proxy_factory: Any, tmp_path: Path) -> None:
    up, server = upstream

    async def empty(request: web.Request) -> web.Response:
        return web.Response(body=sse("[DONE]"), content_type="text/event-stream")

    up.handler = empty
    client = await proxy_factory(server.port)
    await _post(client)
    (record,) = await wait_for_records(tmp_path, 1)
    assert record["outcome"] == "failure" and record["slo_result"] is None
    assert record["slo"] == {"ttft_s": 3.0, "tpot_s": 0.05}


async def test_arrivals_uncertainty_and_backpressure_series(upstream: Any, proxy_factory: Any, tmp_path: Path) -> None:
    up, server = upstream
    client = await proxy_factory(server.port)
    before = await (await client.get("/metrics")).text()
    assert metric_value(before, "llmbench_arrivals_total", engine="sglang", scenario="short-c1") == 0
    for _ in range(3):
        await _post(client, engine="sglang", scenario="short-c1")
    await _post(client, engine="sglang", scenario="nope")
    await wait_for_records(tmp_path, 4)
    text = await (await client.get("/metrics")).text()
    assert metric_value(text, "llmbench_arrivals_total", engine="sglang", scenario="short-c1") == 3
    assert metric_value(text, "llmbench_arrivals_total", engine="sglang", scenario="other") == 1
    assert metric_value(text, "llmbench_request_timing_uncertainty_seconds_count", engine="sglang") == 4
    assert metric_value(text, "llmbench_client_backpressure_seconds_count", engine="sglang") == 4
    records = read_records(tmp_path)
    assert all(r["client_bound"] is False for r in records)


def _slow_reader(port: int, path: str, stop: threading.Event, got: list[int], step: int = 64,
                 max_tokens: int = 1000) -> None:
    """A real socket client with a 2 KiB receive buffer that takes ``step`` bytes every 20 ms."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)  # before connect: the window
    sock.settimeout(30)
    sock.connect(("127.0.0.1", port))
    body = b'{"prompt":"hi","stream":true,"max_tokens":%d}' % max_tokens
    sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body))
    try:
        while not stop.is_set():
            try:
                chunk = sock.recv(step)
            except TimeoutError:  # the response is over and the connection kept alive
                break
            if not chunk:
                break
            got.append(len(chunk))
            time.sleep(0.02)
    finally:
        sock.close()


def _big_stream(n: int) -> list[bytes]:
    """``n`` events of about 260 bytes each, then usage and [DONE]."""
    text = "x" * 200
    ev = ('{"id":"c","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
          f'"text":"{text}","logprobs":null,"finish_reason":null}}]}}')
    usage = '{"id":"c","object":"text_completion","created":1,"model":"m","choices":[],' \
            f'"usage":{{"prompt_tokens":1,"completion_tokens":{n},"total_tokens":{n + 1}}}}}'
    return [sse(ev)] * n + [sse(usage, "[DONE]")]


async def _paced(request: web.Request) -> web.StreamResponse:
    n = int((await request.json()).get("max_tokens", 1000))
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i, ev in enumerate(_big_stream(n)):
        await resp.write(ev)
        if i % 50 == 0:
            await asyncio.sleep(0.005)
    await resp.write_eof()
    return resp


@pytest.mark.slow  # the slowest reader takes about a minute to read its stream
async def test_slow_reading_clients_are_client_bound_and_a_fast_one_is_not(aiohttp_server: Any,
                                                                           proxy_factory: Any,
                                                                           tmp_path: Path) -> None:
    """The readers of issue 27: an 87 kB stream through a 2 KiB receive buffer, taken 128, 64 and
    32 bytes every 20 ms.  The kernel's send buffer would swallow such a stream whole; the
    proxy caps it for a streaming client, so their back-pressure is seen."""
    up = Upstream()
    up.handler = _paced
    server = await aiohttp_server(up.app())
    client = await proxy_factory(server.port)
    async with aiohttp.ClientSession() as fast:  # reads at once
        async with fast.post(f"http://127.0.0.1:{client.port}/vllm/v1/completions",
                             json={"prompt": "hi", "stream": True, "max_tokens": 330}) as resp:
            assert len(await resp.read()) > 85_000
    (quick,) = await wait_for_records(tmp_path, 1)
    assert quick["outcome"] == "success" and quick["client_bound"] is False
    assert quick["client_backpressure_s"] == 0.0

    stop = threading.Event()
    got: dict[int, list[int]] = {step: [] for step in (128, 64, 32)}
    readers = [threading.Thread(target=_slow_reader, args=(client.port, "/vllm/v1/completions", stop, got[step]),
                                kwargs={"step": step, "max_tokens": 330}) for step in got]
    for reader in readers:
        reader.start()
    try:
        records = await wait_for_records(tmp_path, 4, timeout_s=240)
    finally:
        stop.set()
        for reader in readers:
            await asyncio.get_running_loop().run_in_executor(None, reader.join, 30)
    for slow in records[1:]:
        assert slow["outcome"] == "success", slow
        assert slow["client_bound"] is True, {k: slow[k] for k in ("e2e_s", "client_backpressure_s")}
        assert slow["client_backpressure_s"] > 0.1 * slow["e2e_s"]
        assert slow["ttft_s"] is not None and slow["ttft_s"] < slow["client_backpressure_s"]
    text = await (await client.get("/metrics")).text()
    assert metric_value(text, "llmbench_client_backpressure_seconds_count", engine="vllm") == 4


def test_failure_log_says_each_kind_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    flog = FailureLog(every_s=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="llmbench.proxy"):
        for _ in range(5):
            flog.note("vllm", "connect_error", "cause of connect_error")
        flog.note("vllm", "http_status", "cause of http_status")
        flog.note("sglang", "connect_error", "cause of connect_error")
        flog.note("vllm", "client_abort", "cause of client_abort")  # the client's, not the engine's
        flog.note("vllm", None, "cause of None")
        now[0] += 11
        flog.note("vllm", "connect_error", "cause of connect_error")
    lines = [r.getMessage() for r in caplog.records]
    assert lines[:3] == ["engine vllm: connect_error: cause of connect_error",
                         "engine vllm: http_status: cause of http_status",
                         "engine sglang: connect_error: cause of connect_error"]
    assert lines[3] == "engine vllm: connect_error: cause of connect_error (and 4 more in the last 11 s)"
    assert len(lines) == 4


async def test_a_refused_upstream_is_logged_naming_engine_and_cause(proxy_factory: Any, tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = await proxy_factory(port)
    with caplog.at_level(logging.WARNING, logger="llmbench.proxy"):
        for _ in range(3):
            async with client.post("/vllm/v1/completions", json={"prompt": "x", "stream": True}) as resp:
                assert resp.status == 502
    lines = [r.getMessage() for r in caplog.records if r.name == "llmbench.proxy"]
    assert len([ln for ln in lines if ln.startswith("engine vllm: connect_error: ")]) == 1, lines


async def test_unknown_scenario_is_logged_once_per_name(upstream: Any, proxy_factory: Any, tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    up, server = upstream
    client = await proxy_factory(server.port)
    with caplog.at_level(logging.WARNING, logger="llmbench.proxy"):
        for name in ("typo-c8", "typo-c8", "other-name"):
            await _post(client, scenario=name)
    lines = [r.getMessage() for r in caplog.records if "not in the config's scenarios" in r.getMessage()]
    assert len(lines) == 2 and "'typo-c8'" in lines[0] and "'other-name'" in lines[1]
    assert {r["scenario"] for r in read_records(tmp_path)} == {"other"}
