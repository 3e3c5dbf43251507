"""Set up before the proxy says ready what its first requests would otherwise set up.

A fresh ``serve``'s first request would pay for the upstream request path run for the first
time and for the first connection to the engine, and for the measuring core's first run
(``bench/cold_start.py`` measures the first run through a fresh proxy against its later ones).
So, before the first request:

* one pooled keep-alive connection to each engine (the proxy's own upstream client,
  :mod:`exporter.proxy.wire.upstream`), opened by an unmeasured ``GET /health``
  (best effort: an engine that is not up yet costs at most ``WARM_TIMEOUT_S`` and nothing
  else; a non-200 answer warms the same code; an engine that closes idle connections sooner
  than the first request comes leaves the warmed code, not the connection);
* the measuring core judges a canned stream once (the request scan, usage injection and
  filtering, the SSE parser and JSON reads), off the record: no record, no counter.
"""

from __future__ import annotations

import asyncio
import contextlib

from yarl import URL

from exporter.core.analysis import RequestSpec, analyze_bytes
from exporter.core.usage import UsageEventFilter, inject_usage

from .config import Config
from .wire.errors import UpstreamClosed, UpstreamConnectError
from .wire.upstream import Pool, origin_of, request_head

__all__ = ["warm_up", "WARM_TIMEOUT_S"]

WARM_TIMEOUT_S = 2.0
_BODY = b'{"model":"m","prompt":"warm","max_tokens":2,"stream":true,"ignore_eos":true}'
_STREAM = b"".join(b"data: " + e + b"\n\n" for e in (
    b'{"id":"w","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"a",'
    b'"logprobs":null,"finish_reason":null}]}',
    b'{"id":"w","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"b",'
    b'"logprobs":null,"finish_reason":"length"}]}',
    b'{"id":"w","object":"text_completion","created":1,"model":"m","choices":[],'
    b'"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}',
    b"[DONE]",
))


def warm_core() -> None:
    """Judge a canned stream once, as a request would be (off the record)."""
    spec = RequestSpec.from_body(_BODY)
    injected = inject_usage(_BODY, spec)
    if injected is not None:
        spec = RequestSpec.from_body(bytes(injected))
    filt = UsageEventFilter()
    half = len(_STREAM) // 2
    filt.feed(_STREAM[:half])
    filt.feed(_STREAM[half:])
    filt.flush()
    analyze_bytes([(0.001, _STREAM[:half]), (0.002, _STREAM[half:])], status=200, spec=spec, streaming=True)


async def _connect(pool: Pool, url: URL) -> None:
    with contextlib.suppress(UpstreamConnectError, UpstreamClosed, TimeoutError):
        async with asyncio.timeout(WARM_TIMEOUT_S):
            resp = await pool.request(origin_of(url), request_head("GET", url, (), 0), b"")
            try:
                await resp.read()  # read whole: the connection goes back to the pool
            finally:
                resp.release()


async def warm_up(config: Config, pool: Pool) -> None:
    """Warm the core, and open one pooled connection to each engine."""
    warm_core()
    await asyncio.gather(*(_connect(pool, URL(f"{e.base_url}/health")) for e in config.engines))
