"""``POST /-/scenario`` and the round start/end timestamp gauges (SPEC sections 2 and 16)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.proxy.metrics import ProxyMetrics
from exporter.proxy.records import JsonlWriter
from exporter.proxy.scenarios import MAX_NAME, MAX_ROUNDS, ScenarioBoard

from tests.helpers import make_config, metric_value, samples

ROOT = Path(__file__).resolve().parents[2]
START = "llmbench_scenario_round_start_timestamp_seconds"
END = "llmbench_scenario_round_end_timestamp_seconds"


def _series(text: str, name: str) -> dict[tuple[str, str, str], float]:
    return {(s.labels["engine"], s.labels["scenario"], s.labels["round"]): s.value for s in samples(text, name)}


def _events(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (tmp_path / "run" / "scenarios.jsonl").read_text().splitlines()]


async def test_none_and_null_clear(upstream: Any, proxy_factory: Any, tmp_path: Path) -> None:
    _, server = upstream
    client = await proxy_factory(server.port)
    for clear in ("none", None):
        resp = await client.post("/-/scenario", json={"scenario": "short-c1", "round": 1})
        assert resp.status == 200
        resp = await client.post("/-/scenario", json={"scenario": clear})
        assert resp.status == 200 and (await resp.json())["scenario"] is None
        text = await (await client.get("/metrics")).text()
        assert "llmbench_scenario_info{" not in text
        assert 'scenario="other"' not in "".join(x for x in text.splitlines() if x.startswith("llmbench_scenario"))
    assert [e["scenario"] for e in _events(tmp_path)] == ["short-c1", None, "short-c1", None]


async def test_long_names_refused_and_never_logged(upstream: Any, proxy_factory: Any, tmp_path: Path) -> None:
    _, server = upstream
    client = await proxy_factory(server.port)
    huge = "x" * 500_000
    resp = await client.post("/-/scenario", json={"scenario": huge})
    body = await resp.text()
    assert resp.status == 400 and f"longer than {MAX_NAME}" in body and len(body) < 500
    ok = await client.post("/-/scenario", json={"scenario": "y" * MAX_NAME})
    assert ok.status == 200 and (await ok.json())["scenario"] == "other"
    events = _events(tmp_path)
    assert len(events) == 1 and events[0]["requested"] == "y" * MAX_NAME
    assert max(len(x) for x in (tmp_path / "run" / "scenarios.jsonl").read_text().splitlines()) < 1000
    long_engine = await client.post("/-/scenario", json={"scenario": "short-c1", "engine": huge})
    assert long_engine.status == 400 and len(await long_engine.text()) < 500


async def test_round_start_and_end_timestamps(upstream: Any, proxy_factory: Any) -> None:
    _, server = upstream
    client = await proxy_factory(server.port)
    t0 = time.time()
    await client.post("/-/scenario", json={"scenario": "short-c1", "round": 1})
    text = await (await client.get("/metrics")).text()
    starts = _series(text, START)
    assert set(starts) == {("vllm", "short-c1", "1"), ("sglang", "short-c1", "1")}
    assert all(t0 <= v <= time.time() for v in starts.values())
    assert _series(text, END) == {}  # running: no end yet
    t1 = time.time()
    await client.post("/-/scenario", json={"scenario": "short-c32", "round": 2, "engine": "vllm"})  # replaces
    text = await (await client.get("/metrics")).text()
    ends = _series(text, END)
    assert set(ends) == {("vllm", "short-c1", "1")} and t1 <= ends["vllm", "short-c1", "1"] <= time.time()
    assert ("vllm", "short-c32", "2") in _series(text, START)
    await client.post("/-/scenario", json={"scenario": None})  # clears both engines' rounds
    text = await (await client.get("/metrics")).text()
    assert set(_series(text, END)) == {("vllm", "short-c1", "1"), ("sglang", "short-c1", "1"),
                                       ("vllm", "short-c32", "2")}
    for (engine, scenario, rnd), start in _series(text, START).items():
        assert metric_value(text, END, engine=engine, scenario=scenario, round=rnd) >= start


def test_rounds_bounded_to_the_last_256(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    config = make_config(tmp_path, 1)
    metrics = ProxyMetrics(registry, config)
    board = ScenarioBoard(["s"], ["vllm", "sglang"], metrics, JsonlWriter(tmp_path / "scenarios.jsonl"))
    total = MAX_ROUNDS + 44
    for rnd in range(total):
        board.set("s", rnd)
    board.set(None, 0)
    text = generate_latest(registry).decode()
    starts, ends = _series(text, START), _series(text, END)
    kept = {str(r) for r in range(total - MAX_ROUNDS, total)}
    assert {k[2] for k in starts} == kept and {k[2] for k in ends} == kept
    assert len(starts) == len(ends) == 2 * MAX_ROUNDS  # both engines
    assert len(board.rounds) == MAX_ROUNDS
    # a round run again moves to the newest place and has no end until it ends again
    board.set("s", total - MAX_ROUNDS)
    text = generate_latest(registry).decode()
    assert ("vllm", "s", str(total - MAX_ROUNDS)) not in _series(text, END)
    assert ("vllm", "s", str(total - MAX_ROUNDS)) in _series(text, START)


MULTIPROCESS_SCRIPT = """
import sys
from pathlib import Path
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from exporter.proxy.metrics import ProxyMetrics
from exporter.proxy.records import JsonlWriter
from exporter.proxy.scenarios import ScenarioBoard
from exporter.proxy.config import validate
tmp = Path(sys.argv[1])
config = validate({"engines": [{"name": "e", "upstream": "http://127.0.0.1:9"}], "records_dir": str(tmp)})
board = ScenarioBoard(["s"], ["e"], ProxyMetrics(CollectorRegistry(), config), JsonlWriter(tmp / "s.jsonl"))
board.rounds.limit = 2
for rnd in range(3):
    board.set("s", rnd)
# a second worker (another board) is handed the active round through the shared state, then ends it
other = ScenarioBoard(["s"], ["e"], ProxyMetrics(CollectorRegistry(), config), JsonlWriter(tmp / "s2.jsonl"))
other._active = dict(board._active)
other.set(None, 0)
merged = CollectorRegistry()
MultiProcessCollector(merged)
sys.stdout.write(generate_latest(merged).decode())
"""


@pytest.mark.slow  # a subprocess (the multiprocess mode's values live per process): runs in the full suite
def test_timestamps_in_multiprocess_mode(tmp_path: Path) -> None:
    """Under ``serve --workers N`` the gauges aggregate across workers (mode ``max``)."""
    mp = tmp_path / "mp"
    mp.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(mp)}
    out = subprocess.run([sys.executable, "-c", MULTIPROCESS_SCRIPT, str(tmp_path)], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    starts, ends = _series(out.stdout, START), _series(out.stdout, END)
    assert set(starts) == set(ends) == {("e", "s", str(r)) for r in range(3)}  # cannot remove there: all kept
    assert all(ends[k] >= starts[k] > 1.7e9 for k in starts)
    labels = [s.labels for f in text_string_to_metric_families(out.stdout) for s in f.samples
              if s.name in (START, END)]
    assert labels and all("pid" not in x for x in labels)  # aggregated across workers, not one series each
