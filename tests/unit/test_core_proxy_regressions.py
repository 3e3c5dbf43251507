"""Issue 15, F1 through the real proxy: deep JSON in a request or an event still gets a record
with the right reason, and the client gets the upstream's bytes unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web

from tests.helpers import OK_BODY, metric_value, read_records, stream_events, wait_for_records

DEEP = b"[" * 1000
TEXT = b'data: {"id":"c1","choices":[{"index":0,"text":"Hi"}]}\n\n'
USAGE = b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\n'


async def _post(upstream: Any, proxy_factory: Any, reads: list[bytes], body: bytes) -> tuple[Any, bytes, Any]:
    up, server = upstream

    async def handler(request: web.Request) -> web.StreamResponse:
        return await stream_events(request, reads)

    up.handler = handler
    client = await proxy_factory(server.port)
    resp = await client.post("/vllm/v1/completions", data=body, headers={"Content-Type": "application/json"})
    return resp, await resp.read(), client


async def test_deep_request_body_is_forwarded_and_recorded(upstream, proxy_factory, tmp_path: Path) -> None:
    body = b'{"prompt":"x","stream":true,"stream_options":{"include_usage":true},"tools":' + DEEP + b"]" * 1000 + b"}"
    resp, got, _ = await _post(upstream, proxy_factory, [OK_BODY], body)
    assert resp.status == 200 and got == OK_BODY
    assert upstream[0].seen[0]["body"] == body  # forwarded unchanged
    rec, = await wait_for_records(tmp_path, 1)
    assert (rec["outcome"], rec["reason"], rec["stream"]) == ("success", None, True)


async def test_unparseable_deep_request_body_is_forwarded_and_recorded(upstream, proxy_factory, tmp_path: Path) -> None:
    resp, got, _ = await _post(upstream, proxy_factory, [OK_BODY], DEEP)
    assert resp.status == 200 and got == OK_BODY and upstream[0].seen[0]["body"] == DEEP
    rec, = await wait_for_records(tmp_path, 1)
    assert rec["outcome"] == "success"  # no stream flag in the body: the Content-Type decides


async def test_deep_event_mid_stream_is_malformed_not_a_disconnect(upstream, proxy_factory, tmp_path: Path) -> None:
    reads = [TEXT, b"data: " + DEEP + b"\n\n", USAGE, b"data: [DONE]\n\n"]
    resp, got, client = await _post(upstream, proxy_factory, reads, b'{"prompt":"x","stream":true}')
    assert resp.status == 200 and got == b"".join(reads)  # the whole stream, not cut
    rec, = await wait_for_records(tmp_path, 1)
    assert (rec["outcome"], rec["reason"]) == ("failure", "malformed")
    assert "deeper than" in rec["detail"]


async def test_deep_unterminated_last_event_is_recorded_and_counted(upstream, proxy_factory, tmp_path: Path) -> None:
    reads = [TEXT, USAGE, b"data: " + DEEP]
    resp, got, client = await _post(upstream, proxy_factory, reads, b'{"prompt":"x","stream":true}')
    assert resp.status == 200 and got == b"".join(reads)
    rec, = await wait_for_records(tmp_path, 1)
    assert (rec["outcome"], rec["reason"]) == ("failure", "malformed")
    text = await (await client.get("/metrics")).text()
    assert metric_value(text, "llmbench_requests_total", outcome="failure", engine="vllm") == 1
    assert len(read_records(tmp_path)) == 1
