"""evidence export / decode / summarize, against the real Prometheus fed by the real exporter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from exporter.evidence.cli import main as evidence_main
from exporter.evidence.decode import decode_capture
from exporter.evidence.promapi import Prometheus
from exporter.evidence.windows import WindowError, parse_window
from exporter.harness.sim import FAULTS, build_params, create_sim_app

from tests.helpers import INTENDED, read_records


def test_export_unreachable_prometheus(tmp_path: Path, capsys: pytest.CaptureFixture[str], unused_tcp_port: int) -> None:
    rc = evidence_main(["export", "--prometheus", f"http://127.0.0.1:{unused_tcp_port}", "--window", "last:5m",
                        "--out", str(tmp_path)])
    assert rc == 2 and "cannot reach Prometheus" in capsys.readouterr().err


@pytest.mark.parametrize("fault", [f for f in FAULTS if f != "slow_first_byte"])
async def test_decode_reproduces_proxy_verdict(aiohttp_server: Any, proxy_factory: Any, tmp_path: Path, fault: str) -> None:
    sim = await aiohttp_server(create_sim_app(build_params("sglang", speed=50.0)))
    proxy = await proxy_factory(sim.port, capture_raw_sse="all")
    body = {"model": "m", "prompt": "a b c", "max_tokens": 5, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    resp = await proxy.post("/sglang/v1/completions", json=body, headers={"X-Sim-Fault": fault})
    if fault == "disconnect":  # the proxy cuts the client's stream where the engine cut its own
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()
    else:
        await resp.read()
        assert resp.status == {"http_500": 500, "http_503": 503}.get(fault, 200)
    rec, = read_records(tmp_path)
    assert rec["reason"] == INTENDED[fault]
    result = decode_capture(Path(rec["capture"]))
    assert (result["verdict"], result["reason"]) == (rec["outcome"], rec["reason"])
    assert result["ok"] and result["sha256"] == rec["capture_sha256"] and result["record_sha256_ok"]
    assert result["completion_tokens"] == rec["completion_tokens"] and result["visible_chars"] == rec["visible_chars"]


@pytest.mark.slow  # a subprocess: runs in the full suite
async def test_decode_success_and_broken_captures(aiohttp_server: Any, proxy_factory: Any, tmp_path: Path) -> None:
    sim = await aiohttp_server(create_sim_app(build_params("vllm", speed=50.0)))
    proxy = await proxy_factory(sim.port, capture_raw_sse="all")
    body = {"prompt": "a b", "max_tokens": 4, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    await (await proxy.post("/vllm/v1/completions", json=body)).read()
    rec, = read_records(tmp_path)
    ok = decode_capture(Path(rec["capture"]))
    assert ok["verdict"] == "success" and ok["done"] and ok["usage"] and abs(ok["ttft_s"] - rec["ttft_s"]) < 1e-3
    sse = Path(rec["capture"])
    truncated = tmp_path / "t.sse"
    truncated.write_bytes(sse.read_bytes()[:-len(b"data: [DONE]\n\n")])
    (tmp_path / "t.json").write_text(sse.with_suffix(".json").read_text())
    corrupt = tmp_path / "c.json"
    corrupt.write_text("{not json")
    (tmp_path / "c.sse").write_bytes(b"")
    proc = subprocess.run([sys.executable, "-m", "exporter.evidence", "decode", str(sse), str(truncated),
                           str(corrupt), str(tmp_path / "missing.sse"), "--json"], capture_output=True, text=True, timeout=60)
    # two of them are not readable captures: the user's mistake, exit 2 (a failed check alone is 1)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    rows = json.loads(proc.stdout)
    assert rows[0]["ok"] and rows[0]["verdict"] == "success"
    assert not rows[1]["ok"] and rows[1]["reason"] == "missing_done" and not rows[1]["sha256_ok"]
    assert any("truncated" in p for p in rows[1]["problems"])
    assert rows[2]["verdict"] == "unreadable" and "not valid JSON" in rows[2]["reason"]
    assert rows[3]["verdict"] == "unreadable" and "not found" in rows[3]["reason"]


def _rec(engine: str, scenario: str, rnd: int, start: float, e2e: float, ttft: float | None, tpot: float | None,
         tokens: int = 128, outcome: str = "success", reason: str | None = None) -> dict[str, Any]:
    return {"engine": engine, "scenario": scenario, "round": rnd, "start_unix": start, "e2e_s": e2e, "ttft_s": ttft,
            "tpot_s": tpot, "completion_tokens": tokens, "outcome": outcome, "reason": reason}


def test_summarize_hand_computed(tmp_path: Path) -> None:
    recs = [
        # round 1: 4 requests over [0, 10] s, one empty_text failure -> 3 x 128 tokens / 10 s
        _rec("vllm", "s", 1, 0.0, 4.0, 1.0, 0.010),
        _rec("vllm", "s", 1, 1.0, 5.0, 2.0, 0.020),
        _rec("vllm", "s", 1, 2.0, 6.0, 4.0, 0.060),
        _rec("vllm", "s", 1, 3.0, 7.0, None, None, outcome="failure", reason="empty_text"),
        # round 2: 2 successes over [100, 104] s
        _rec("vllm", "s", 2, 100.0, 2.0, 0.5, 0.010),
        _rec("vllm", "s", 2, 102.0, 2.0, 1.5, 0.030),
        # round 3: 1 success over [200, 201] s
        _rec("vllm", "s", 3, 200.0, 1.0, 0.2, 0.005),
        _rec("vllm", "warmup", 0, 300.0, 1.0, 0.2, 0.005),  # warm-up is left out
    ]
    (tmp_path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert evidence_main(["summarize", "--records", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    r1, r2, r3 = s["rounds"]
    assert (r1["success"], r1["requests"], r1["failure_reasons"]) == (3, 4, {"empty_text": 1})
    assert r1["duration_s"] == 10.0 and r1["output_throughput_tok_s"] == pytest.approx(38.4)
    assert r1["ttft_p50_s"] == 2.0 and r1["ttft_p95_s"] == pytest.approx(2.0 + 0.9 * 2.0)  # (n-1)q = 1.9
    assert r1["tpot_p95_s"] == pytest.approx(0.020 + 0.9 * 0.040)
    assert r1["e2e_p95_s"] == pytest.approx(5.0 + 0.9 * 1.0)
    assert r1["goodput_ratio"] == pytest.approx(2 / 4)  # TTFT 4 s misses, the failure misses
    assert "slo_attainment" not in r1  # one name per figure: goodput_ratio
    assert r2["output_throughput_tok_s"] == pytest.approx(256 / 4.0) and r3["output_throughput_tok_s"] == 128.0
    m, = s["medians"]
    assert (m["rounds"], m["success"], m["requests"]) == (3, 6, 7)
    assert m["output_throughput_tok_s"] == pytest.approx(64.0)  # median of 38.4, 64, 128
    assert m["ttft_p95_s"] == pytest.approx(1.45)  # median of 3.8, 1.45, 0.2
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "| vllm | s | 3 | 6 | 7 |" in md
    assert (tmp_path / "out" / "rounds.csv").read_text().count("\n") == 4


def test_grid_ends_on_the_window_end_and_step_notes() -> None:
    from exporter.evidence.export import DEFAULT_STEP_S, ExportError, choose_step, grid_start
    from exporter.evidence.windows import Window

    w = Window(1000.0, 1047.0, "1000,1047")
    assert grid_start(w, 5.0) == 1002.0  # 1002, 1007, ..., 1047
    assert grid_start(Window(0.0, 60.0, "x"), 15.0) == 0.0
    step, note = choose_step(w, None, None)
    assert step == DEFAULT_STEP_S and "does not report its scrape interval" in note
    assert choose_step(w, 5.0, None) == (5.0, "default: ~1500 points, not below the scrape interval 5 s")
    assert choose_step(w, 5.0, 2.0) == (2.0, "--step")
    with pytest.raises(ExportError, match="positive"):
        choose_step(w, None, float("inf"))


def test_prometheus_client_headers_token_and_printable_url(monkeypatch: pytest.MonkeyPatch) -> None:
    from exporter.evidence.promapi import TOKEN_ENV, parse_header

    assert parse_header("X-Scope-OrgID: team-a") == ("X-Scope-OrgID", "team-a")
    for bad in ("no-colon", ": value", "bad name:v"):
        with pytest.raises(ValueError, match="NAME:VALUE"):
            parse_header(bad)
    monkeypatch.setenv(TOKEN_ENV, "tok-123")
    prom = Prometheus("https://user:pw@mimir.example/prometheus/", headers={"X-Scope-OrgID": "a"})
    assert prom.url == "https://mimir.example/prometheus"
    assert prom.session.headers["Authorization"] == "Bearer tok-123" and prom.session.headers["X-Scope-OrgID"] == "a"
    assert "tok-123" not in repr(prom.header_names) and "X-Scope-OrgID" in prom.header_names
    monkeypatch.delenv(TOKEN_ENV)
    assert "Authorization" not in Prometheus("http://h").session.headers


def test_last_zero_is_refused() -> None:
    with pytest.raises(WindowError, match="empty window"):
        parse_window("last:0m")
