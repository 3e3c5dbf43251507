"""``load --endpoint``: the driver sends each endpoint's requests through the proxy to the simulated
engines, and the driver's records and the proxy's agree on every verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from exporter.cli import build_parser
from exporter.harness.endpoints import ENDPOINTS, PATHS, endpoint_body
from exporter.harness.load import Cell, Driver, Plan, Stage
from exporter.harness.sim import build_params, create_sim_app

from tests.helpers import read_records


@pytest.mark.parametrize("profile", ["vllm", "sglang"])
@pytest.mark.parametrize("endpoint", ["responses", "messages", "embeddings", "rerank"])
async def test_driver_drives_each_endpoint(aiohttp_server: Any, proxy_factory: Any, tmp_path: Path,
                                           profile: str, endpoint: str) -> None:
    sim = await aiohttp_server(create_sim_app(build_params(profile, speed=50.0)))
    proxy = await proxy_factory(sim.port)
    cell = Cell("short-c1", input_tokens=12, output_tokens=3, requests=4, concurrency=2, rounds=1)
    async with Driver(str(proxy.make_url(f"/{profile}")), tmp_path / "load", model="m",
                      endpoint=endpoint) as driver:
        await driver.run_plan(Plan([Stage("core", [cell])]))
    mine = [json.loads(line) for line in (tmp_path / "load" / "requests.jsonl").read_text().splitlines()]
    theirs = {r["client_request_id"]: r for r in read_records(tmp_path)}
    assert len(mine) == len(theirs) == 4
    for rec in mine:
        prox = theirs[rec["id"]]
        assert rec["outcome"] == prox["outcome"] == "success", (rec["detail"], prox["detail"])
        assert prox["route"] == PATHS[endpoint]
        if endpoint in ("responses", "messages"):
            assert rec["completion_tokens"] == prox["completion_tokens"] == 3
            assert rec["ttft_s"] is not None and rec["ttfo_s"] is not None


def test_endpoint_option_and_chat_alias() -> None:
    parser = build_parser()
    base = ["load", "--base-url", "http://x/vllm", "--concurrency", "1", "--requests", "1", "--input-tokens", "1",
            "--output-tokens", "1"]
    assert parser.parse_args(base).endpoint == "completions"
    assert parser.parse_args([*base, "--chat"]).endpoint == "chat"
    assert parser.parse_args([*base, "--endpoint", "rerank"]).endpoint == "rerank"
    with pytest.raises(SystemExit):
        parser.parse_args([*base, "--endpoint", "score"])


def test_bodies_fix_the_length_where_the_endpoint_generates() -> None:
    prompt = " ".join(f"w{i}" for i in range(20))
    assert endpoint_body("responses", "m", prompt, 7)["max_output_tokens"] == 7
    assert endpoint_body("messages", "m", prompt, 7)["max_tokens"] == 7
    assert endpoint_body("chat", "m", prompt, 7)["messages"][0]["content"] == prompt
    rerank = endpoint_body("rerank", "m", prompt, 7)
    assert len(rerank["documents"]) == 4 and all(rerank["documents"])
    assert set(ENDPOINTS) == set(PATHS)
    with pytest.raises(ValueError, match="unknown endpoint"):
        endpoint_body("score", "m", prompt, 1)


@pytest.mark.parametrize("extra", [["--sessions", "2", "--turns", "2"], ["--plan", "examples/plans/seed.yaml"]])
def test_other_endpoints_drive_single_requests_only(extra: list[str]) -> None:
    from exporter.harness.load_cli import _plan_from_args
    from exporter.harness.plan import PlanError

    args = build_parser().parse_args(["load", "--base-url", "http://x/vllm", "--input-tokens", "1",
                                      "--output-tokens", "1", "--endpoint", "messages", *extra])
    with pytest.raises(PlanError, match="--endpoint messages drives single requests"):
        _plan_from_args(args)
