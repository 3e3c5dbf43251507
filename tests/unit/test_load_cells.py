"""``load`` tells the proxy what each round measures: the cell (input and output tokens, the load
level, the stage) travels with the round's announcement into ``scenarios.jsonl``, where ``evidence
report`` pivots the core matrix by it without a ``--plan``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from exporter.evidence.report.cells import read_announced
from exporter.harness.load import Cell, Driver, Plan, Stage
from exporter.harness.sim import build_params, create_sim_app


async def test_each_round_announces_its_cell(aiohttp_server: Any, proxy_factory: Any, tmp_path: Path) -> None:
    sim = await aiohttp_server(create_sim_app(build_params("vllm", speed=50.0)))
    proxy = await proxy_factory(sim.port)
    cells = [Cell("short-c1", input_tokens=12, output_tokens=3, requests=2, concurrency=1, rounds=2, warmup=1),
             Cell("short-c32", input_tokens=24, output_tokens=5, requests=2, rate=4.0, rounds=1)]
    async with Driver(str(proxy.make_url("/vllm")), tmp_path / "load", model="m") as driver:
        await driver.run_plan(Plan([Stage("core", cells)]))
    lines = [json.loads(x) for x in (tmp_path / "run" / "scenarios.jsonl").read_text().splitlines()]
    told = [(x["scenario"], x["cell"]) for x in lines if x.get("event") == "cell"]
    assert [s for s, c in told if not c["warmup"]] == ["short-c1", "short-c1", "short-c32"]  # every round
    assert told[0][1] == {"input_tokens": 12, "output_tokens": 3, "concurrency": 1, "rate": None, "stage": "core",
                          "warmup": False}
    got = read_announced([tmp_path / "run"])
    c1, c32 = got["short-c1"], got["short-c32"]
    assert (c1.input_tokens, c1.output_tokens, c1.concurrency, c1.rate, c1.stage) == (12, 3, 1, None, "core")
    assert (c32.input_tokens, c32.output_tokens, c32.concurrency, c32.rate) == (24, 5, None, 4.0)
