"""A worker's value file caught mid-creation (0 bytes) never crashes the supervisor's /metrics:
the first render before serving shrugs it off, a scrape answers 503 and the next one works."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp import web

from exporter.proxy.exposition import metrics_handler
from exporter.proxy.shared import SharedScenarios
from exporter.proxy.workers import supervisor_registry


def _run_dir(tmp_path: Path) -> Path:
    """serve's run directory: the shared scenario state, and a worker's value file caught
    mid-creation (0 bytes: what prometheus_client's MmapedDict leaves for a moment)."""
    SharedScenarios.create(tmp_path / "scenarios.state").close()
    (tmp_path / "counter_4242.db").write_bytes(b"")
    return tmp_path


async def test_a_torn_value_file_is_a_503_then_the_scrape_works(aiohttp_client: Any, tmp_path: Path) -> None:
    torn = _run_dir(tmp_path) / "counter_4242.db"
    app = web.Application()
    app.router.add_get("/metrics", metrics_handler(supervisor_registry(tmp_path)))
    client = await aiohttp_client(app)
    resp = await client.get("/metrics")
    assert resp.status == 503 and "scrape again" in await resp.text()
    torn.unlink()  # the worker finished creating it (or it went): the next scrape works
    resp = await client.get("/metrics")
    assert resp.status == 200


async def test_the_first_render_survives_a_torn_file(tmp_path: Path, monkeypatch: Any) -> None:
    from exporter.proxy import workers
    from exporter.proxy.config import validate

    _run_dir(tmp_path)
    config = validate({"engines": [{"name": "vllm", "upstream": "http://127.0.0.1:9"}],
                       "records_dir": str(tmp_path / "run")})
    stop = asyncio.Event()
    task = asyncio.create_task(workers.render_forever(config, tmp_path, stop, nice=0))
    async with asyncio.timeout(30):  # only against a hang
        while not (tmp_path / "metrics.sock").exists():
            assert not task.done(), task.exception()
            await asyncio.sleep(0.01)
    stop.set()
    await task
