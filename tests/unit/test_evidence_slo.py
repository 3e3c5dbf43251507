"""The SLO travels with the request: the live counters, the records and ``evidence summarize``
judge the same requests the same way, through the real proxy with ``slo_by_scenario``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from exporter.evidence.cli import main as evidence_main

from ..helpers import OK_EVENTS, metric_value, stream_events, wait_for_records

SLO_BY_SCENARIO = {"s2": {"ttft_s": 0.001}}


async def _slow_first_event(request: web.Request) -> web.StreamResponse:
    """Each event 10 ms after the last one: a TTFT above 1 ms, a TPOT far below 50 ms."""
    return await stream_events(request, [f"data: {e}\n\n".encode() for e in OK_EVENTS], delay=0.01)


def _goodput(summary: dict[str, Any]) -> dict[str, float]:
    return {m["scenario"]: m["goodput_ratio"] for m in summary["medians"]}


def _summarize(records: Path, out: Path, *extra: str) -> dict[str, Any]:
    assert evidence_main(["summarize", "--records", str(records), "--out", str(out), *extra]) == 0
    return json.loads((out / "summary.json").read_text())


async def test_summarize_judges_each_record_by_its_own_slo(upstream: Any, proxy_factory: Any, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    up, server = upstream
    up.handler = _slow_first_event
    client = await proxy_factory(server.port, scenarios=["s1", "s2"], slo_by_scenario=SLO_BY_SCENARIO)
    for scenario in ("s1", "s2", "s1", "s2", "s2"):
        async with client.post("/vllm/v1/completions", headers={"X-Bench-Scenario": scenario},
                               json={"prompt": "hi", "stream": True, "max_tokens": 2}) as resp:
            assert resp.status == 200
            await resp.read()
    records = await wait_for_records(tmp_path, 5)
    metrics = await (await client.get("/metrics")).text()
    live_met = {s: metric_value(metrics, "llmbench_slo_requests_total", scenario=s, result="met") for s in ("s1", "s2")}
    assert live_met == {"s1": 2, "s2": 0}
    s = _summarize(tmp_path / "run", tmp_path / "own")
    assert _goodput(s) == {"s1": 1.0, "s2": 0.0}  # as the live counters say
    assert s["slo_source"]["own"] == 5 and s["slo_source"]["fallback"] == 0
    assert "own slo (5 records)" in (tmp_path / "own" / "summary.md").read_text()

    # the same requests written by an older proxy: no slo in the records
    old = tmp_path / "old"
    old.mkdir()
    (old / "requests.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k not in ("slo", "slo_result")})
                                                + "\n" for r in records))
    s = _summarize(old, tmp_path / "default")
    assert _goodput(s) == {"s1": 1.0, "s2": 1.0} and "default SLO" in s["slo_source"]["text"]
    config = tmp_path / "proxy.yaml"
    config.write_text(json.dumps({"engines": [{"name": "vllm", "upstream": "http://127.0.0.1:1"}],
                                  "scenarios": ["s1", "s2"], "slo_by_scenario": SLO_BY_SCENARIO}))
    s = _summarize(old, tmp_path / "config", "--config", str(config))
    assert _goodput(s) == {"s1": 1.0, "s2": 0.0} and str(config) in s["slo_source"]["text"]
    capsys.readouterr()
    config.write_text("engines: []\n")
    assert evidence_main(["summarize", "--records", str(old), "--config", str(config)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
