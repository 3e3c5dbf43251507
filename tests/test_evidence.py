"""evidence export / decode / summarize, against the real Prometheus fed by the real exporter."""

from __future__ import annotations

import http.server
import json
import math
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import matplotlib.image as mpimg
import pytest

from dashboards.catalogue import BOARDS
from dashboards.decode import decode_capture
from dashboards.evidence import main as evidence_main
from dashboards.export import GRAFANA_TOKEN_ENV, verify_manifest
from dashboards.promapi import Prometheus
from dashboards.render import png_size
from dashboards.summarize import summarize
from dashboards.windows import WindowError, parse_window
from exporter.sim import FAULTS, build_params, create_sim_app

from .conftest import read_records
from .test_sim_load import INTENDED


def _window(stack: Any) -> str:
    return f"{stack.start:.0f},{stack.end:.0f}"


def test_export_writes_every_file_and_the_manifest_verifies(live_stack: Any, tmp_path: Path) -> None:
    out = tmp_path / "ev"
    assert evidence_main(["export", "--prometheus", live_stack.prom, "--window", _window(live_stack), "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    listed = {f["path"] for f in manifest["files"]}
    for board, spec in BOARDS.items():
        assert f"{board}.png" in listed
        for panel in spec.panels:
            assert {f"data/{board}/{panel.key}.csv", f"data/{board}/{panel.key}.json"} <= listed
    assert "EVIDENCE.md" in listed
    assert {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()} == listed | {"manifest.json"}
    assert verify_manifest(out) == []
    assert manifest["prometheus"]["buildinfo"]["version"] and manifest["version"]
    assert manifest["window"]["start"] == float(_window(live_stack).split(",")[0])
    (out / "data/comparison/ttft_p95.csv").write_text("tampered")
    assert verify_manifest(out) == ["data/comparison/ttft_p95.csv"]
    md = (out / "EVIDENCE.md").read_text()
    assert "histogram_quantile(0.95, sum by (engine, le) (rate(llmbench_time_to_first_token_seconds_bucket[1m])))" in md
    assert manifest["window"]["start_utc"] in md and "| series | points | NaN |" in md
    ttft = json.loads((out / "data/comparison/ttft_p95.json").read_text())
    assert {s["name"] for s in ttft["queries"][0]["series"]} == {"sglang", "vllm"}
    for board, spec in BOARDS.items():
        img = mpimg.imread(out / f"{board}.png")
        assert (img.shape[1], img.shape[0]) == png_size(spec)
        assert len({tuple(px) for px in img.reshape(-1, img.shape[2])[::97]}) > 20  # not a blank image


def test_scenario_windows_resolve(live_stack: Any) -> None:
    events = [json.loads(x) for x in (live_stack.records / "scenarios.jsonl").read_text().splitlines()]
    i = next(i for i, e in enumerate(events) if e["scenario"] == "short-c8" and e["round"] == 2 and e["engines"] == ["vllm"])
    start, end = events[i]["unix"], events[i + 1]["unix"]
    from_records = parse_window("scenario:short-c8#2", records=live_stack.records)
    # both engines ran short-c8 round 2: the records give the span of both, exactly
    sg = next(e for e in events if e["scenario"] == "short-c8" and e["round"] == 2 and e["engines"] == ["sglang"])
    assert from_records.start == sg["unix"] and from_records.end == end
    prom = Prometheus(live_stack.prom)
    w = parse_window('scenario:short-c8#2', prom=prom)
    assert abs(w.start - sg["unix"]) <= 6 and abs(w.end - end) <= 6  # within a scrape interval
    with pytest.raises(WindowError, match="unknown scenario"):
        parse_window("scenario:nope", prom=prom)
    with pytest.raises(WindowError, match="unknown scenario"):
        parse_window("scenario:short-c8#9", records=live_stack.records)
    assert start < end


@pytest.mark.parametrize("args, message", [
    (["--window", "last:30"], "not a duration"),
    (["--window", "yesterday"], "bad window"),
    (["--window", "2026-01-01T00:00:00,2026-01-01T01:00:00"], "no timezone"),
    (["--window", "978307200,978310800"], "no data in the window"),
    (["--window", "scenario:never-ran"], "unknown scenario"),
    (["--window", "last:7d", "--step", "1"], "Prometheus allows 11000"),
])
def test_export_errors(live_stack: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    rc = evidence_main(["export", "--prometheus", live_stack.prom, "--out", str(tmp_path / "x"), *args])
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_export_unreachable_prometheus(tmp_path: Path, capsys: pytest.CaptureFixture[str], unused_tcp_port: int) -> None:
    rc = evidence_main(["export", "--prometheus", f"http://127.0.0.1:{unused_tcp_port}", "--window", "last:5m",
                        "--out", str(tmp_path)])
    assert rc == 2 and "cannot reach Prometheus" in capsys.readouterr().err


class _FakeGrafana(http.server.BaseHTTPRequestHandler):
    """Stands in for Grafana's /render (Grafana does not run on CI machines)."""

    seen: list[tuple[str, str | None]] = []
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64

    def do_GET(self) -> None:  # noqa: N802
        self.seen.append((self.path, self.headers.get("Authorization")))
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.end_headers()
        self.wfile.write(self.png)

    def log_message(self, *args: Any) -> None:
        pass


def test_export_fetches_grafana_pngs_without_keeping_the_token(live_stack: Any, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), _FakeGrafana)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = "glsa_SECRET_token_123"
    out = tmp_path / "ev"
    try:
        monkeypatch.delenv(GRAFANA_TOKEN_ENV, raising=False)
        args = ["export", "--prometheus", live_stack.prom, "--window", _window(live_stack), "--out", str(out),
                "--boards", "comparison", "--grafana", f"http://127.0.0.1:{server.server_port}"]
        assert evidence_main(args) == 2  # no token in the environment
        monkeypatch.setenv(GRAFANA_TOKEN_ENV, token)
        assert evidence_main(args) == 0
    finally:
        server.shutdown()
    pngs = sorted((out / "grafana").glob("*.png"))
    assert len(pngs) == len(BOARDS["comparison"].panels)
    path, auth = _FakeGrafana.seen[0]
    assert path.startswith(f"/render/d-solo/{BOARDS['comparison'].uid}/") and "theme=light" in path
    assert "from=" in path and "panelId=" in path and auth == f"Bearer {token}"
    for p in out.rglob("*"):
        if p.is_file():
            assert token.encode() not in p.read_bytes()
    assert verify_manifest(out) == []


# -- decode ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("fault", [f for f in FAULTS if f != "slow_first_byte"])
async def test_decode_reproduces_proxy_verdict(aiohttp_server: Any, proxy_factory: Any, tmp_path: Path, fault: str) -> None:
    sim = await aiohttp_server(create_sim_app(build_params("sglang", speed=50.0)))
    proxy = await proxy_factory(sim.port, capture_raw_sse="all")
    body = {"model": "m", "prompt": "a b c", "max_tokens": 5, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    resp = await proxy.post("/sglang/v1/completions", json=body, headers={"X-Sim-Fault": fault})
    try:
        await resp.read()
    except Exception:
        pass
    rec, = read_records(tmp_path)
    assert rec["reason"] == INTENDED[fault]
    result = decode_capture(Path(rec["capture"]))
    assert (result["verdict"], result["reason"]) == (rec["outcome"], rec["reason"])
    assert result["ok"] and result["sha256"] == rec["capture_sha256"] and result["record_sha256_ok"]
    assert result["completion_tokens"] == rec["completion_tokens"] and result["visible_chars"] == rec["visible_chars"]


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
    proc = subprocess.run([sys.executable, "-m", "dashboards.evidence", "decode", str(sse), str(truncated),
                           str(corrupt), str(tmp_path / "missing.sse"), "--json"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    rows = json.loads(proc.stdout)
    assert rows[0]["ok"] and rows[0]["verdict"] == "success"
    assert not rows[1]["ok"] and rows[1]["reason"] == "missing_done" and not rows[1]["sha256_ok"]
    assert any("truncated" in p for p in rows[1]["problems"])
    assert rows[2]["verdict"] == "unreadable" and "not valid JSON" in rows[2]["reason"]
    assert rows[3]["verdict"] == "unreadable" and "not found" in rows[3]["reason"]


# -- summarize ------------------------------------------------------------------------------------

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
    assert r1["slo_attainment"] == pytest.approx(2 / 4)  # TTFT 4 s misses, the failure misses
    assert r2["output_throughput_tok_s"] == pytest.approx(256 / 4.0) and r3["output_throughput_tok_s"] == 128.0
    m, = s["medians"]
    assert (m["rounds"], m["success"], m["requests"]) == (3, 6, 7)
    assert m["output_throughput_tok_s"] == pytest.approx(64.0)  # median of 38.4, 64, 128
    assert m["ttft_p95_s"] == pytest.approx(1.45)  # median of 3.8, 1.45, 0.2
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "| vllm | s | 3 | 6 | 7 |" in md
    assert (tmp_path / "out" / "rounds.csv").read_text().count("\n") == 4


def test_summarize_against_prometheus(live_stack: Any) -> None:
    from dashboards.summarize import load_records

    s = summarize(load_records(live_stack.records), Prometheus(live_stack.prom))
    cmp = {(r["engine"], r["scenario"]): r for r in s["histogram_vs_exact"]}
    row = cmp[("vllm", "short-c8")]
    assert row["ttft_p95_exact_s"] > 0 and row["ttft_p95_histogram_s"] > 0
    assert math.isfinite(row["ttft_p95_rel_error"]) and abs(row["e2e_p95_rel_error"]) < 0.5
