"""The request leaves first: what its send does not need (its id, its labels, its counts) is
done after it went upstream (SPEC 27: the request's hold before ``t0`` is the proxy's)."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from exporter.proxy import exchange as exchange_module
from exporter.proxy.wire import upstream as upstream_module

from tests.helpers import OK_BODY, metric_value, read_records, stream_events, wait_for_records
from tests.unit.test_relay import ThreadEngine, engine_factory  # noqa: F401  (a fixture)

REQ = {"model": "m", "prompt": "hi", "max_tokens": 2, "ignore_eos": True, "stream": True,
       "stream_options": {"include_usage": True}}


def _watch(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What happened, in order: each request's send upstream and its bookkeeping."""
    seen: list[str] = []
    send, book = upstream_module._Connection.send, exchange_module.Exchange._book

    def sending(self: Any, data: bytes, head: Any) -> Any:
        if data.startswith(b"POST /v1/completions "):  # not the engine watch's probes
            seen.append("send" if self.uses else "send on a new connection")
        return send(self, data, head)

    def booking(self: Any) -> None:
        if not self._booked:
            seen.append("book")
        book(self)

    monkeypatch.setattr(upstream_module._Connection, "send", sending)
    monkeypatch.setattr(exchange_module.Exchange, "_book", booking)
    return seen


async def test_the_request_leaves_before_its_bookkeeping(upstream, proxy_factory, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _watch(monkeypatch)
    up, server = upstream
    up.handler = lambda r: stream_events(r, [OK_BODY])
    client = await proxy_factory(server.port)
    orders = []
    for n in (1, 2, 3):
        resp = await client.post("/vllm/v1/completions", json=REQ, headers={"X-Request-Id": f"r{n}"})
        assert resp.status == 200 and await resp.read() == OK_BODY
        orders.append(list(seen))
        seen.clear()
    # a request that waits for a new connection books meanwhile; one on a pooled connection (the
    # engine watch shares the pool, so which ones are pooled is not fixed) leaves first
    assert all(sorted(o) == ["book", "send on a new connection"] or o == ["send", "book"] for o in orders)
    assert ["send", "book"] in orders
    records = await wait_for_records(tmp_path, 3)
    assert [r["client_request_id"] for r in records] == ["r1", "r2", "r3"]
    assert all(len(r["id"]) == 32 and r["outcome"] == "success" for r in records)
    assert resp.headers["X-LLMBench-Request-Id"] == records[2]["id"] and len({r["id"] for r in records}) == 3
    assert all((r["model"], r["stream"]) == ("m", True) for r in records)
    text = await (await client.get("/metrics")).text()
    assert metric_value(text, "llmbench_arrivals_total", engine="vllm") == 3
    assert metric_value(text, "llmbench_requests_in_flight", engine="vllm") == 0


def _watch_spec(monkeypatch: pytest.MonkeyPatch, seen: list[str]) -> None:
    """Each measured request's spec read (the core's scan of its body) into ``seen`` too."""
    from_body = exchange_module.RequestSpec.from_body

    def reading(body: bytes, endpoint: str = "completions") -> Any:
        seen.append("spec")
        return from_body(body, endpoint)

    monkeypatch.setattr(exchange_module.RequestSpec, "from_body", staticmethod(reading))


@pytest.mark.parametrize("stream", [True, False])
async def test_the_body_is_scanned_after_the_send_and_before_the_answer(
        upstream, proxy_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: bool) -> None:
    """The request's spec (stream or not, the model, the tokens asked) is not needed to send it:
    it is read once the request left, and the answer is still read as the spec says."""
    seen = _watch(monkeypatch)
    _watch_spec(monkeypatch, seen)
    up, server = upstream
    whole = {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": "hi", "finish_reason": "length"}],
             "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}}

    up.handler = (lambda r: stream_events(r, [OK_BODY])) if stream else (
        lambda r: asyncio.sleep(0, web.json_response(whole)))
    client = await proxy_factory(server.port)
    orders = []
    for _ in range(3):
        resp = await client.post("/vllm/v1/completions", json={**REQ, "stream": stream})
        assert resp.status == 200
        await resp.read()
        orders.append(list(seen))
        seen.clear()
    # (_watch notes "book" as the bookkeeping starts: the spec is read in it)
    assert ["send", "book", "spec"] in orders  # on a pooled connection the request left first
    assert all(o in (["send", "book", "spec"], ["book", "spec", "send on a new connection"]) for o in orders)
    records = await wait_for_records(tmp_path, 3)
    assert all((r["model"], r["stream"], r["outcome"]) == ("m", stream, "success") for r in records), [
        (r["model"], r["stream"], r["outcome"], r["reason"], r["detail"]) for r in records]


WHOLE = (b'{"id":"c","object":"text_completion","choices":[{"index":0,"text":"hi","finish_reason":"length"}],'
         b'"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}')


class Untyped(ThreadEngine):
    """Answers with a whole document and no Content-Type: only the request's ``stream: false``
    says it is not SSE (the spec's default is a stream)."""

    def serve(self, conn: socket.socket, n: int) -> bool:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(WHOLE), WHOLE))
        return True


