"""A real ``serve --workers 2``: 400 rounds set through ``POST /-/scenario`` (new connections,
so both workers take some) leave the newest 256 rounds per engine in each round gauge, and
``GET /-/scenarios`` names what may be set and the one run id of both workers."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from exporter.harness.stack import Child, exporter_argv, free_port, wait_http

START = "llmbench_scenario_round_start_timestamp_seconds"
END = "llmbench_scenario_round_end_timestamp_seconds"
ROUNDS = 400


async def _drive(url: str) -> tuple[str, list[dict[str, object]]]:
    for rnd in range(ROUNDS):
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
            async with s.post(f"{url}/-/scenario", json={"scenario": "s1", "round": rnd}) as r:
                assert r.status == 200, await r.text()
    docs = []
    for _ in range(8):  # new connections: both workers answer some
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
            async with s.get(f"{url}/-/scenarios") as r:
                docs.append(await r.json())
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        return await r.text(), docs


def test_400_rounds_through_serve_keep_the_newest_256(tmp_path: Path) -> None:
    port = free_port()  # serve refuses port 0 and names no bound port
    url = f"http://127.0.0.1:{port}"
    cfg = tmp_path / "proxy.yaml"
    cfg.write_text(yaml.safe_dump({
        "listen": f"127.0.0.1:{port}", "records_dir": str(tmp_path / "run"), "scenarios": ["s1", "s2"],
        "engines": [{"name": "vllm", "upstream": "http://127.0.0.1:9"},
                    {"name": "sglang", "upstream": "http://127.0.0.1:9"}]}))
    proxy = Child("proxy", exporter_argv("serve", "--config", str(cfg), "--workers", "2"), tmp_path)
    try:
        wait_http(f"{url}/-/ready", 30, proxy)
        text, docs = asyncio.run(_drive(url))
    finally:
        proxy.stop()
    rounds: dict[tuple[str, str], list[int]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in (START, END):
                rounds.setdefault((s.name, s.labels["engine"]), []).append(int(s.labels["round"]))
    newest = list(range(ROUNDS - 256, ROUNDS))
    for engine in ("vllm", "sglang"):
        assert sorted(rounds[START, engine]) == newest
        assert sorted(rounds[END, engine]) == newest[:-1]  # the last round still runs
    run_ids = {d["run_id"] for d in docs}
    assert len(run_ids) == 1 and all(d["scenarios"] == ["s1", "s2"] for d in docs)
    lines = (tmp_path / "run" / "scenarios.jsonl").read_text().splitlines()
    assert len(lines) == ROUNDS and {json.loads(x)["run_id"] for x in lines} == run_ids
