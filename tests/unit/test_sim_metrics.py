"""The simulator's /metrics negotiates like the proxy's: OpenMetrics when asked, gzip when accepted."""

from __future__ import annotations

import gzip
from typing import Any

from exporter.harness.sim import PROFILES, create_sim_app


async def test_sim_metrics_negotiate_openmetrics_and_gzip(aiohttp_client: Any) -> None:
    client = await aiohttp_client(create_sim_app(PROFILES["vllm"]))
    plain = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert plain.headers["Content-Type"].startswith("text/plain")
    assert "vllm:num_requests_running" in await plain.text()
    om = await client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0",
                                               "Accept-Encoding": "gzip"}, auto_decompress=False)
    assert om.headers["Content-Type"].startswith("application/openmetrics-text")
    assert om.headers["Content-Encoding"] == "gzip"
    body = gzip.decompress(await om.read()).decode()
    assert body.rstrip().endswith("# EOF") and "vllm:num_requests_running" in body