async def test_an_untyped_answer_is_read_as_the_spec_read_after_the_send_says(
        engine_factory: Any, proxy_factory: Any, tmp_path: Path) -> None:  # noqa: F811
    engine = engine_factory(Untyped)
    client = await proxy_factory(engine.port)
    for _ in range(2):  # a new upstream connection, then a pooled one (the spec read after the send)
        resp = await client.post("/vllm/v1/completions", json={**REQ, "stream": False})
        assert resp.status == 200 and await resp.read() == WHOLE
    records = await wait_for_records(tmp_path, 2)
    assert [(r["stream"], r["outcome"]) for r in records] == [(False, "success")] * 2, records


async def test_a_body_the_proxy_changes_is_scanned_before_its_send(
        upstream, proxy_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``usage: inject`` asks the engine for usage a client did not: the spec says how to change
    the body, so it is read before the send."""
    seen = _watch(monkeypatch)
    _watch_spec(monkeypatch, seen)
    up, server = upstream
    up.handler = lambda r: stream_events(r, [OK_BODY])
    engines = [{"name": "vllm", "upstream": f"http://127.0.0.1:{server.port}", "usage": "inject"}]
    client = await proxy_factory(server.port, engines=engines)
    asked = {k: v for k, v in REQ.items() if k != "stream_options"}
    for _ in range(3):
        resp = await client.post("/vllm/v1/completions", json=asked)
        assert resp.status == 200
        await resp.read()
        assert seen[0] == "spec" and seen.index("spec") < min(i for i, x in enumerate(seen) if x.startswith("send"))
        seen.clear()
    assert all(r["outcome"] != "proxy_error" for r in await wait_for_records(tmp_path, 3))


async def test_a_body_that_comes_after_the_bookkeeping_still_labels_the_record(
        upstream, proxy_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _watch(monkeypatch)
    up, server = upstream
    up.handler = lambda r: stream_events(r, [OK_BODY])
    client = await proxy_factory(server.port)
    body = json.dumps({**REQ, "model": "late-model"}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    writer.write(b"POST /vllm/v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%b" % (len(body), body[:10]))
    await writer.drain()
    # the exchange waits for the rest of the body: its bookkeeping runs meanwhile, counted
    for _ in range(250):
        text = await (await client.get("/metrics")).text()
        if metric_value(text, "llmbench_arrivals_total", engine="vllm") == 1:
            break
        await asyncio.sleep(0.02)
    assert seen == ["book"] and metric_value(text, "llmbench_requests_in_flight", engine="vllm") == 1
    writer.write(body[10:])
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    await reader.readuntil(b"\r\n0\r\n\r\n")  # the whole body: the request is not cut short
    writer.close()
    rec, = await wait_for_records(tmp_path, 1)
    assert seen in (["book", "send"], ["book", "send on a new connection"])
    assert (rec["model"], rec["stream"], rec["outcome"]) == ("late-model", True, "success")
    assert f"X-LLMBench-Request-Id: {rec['id']}".encode() in head
    assert read_records(tmp_path) == [rec]


async def test_labels_that_fail_to_read_cost_neither_the_record_nor_the_in_flight_count(
        upstream, proxy_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: Any) -> Any:
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(exchange_module.Exchange, "_identity", broken)
    up, server = upstream
    up.handler = lambda r: stream_events(r, [OK_BODY])
    client = await proxy_factory(server.port)
    resp = await client.post("/vllm/v1/completions", json=REQ, headers={"X-Bench-Scenario": "short-c1"})
    assert resp.status == 200 and await resp.read() == OK_BODY
    rec, = await wait_for_records(tmp_path, 1)
    assert rec["id"] == resp.headers["X-LLMBench-Request-Id"] and len(rec["id"]) == 32
    assert (rec["scenario"], rec["outcome"], rec["engine"]) == ("none", "success", "vllm")
    text = await (await client.get("/metrics")).text()
    assert metric_value(text, "llmbench_requests_in_flight", engine="vllm") == 0
    assert metric_value(text, "llmbench_arrivals_total", engine="vllm", scenario="none") == 1


async def test_session_turns_follow_arrival_not_bookkeeping(upstream, tmp_path: Path) -> None:
    """A request that ends before it ever yields (a 413 whose body was already read) books itself at
    once, ahead of an earlier request whose bookkeeping the loop has not run yet: its turn number is
    still taken as it arrived, after the earlier one's."""
    from aiohttp.test_utils import make_mocked_request

    from exporter.proxy.app import STATE, create_app

    from tests.helpers import make_config

    app = create_app(make_config(tmp_path, upstream[1].port))
    state = app[STATE]
    engine = state.config.engine("vllm")
    headers = {"X-Session-ID": "chat-1", "Content-Type": "application/json"}
    first, second = (exchange_module.Exchange(
        state, make_mocked_request("POST", "/vllm/v1/completions", headers=headers, app=app), engine,
        "v1/completions") for _ in range(2))
    assert (second._identity().turn, first._identity().turn) == (2, 1)  # labelled in the other order
    assert first._identity().session_id == "chat-1"
