"""Every output names what was measured: ``evidence summarize``'s summary.json and ``evidence
export``'s manifest carry the engines (from ``engines.jsonl``) and the proxy (version, config
SHA-256, runs); an engine whose version changed inside a run is a ``warning:``; the boards mark an
engine's downs and ups."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dashboards.boards import build_all
from exporter.evidence.cli import main as evidence
from exporter.evidence.identity import for_window, identity
from exporter.proxy.engines import REDACTED

RUN, OTHER = "20260101T000000Z-aaaaaa", "20260102T000000Z-bbbbbb"
SHA = "cd" * 32


def _rec(i: int, run: str, engine: str, t: float) -> dict[str, Any]:
    return {"id": f"{run}-{engine}-{i}", "run_id": run, "engine": engine, "scenario": "short-c1", "round": 1,
            "start_unix": t, "outcome": "success", "reason": None, "ttft_s": 0.1, "tpot_s": 0.01, "e2e_s": 0.5,
            "prompt_tokens": 8, "completion_tokens": 8, "slo": {"ttft_s": 3.0, "tpot_s": 0.05}}


def _dir(tmp_path: Path) -> Path:
    d = tmp_path / "records"
    d.mkdir()
    t0 = 1_767_225_600.0
    recs = [_rec(i, RUN, "vllm", t0 + i) for i in range(6)]
    recs += [_rec(i, OTHER, "vllm", t0 + 90_000 + i) for i in range(3)]
    (d / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    ident = {"event": "identity", "engine": "vllm", "kind": "vllm", "model": "m", "root": "/m", "max_model_len": 8,
             "server_args": {"vllm_config": {"api_key": "sk-LEAK"}}}
    lines = [{"event": "start", "run_id": RUN, "unix": t0 - 10, "proxy": {"version": "0.1.0", "config_sha256": SHA}},
             {**ident, "run_id": RUN, "unix": t0 - 9, "version": "0.11.0"},
             {"event": "down", "run_id": RUN, "engine": "vllm", "unix": t0 + 2.5, "detail": "refused"},
             {"event": "up", "run_id": RUN, "engine": "vllm", "unix": t0 + 2.9, "seen_down": True,
              "time_to_ready_s": 0.4},
             {**ident, "run_id": RUN, "unix": t0 + 2.95, "version": "0.11.1"},
             {"event": "start", "run_id": OTHER, "unix": t0 + 89_000, "proxy": {"version": "0.1.0",
                                                                                "config_sha256": "ef" * 32}},
             {**ident, "run_id": OTHER, "unix": t0 + 89_001, "version": "0.11.1"}]
    (d / "engines.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return d


def test_summary_names_engines_and_proxy_and_warns_of_a_new_version(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    d = _dir(tmp_path)
    assert evidence(["summarize", "--records", str(d), "--run", RUN, "--out", str(tmp_path / "s")]) == 0
    err = capsys.readouterr().err
    assert "warning: engine vllm changed version inside run " + RUN + ": 0.11.0 -> 0.11.1" in err
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["proxy"] == {"version": "0.1.0", "config_sha256": SHA, "run_ids": [RUN]}
    assert [(e["version"], e["downs"], e["ups"]) for e in summary["engines"]] == [("0.11.0", 1, 1), ("0.11.1", 0, 0)]
    assert summary["engines"][0]["time_to_ready_s"] == [0.4]
    assert summary["engines"][0]["server_args"]["vllm_config"]["api_key"] == REDACTED
    assert "sk-LEAK" not in (tmp_path / "s" / "summary.json").read_text()
    assert any(w.startswith("warning: engine vllm changed version") for w in summary["warnings"])


def test_runs_never_mix_and_differing_configs_are_listed(tmp_path: Path) -> None:
    d = _dir(tmp_path)
    other = identity([d], [OTHER])
    assert [e["run_id"] for e in other["engines"]] == [OTHER] and other["warnings"] == []
    both = identity([d / "requests.jsonl"], [RUN, OTHER])  # the file's directory
    assert both["proxy"]["config_sha256"] == [SHA, "ef" * 32] and both["proxy"]["version"] == "0.1.0"


def test_an_export_window_names_the_runs_inside_it(tmp_path: Path) -> None:
    d = _dir(tmp_path)
    t0 = 1_767_225_600.0
    found = for_window(d, t0, t0 + 10)
    assert found["proxy"]["run_ids"] == [RUN] and {e["version"] for e in found["engines"]} == {"0.11.0", "0.11.1"}
    assert for_window(d, t0 + 89_990, t0 + 90_010)["proxy"]["run_ids"] == [OTHER]

    class Prom:  # no records: the engines from llmbench_engine_info, the proxy from llmbench_proxy_info
        def query(self, expr: str, at: float) -> list[dict[str, Any]]:
            assert 'job="j"' in expr
            if "llmbench_proxy_info" in expr:  # two proxies of one version and config, three runs
                return [{"metric": {"version": "0.1.0", "config_sha256": SHA, "run_id": run}, "value": [at, "1"]}
                        for run in (OTHER, RUN, OTHER + "x")]
            assert "llmbench_engine_info" in expr
            labels = {"engine": "vllm", "kind": "vllm", "version": "0.11.0", "model": "m"}
            return [{"metric": labels, "value": [at, "1"]}]
    found = for_window(None, t0, t0 + 10, Prom(), "j")
    assert found["engines"] == [
        {"name": "vllm", "kind": "vllm", "version": "0.11.0", "model": "m", "source": "prometheus"}]
    assert found["proxy"] == {"version": "0.1.0", "config_sha256": SHA, "run_ids": [RUN, OTHER, OTHER + "x"]}


def test_boards_mark_an_engine_going_down_and_coming_back() -> None:
    boards = build_all()
    for name in ("comparison", "internals"):
        ann = {a["name"]: a for a in boards[name]["annotations"]["list"] if a.get("expr")}
        down, up = ann["Engine down"], ann["Engine back up"]
        assert "llmbench_engine_up{" in down["expr"] and down["expr"].endswith("== 0")
        assert "min_over_time(llmbench_engine_up{" in up["expr"]
        for a in (down, up):
            assert a["useValueForTime"] is False and a["tagKeys"] == "engine" and "{{engine}}" in a["titleFormat"]
    retargeted = build_all("other-job")["comparison"]["annotations"]["list"]
    assert all('job="other-job"' in a["expr"] for a in retargeted if a.get("expr"))
