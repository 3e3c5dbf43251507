"""``evidence report --format llm-d``: one llm-d Benchmark Report 0.2.1 per run, engine, scenario and
round; each validates against the published JSON schema, its counts and latencies are the
records' (and the summary's), the engine is named as it said it was, and no secret is written."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from exporter.evidence.cli import main as evidence
from exporter.evidence.llmd import PERCENTILES
from exporter.evidence.summarize import summarize
from exporter.harness.sim import create_sim_app
from exporter.harness.sim_engine import PROFILES
from exporter.harness.sim_identity import sim_version
from exporter.proxy.app import create_app
from exporter.proxy.engines import REDACTED

from tests.helpers import AppOnPort, eventually, make_config

ROOT = Path(__file__).resolve().parents[2]
#: the published schema (a copy for tests lives beside the repository, never in it)
SCHEMA = Path(os.environ.get("LLMBENCH_LLMD_SCHEMA", ROOT.parent / "shared" / "reference" / "llm-d-benchmark-report"
                             / "br_v0_2_1_json_schema.json"))
SECRET = "sk-live-SECRET-7"
RUN = "20260101T000000Z-abc123"


def _validator() -> Any:
    import jsonschema

    if not SCHEMA.exists():
        pytest.skip(f"no llm-d schema at {SCHEMA} (set LLMBENCH_LLMD_SCHEMA)")
    schema = json.loads(SCHEMA.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _record(i: int, engine: str, scenario: str, rnd: int, t: float, rng: random.Random, outcome: str) -> dict[str, Any]:
    ok = outcome == "success"
    ttft = rng.uniform(0.05, 0.5)
    return {"id": f"{engine}-{scenario}-{rnd}-{i}", "run_id": RUN, "engine": engine, "scenario": scenario,
            "round": rnd, "start_unix": t, "outcome": outcome,
            "reason": None if ok else ("client_abort" if outcome == "client_abort" else "upstream_disconnect"),
            "status": 200, "ttft_s": ttft if ok else None, "tpot_s": rng.uniform(0.01, 0.03) if ok else None,
            "e2e_s": ttft + rng.uniform(0.5, 1.5), "prompt_tokens": 128 + rng.randrange(3), "completion_tokens":
            32 if ok else None, "expected_tokens": 32, "timing_uncertainty_s": rng.uniform(0, 0.001),
            "slo": {"ttft_s": 3.0, "tpot_s": 0.05}, "client_backpressure_s": 0.0, "client_bound": False}


def _records_dir(tmp_path: Path) -> Path:
    rng = random.Random(5)
    d = tmp_path / "records"
    d.mkdir()
    t0 = 1_767_225_600.0
    records, t = [], t0
    outcomes = ["success"] * 9 + ["failure", "client_abort"]
    for engine in ("sglang", "vllm"):
        for rnd in (1, 2):
            for i in range(24):
                records.append(_record(i, engine, "short-c4", rnd, t, rng, rng.choice(outcomes)))
                t += 0.25
            t += 5
    (d / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    sglang_args = {"model_path": "/w/qwen", "tp_size": 2, "dp_size": 1, "api_key": REDACTED,
                   "admin_api_key": REDACTED}
    lines = [
        {"event": "start", "run_id": RUN, "unix": t0 - 60, "proxy": {"version": "0.1.0", "config_sha256": "ab" * 32},
         "engines": [{"name": "sglang"}, {"name": "vllm"}]},
        {"event": "up", "run_id": RUN, "engine": "sglang", "unix": t0 - 59, "seen_down": False},
        {"event": "identity", "run_id": RUN, "engine": "sglang", "unix": t0 - 59, "kind": "sglang",
         "version": "0.5.4", "model": "qwen", "root": "/w/qwen", "max_model_len": 4096,
         "server_args": {**sglang_args, "nested": {"hf_token": SECRET}}, "upstream": "http://127.0.0.1:30000"},
        {"event": "identity", "run_id": RUN, "engine": "vllm", "unix": t0 - 58, "kind": "vllm", "version": "0.11.0",
         "model": "qwen", "root": "/w/qwen", "max_model_len": 4096, "server_args": None},
        # vLLM goes down and comes back during its second round
        {"event": "down", "run_id": RUN, "engine": "vllm", "unix": records[-10]["start_unix"], "detail": "refused"},
        {"event": "up", "run_id": RUN, "engine": "vllm", "unix": records[-3]["start_unix"], "seen_down": True,
         "ready_at": records[-3]["start_unix"], "time_to_ready_s": 1.75, "ready_from": "down_seen"},
    ]
    (d / "engines.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return d


def test_one_valid_report_per_round_with_the_records_figures(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    validator = _validator()
    records_dir = _records_dir(tmp_path)
    out = tmp_path / "llmd"
    assert evidence(["report", "--format", "llm-d", "--records", str(records_dir), "--out", str(out)]) == 0
    assert "4 llm-d benchmark reports" in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == sorted([*(r["path"] for r in manifest["reports"]), "manifest.json"])
    assert manifest["proxy"] == {"version": "0.1.0", "config_sha256": "ab" * 32, "run_ids": [RUN]}
    records = [json.loads(x) for x in (records_dir / "requests.jsonl").read_text().splitlines()]
    summary = summarize(records)
    rows = {(r["engine"], r["round"]): r for r in summary["rounds"]}
    for entry in manifest["reports"]:
        data = (out / entry["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        report = json.loads(data)
        errors = sorted(validator.iter_errors(report), key=str)
        assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]]
        assert SECRET not in data.decode()
        _same_as_records(report, [r for r in records if (r["engine"], r["round"]) == (entry["engine"], entry["round"])],
                         rows[(entry["engine"], entry["round"])])


def _same_as_records(report: dict[str, Any], recs: list[dict[str, Any]], row: dict[str, Any]) -> None:
    from exporter.core.stats import percentile

    agg = report["results"]["request_performance"]["aggregate"]
    ok = [r for r in recs if r["outcome"] == "success"]
    assert agg["requests"]["total"] == len(recs) == row["requests"]
    assert agg["requests"]["failures"] == sum(r["outcome"] == "failure" for r in recs)
    assert agg["requests"]["incomplete"] == sum(r["outcome"] == "client_abort" for r in recs)
    assert agg["requests"]["failures"] + agg["requests"]["incomplete"] == row["failures"]
    ttft = agg["latency"]["time_to_first_token"]
    assert (ttft["p50"], ttft["p95"]) == (row["ttft_p50_s"], row["ttft_p95_s"]) and ttft["units"] == "s"
    for key, q in PERCENTILES.items():
        assert ttft[key] == percentile([r["ttft_s"] for r in ok], q)
    assert agg["latency"]["request_latency"]["p95"] == row["e2e_p95_s"]
    assert agg["latency"]["time_per_output_token"]["p95"] == row["tpot_p95_s"]
    assert agg["throughput"]["output_token_rate"]["mean"] == pytest.approx(row["output_throughput_tok_s"], rel=1e-12)


def test_the_engine_as_it_said_it_was_and_its_restarts(tmp_path: Path) -> None:
    records_dir = _records_dir(tmp_path)
    out = tmp_path / "llmd"
    assert evidence(["report", "--format", "llm-d", "--records", str(records_dir), "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    reports = {(e["engine"], e["round"]): json.loads((out / e["path"]).read_text()) for e in manifest["reports"]}
    sglang = reports[("sglang", 1)]["scenario"]["stack"][0]
    assert sglang["standardized"]["kind"] == "inference_engine"
    assert (sglang["standardized"]["tool"], sglang["standardized"]["tool_version"]) == ("sglang", "0.5.4")
    assert sglang["standardized"]["accelerator"]["parallelism"]["tp"] == 2
    args = sglang["native"]["args"]
    assert args["api_key"] == REDACTED and args["nested"]["hf_token"] == REDACTED
    proxy = reports[("sglang", 1)]["scenario"]["stack"][1]
    assert (proxy["standardized"]["tool"], proxy["metadata"]["cfg_id"]) == ("llm-bench-exporter", "ab" * 32)
    load = reports[("vllm", 2)]["scenario"]["load"]
    assert load["standardized"]["output_seq_len"] == {"distribution": "fixed", "value": 32.0, "min": 32, "max": 32}
    assert load["native"]["config"]["measured_load"]["load_verdict"]
    health = {(k, r["results"]["component_health"][0]["total_restarts"]) for k, r in reports.items()}
    assert health == {(("sglang", 1), 0), (("sglang", 2), 0), (("vllm", 1), 0), (("vllm", 2), 1)}
    starts = reports[("vllm", 2)]["results"]["observability"]["pod_startup_times"]["pods"]
    assert [p["startup_seconds"] for p in starts] == [1.75]
    assert reports[("vllm", 1)]["run"]["eid"] == RUN and len({r["run"]["uid"] for r in reports.values()}) == 4


def test_a_non_empty_out_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records_dir = _records_dir(tmp_path)
    out = tmp_path / "llmd"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    assert evidence(["report", "--format", "llm-d", "--records", str(records_dir), "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err and (out / "keep.txt").exists()


async def test_reports_of_a_run_against_the_simulators_name_them(unused_tcp_port_factory: Any, aiohttp_client: Any,
                                                                 tmp_path: Path) -> None:
    """Through the proxy to both simulated engines: each report names the simulator's version and
    arguments (what the demo's reports show)."""
    validator = _validator()
    sims = {p: await AppOnPort(functools.partial(create_sim_app, PROFILES[p]), unused_tcp_port_factory()).start()
            for p in ("vllm", "sglang")}
    try:
        config = make_config(tmp_path, 1, engines=[{"name": n, "upstream": f"http://127.0.0.1:{e.port}"}
                                                   for n, e in sims.items()])
        client = await aiohttp_client(create_app(config))
        await eventually(lambda: _identified(client))
        req = {"model": "m", "prompt": "a b c", "max_tokens": 3, "ignore_eos": True, "stream": True,
               "stream_options": {"include_usage": True}}
        for engine in sims:
            for _ in range(3):
                resp = await client.post(f"/{engine}/v1/completions", json=req,
                                         headers={"X-Bench-Scenario": "short-c1", "X-Bench-Round": "1"})
                await resp.read()
        await asyncio.sleep(0.2)
    finally:
        for e in sims.values():
            await e.stop()
    out = tmp_path / "llmd"
    assert evidence(["report", "--format", "llm-d", "--records", str(tmp_path / "run"), "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert {e["name"]: e["version"] for e in manifest["engines"]} == {"vllm": sim_version(), "sglang": sim_version()}
    for entry in manifest["reports"]:
        report = json.loads((out / entry["path"]).read_text())
        assert not list(validator.iter_errors(report))
        engine = report["scenario"]["stack"][0]
        tool = engine["standardized"]
        assert (tool["tool"], tool["tool_version"]) == (entry["engine"], sim_version())
        assert engine["native"]["args"]  # the simulator's arguments
        assert report["results"]["request_performance"]["aggregate"]["requests"]["total"] == 3


async def _identified(client: Any) -> bool:
    doc = await (await client.get("/-/engines")).json()
    return all(e["kind"] != "unknown" for e in doc["engines"])


def test_the_model_files_checked_ride_along(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from exporter.cli import main as llm_bench_exporter

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    doc = tmp_path / "model.json"
    assert llm_bench_exporter(["model-check", str(model), "--out", str(doc)]) == 0
    out = tmp_path / "llmd"
    assert evidence(["report", "--format", "llm-d", "--records", str(_records_dir(tmp_path)), "--out", str(out),
                     "--model", str(doc)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"]["document_sha256"] == hashlib.sha256(doc.read_bytes()).hexdigest()
    assert [f["path"] for f in manifest["model"]["files"]] == ["config.json"]
    (tmp_path / "bad.json").write_text("{}")
    assert evidence(["report", "--format", "llm-d", "--records", str(tmp_path / "records"),
                     "--out", str(tmp_path / "o2"), "--model", str(tmp_path / "bad.json")]) == 2
    assert "not a document of llm-bench-exporter model-check" in capsys.readouterr().err
