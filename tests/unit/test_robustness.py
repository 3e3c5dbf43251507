"""Bad input through the proxy: malformed SSE, oversized lines, junk bytes, and a SIGKILL."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from tests.helpers import read_records, stream_events

REQ = {"prompt": "x", "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}


async def _through(upstream: Any, proxy_factory: Any, body: bytes, **cfg: Any) -> tuple[bytes, Any]:
    up, server = upstream
    up.handler = lambda r: stream_events(r, [body[i:i + 1000] for i in range(0, len(body), 1000)])
    client = await proxy_factory(server.port, **cfg)
    resp = await client.post("/vllm/v1/completions", json=REQ)
    return await resp.read(), resp


async def test_malformed_and_junk_bytes_pass_unchanged(upstream: Any, proxy_factory: Any, tmp_path: Path) -> None:
    body = b"data: {not json}\n\n\xff\xfe\x00garbage\r\n\r\ndata: [DONE]\n\n"
    got, resp = await _through(upstream, proxy_factory, body)
    assert got == body and resp.status == 200
    rec, = read_records(tmp_path)
    assert rec["reason"] == "malformed" and "unparseable" in rec["detail"]


async def test_oversized_line_is_malformed_but_forwarded(upstream: Any, proxy_factory: Any, tmp_path: Path) -> None:
    body = b"data: {\"choices\":[{\"text\":\"" + b"x" * 300_000 + b"\"}]}\n\ndata: [DONE]\n\n"
    got, _ = await _through(upstream, proxy_factory, body, max_line_bytes=65536)
    assert hashlib.sha256(got).digest() == hashlib.sha256(body).digest()
    rec, = read_records(tmp_path)
    assert rec["reason"] == "malformed" and "over 65536 bytes" in rec["detail"]
    assert rec["capture_sha256"] == hashlib.sha256(body).hexdigest()


async def test_request_over_the_body_limit_is_refused(upstream: Any, proxy_factory: Any) -> None:
    up, server = upstream
    client = await proxy_factory(server.port, max_request_body_bytes=4096)
    resp = await client.post("/vllm/v1/completions", json={**REQ, "prompt": "y" * 10_000})
    assert resp.status == 413 and up.seen == []


def test_transport_reasons_are_named_alike_for_proxy_and_driver() -> None:
    import aiohttp
    from aiohttp.client_reqrep import ConnectionKey

    from exporter.proxy.wire.errors import transport_reason

    key = ConnectionKey("h", 1, False, True, None, None, None)
    assert transport_reason(aiohttp.ClientConnectorError(key, OSError(111, "refused"))) == "connect_error"
    assert transport_reason(aiohttp.ConnectionTimeoutError("connect")) == "connect_error"  # not "timeout"
    assert transport_reason(TimeoutError()) == "timeout"
    assert transport_reason(aiohttp.ServerDisconnectedError()) == "upstream_disconnect"
    assert transport_reason(aiohttp.ClientPayloadError("cut")) == "upstream_disconnect"
    assert transport_reason(ValueError("ours")) is None
