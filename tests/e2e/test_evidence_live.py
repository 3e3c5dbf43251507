"""evidence export against the real Prometheus fed by the real exporter."""

from __future__ import annotations

import http.server
import json
import math
import threading
from pathlib import Path
from typing import Any

import matplotlib.image as mpimg
import pytest

from dashboards.catalogue import BOARDS, PANELS, expand
from exporter.evidence.cli import main as evidence_main
from exporter.evidence.export import GRAFANA_TOKEN_ENV, verify_manifest
from exporter.evidence.merge import load_records
from exporter.evidence.promapi import Prometheus
from exporter.evidence.render import png_size
from exporter.evidence.summarize import summarize
from exporter.evidence.windows import WindowError, parse_window

from tests.helpers import announcements


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
    assert manifest["window"]["source"] == "given" and manifest["grid_start"] <= manifest["window"]["start"] + manifest["step_s"]
    assert manifest["prometheus"]["buildinfo"]["version"] and manifest["version"]
    assert manifest["window"]["start"] == float(_window(live_stack).split(",")[0])
    (out / "data/comparison/ttft_p95.csv").write_text("tampered")
    assert verify_manifest(out) == ["data/comparison/ttft_p95.csv"]
    md = (out / "EVIDENCE.md").read_text()
    assert expand(PANELS["ttft_p95"].queries[0].expr) in md  # the catalogue's query, every value selected
    assert manifest["window"]["start_utc"] in md and "| series | points | NaN |" in md
    ttft = json.loads((out / "data/comparison/ttft_p95.json").read_text())
    assert {s["name"] for s in ttft["queries"][0]["series"]} == {"sglang", "vllm"}
    for board, spec in BOARDS.items():
        img = mpimg.imread(out / f"{board}.png")
        assert (img.shape[1], img.shape[0]) == png_size(spec)
        assert len({tuple(px) for px in img.reshape(-1, img.shape[2])[::97]}) > 20  # not a blank image


def test_scenario_windows_resolve(live_stack: Any) -> None:
    events = announcements(live_stack.records / "scenarios.jsonl")
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
    (["--window", "scenario:never-ran"], "unknown scenario"),
    (["--window", "last:7d", "--step", "1"], "Prometheus allows 11000"),
])
def test_export_errors(live_stack: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    rc = evidence_main(["export", "--prometheus", live_stack.prom, "--out", str(tmp_path / "x"), *args])
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_empty_window_exits_3_and_still_writes_its_files(live_stack: Any, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """SPEC 22: every panel of the proxies' boards empty: exit 3, one line, the files written."""
    out = tmp_path / "x"
    rc = evidence_main(["export", "--prometheus", live_stack.prom, "--out", str(out), "--boards", "comparison",
                        "--window", "978307200,978310800"])
    err = capsys.readouterr().err
    assert rc == 3 and err.count("\n") == 1 and "no samples in the window" in err and "Traceback" not in err
    assert (out / "EVIDENCE.md").exists() and json.loads((out / "manifest.json").read_text())["no_series"]


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


def test_summarize_against_prometheus(live_stack: Any) -> None:
    s = summarize(load_records(live_stack.records), Prometheus(live_stack.prom))
    cmp = {(r["engine"], r["scenario"]): r for r in s["histogram_vs_exact"]}
    row = cmp[("vllm", "short-c8")]
    assert row["ttft_p95_exact_s"] > 0 and row["ttft_p95_histogram_s"] > 0
    assert math.isfinite(row["ttft_p95_rel_error"]) and abs(row["e2e_p95_rel_error"]) < 0.5


def test_export_refuses_a_used_out_unless_forced(live_stack: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ev"
    args = ["export", "--prometheus", live_stack.prom, "--window", _window(live_stack), "--out", str(out),
            "--boards", "comparison"]
    assert evidence_main(args) == 0
    (out / "data" / "gpu").mkdir()
    (out / "data" / "gpu" / "stale.csv").write_text("an earlier export's file")
    capsys.readouterr()
    assert evidence_main(args) == 2
    assert "is not empty" in capsys.readouterr().err and (out / "data" / "gpu" / "stale.csv").exists()
    assert evidence_main([*args, "--force"]) == 0
    listed = {f["path"] for f in json.loads((out / "manifest.json").read_text())["files"]}
    assert {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()} == listed | {"manifest.json"}


def test_export_grid_ends_on_the_window_end(live_stack: Any, tmp_path: Path) -> None:
    """A step that does not divide the window: the last point is the window's end, so the exact
    counts there cover the whole window and equal the requests the proxy recorded in it."""
    end = int(live_stack.end)
    start = int(live_stack.start) - 7
    out = tmp_path / "ev"
    assert evidence_main(["export", "--prometheus", live_stack.prom, "--window", f"{start},{end}",
                          "--out", str(out), "--boards", "comparison", "--step", "11"]) == 0
    doc = json.loads((out / "data/comparison/empty_text.json").read_text())
    for series in doc["queries"][0]["series"]:
        assert series["values"][-1][0] == end
    empty = sum(1 for r in load_records(live_stack.records) if r["engine"] == "vllm" and r["reason"] == "empty_text")
    assert empty > 0
    vllm = next(s for s in doc["queries"][0]["series"] if s["name"] == "vllm")
    assert vllm["values"][-1][1] == empty


def test_a_round_shorter_than_a_scrape_interval_is_found_from_prometheus_alone(tmp_path: Path,
                                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A 2-second round under the repo's 5 s scrape interval: the round timestamp gauges find it
    (SPEC section 16); with --records the records' times win, and the output says which.  The
    exact-count panels are widened to the scrapes around the round, and say so: they count
    the round's requests (nothing else ran then), where counts inside 2 s would find no series."""
    import time

    import requests

    from exporter.harness.stack import LocalStack

    from tests.helpers import just_after_a_scrape, require_prometheus, scrapes_since

    require_prometheus()
    with LocalStack(tmp_path / "stack") as stack:
        stack.start(scenarios=["blip"], speed=5)
        prom_url = stack.start_prometheus()
        scenario = f"{stack.proxy_url}/-/scenario"
        just_after_a_scrape(prom_url, stack.proxy_url.removeprefix("http://"))  # no scrape inside the round
        requests.post(scenario, json={"scenario": "blip", "round": 1}, timeout=30).raise_for_status()
        body = {"model": "m", "prompt": "a b c", "max_tokens": 4, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        t0 = time.time()
        while time.time() - t0 < 2.0:
            fault = {"X-Sim-Fault": "empty_text"} if int((time.time() - t0) * 10) % 3 == 0 else {}
            _ = requests.post(f"{stack.proxy_url}/vllm/v1/completions", json=body, headers=fault, timeout=10).content
        requests.post(scenario, json={"scenario": None}, timeout=5).raise_for_status()
        # two scrapes after the round's end, and the rules evaluated after them
        scrapes_since(prom_url, stack.proxy_url.removeprefix("http://"), time.time(), n=2, rules=True)
        events = [json.loads(x) for x in (tmp_path / "stack" / "records" / "scenarios.jsonl").read_text().splitlines()]
        set_at = next(e["unix"] for e in events if e["scenario"] == "blip")
        cleared_at = next(e["unix"] for e in events if e["scenario"] is None and e["unix"] >= set_at)
        w = parse_window("scenario:blip#1", prom=Prometheus(prom_url))
        assert "llmbench_scenario_round_start_timestamp_seconds" in w.source
        # the gauges hold the same instants as scenarios.jsonl (which rounds them to the millisecond)
        assert w.start == pytest.approx(set_at, abs=1e-3) and w.end == pytest.approx(cleared_at, abs=1e-3)
        assert w.seconds >= 2.0  # requests were sent for 2 s between the two
        out = tmp_path / "ev"
        assert evidence_main(["export", "--prometheus", prom_url, "--window", "scenario:blip#1", "--out", str(out),
                              "--boards", "comparison", "--records", str(tmp_path / "stack" / "records")]) == 0
        records = load_records(tmp_path / "stack" / "records")
    printed = capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["window"]["source"].startswith("records") and "records (" in printed
    assert manifest["window"]["start"] == set_at and manifest["window"]["end"] == cleared_at
    md = (out / "EVIDENCE.md").read_text()
    assert "window source: records" in md
    _check_widened_counts(out, manifest, md, printed, [r for r in records if r["scenario"] == "blip"])


def _check_widened_counts(out: Path, manifest: dict[str, Any], md: str, printed: str,
                          round_records: list[dict[str, Any]]) -> None:
    counts = manifest["exact_counts"]
    assert counts["widened"] and counts["complete"] and counts["scrape_s"] == 5
    assert counts["baseline"] <= manifest["window"]["start"] and counts["at"] >= manifest["window"]["end"] + 5
    window_s = manifest["window"]["end"] - manifest["window"]["start"]
    assert f"- Exact counts: widened: the window ({window_s:.1f} s)" in md and "Widened: evaluated once at" in md
    assert "exact counts widened" in printed
    empty = sum(1 for r in round_records if r["reason"] == "empty_text")
    ok = sum(1 for r in round_records if r["outcome"] == "success")
    assert empty > 0 and ok > 0 and len(round_records) == empty + ok
    values = {}
    for key in ("empty_text", "success_ratio"):
        doc = json.loads((out / f"data/comparison/{key}.json").read_text())
        assert doc["queries"][0]["evaluated"] == {"at": counts["at"], "range_s": counts["range_s"], "widened": True}
        series = {x["name"]: x["values"] for x in doc["queries"][0]["series"]}
        assert all([t for t, _ in v] == [counts["at"]] for v in series.values())
        values[key] = {name: v[0][1] for name, v in series.items()}
    # sglang ran nothing: its series (made at start) count 0 requests, and 0 of 0 is no ratio
    assert values == {"empty_text": {"vllm": empty, "sglang": 0},
                      "success_ratio": {"vllm": pytest.approx(ok / (ok + empty)), "sglang": None}}


def test_an_export_under_the_wrong_job_names_its_selector_and_the_right_job(
        live_stack: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """issue 19 item 8: the data is there under the proxies' job; an export for another finds nothing
    and says which selector it used and where the series are, in one line."""
    args = ["export", "--prometheus", live_stack.prom, "--window", _window(live_stack), "--boards", "comparison"]
    assert evidence_main([*args, "--out", str(tmp_path / "x"), "--job", "myproxy"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert '{job="myproxy"}' in err and "under job 'llmbench-exporter': pass --job llmbench-exporter" in err
    assert (tmp_path / "x" / "EVIDENCE.md").exists()  # written all the same: it shows the empty panels
    # the job it names is the one that works, and the evidence says which selector it used
    assert evidence_main([*args, "--out", str(tmp_path / "ok"), "--job", "llmbench-exporter"]) == 0
    manifest = json.loads((tmp_path / "ok" / "manifest.json").read_text())
    assert manifest["job"] == "llmbench-exporter"
    assert 'selected by `{job="llmbench-exporter"}`' in (tmp_path / "ok" / "EVIDENCE.md").read_text()


def test_a_round_window_gives_its_totals_from_the_real_counters(live_stack: Any, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """SPEC 22: `round_totals` from the proxies' counters, against the real Prometheus.  The count
    runs between two scrapes around the announced round: at least every record of the round, at
    most the records of its scenario that ended between those scrapes, with slack each side: a
    scrape is stamped when it starts and the counters are read later, by as much as the scrape
    took (`scrape_duration_seconds`: the supervisor renders /metrics at a lower CPU priority, so on
    a busy machine a scrape takes seconds), and a request is counted when the loop finishes it: up to
    its own `timing_uncertainty_s` after its stamped end."""
    out = tmp_path / "round"
    assert evidence_main(["export", "--prometheus", live_stack.prom, "--records", str(live_stack.records),
                          "--window", "scenario:short-c8#2", "--boards", "comparison", "--out", str(out)]) == 0
    assert "round totals vllm:" in capsys.readouterr().out
    totals = json.loads((out / "manifest.json").read_text())["round_totals"]
    records = load_records(live_stack.records)
    took = Prometheus(live_stack.prom).query('max(max_over_time(scrape_duration_seconds{job="llmbench-exporter"}[15m]))')
    slack = 1.0 + (float(took[0]["value"][1]) if took else 0.0)
    assert set(totals) == {"sglang", "vllm"}
    for engine, t in totals.items():
        mine = [r for r in records if r["engine"] == engine and r["scenario"] == "short-c8"]
        inside = [r for r in mine if r["round"] == 2]
        # a request is counted when the loop finishes it, up to its timing uncertainty after its stamped end
        late = max((r.get("timing_uncertainty_s") or 0.0 for r in mine), default=0.0)
        # the baseline is the last sample stored at or before counted_from: a scrape that timed out on a busy
        # machine leaves the one before it, a scrape interval earlier
        stored = Prometheus(live_stack.prom).query('max(timestamp(llmbench_requests_total{job="llmbench-exporter"}))',
                                                   t["counted_from"])
        since = min(t["counted_from"], float(stored[0]["value"][1])) if stored else t["counted_from"]
        near = [r for r in mine
                if since - slack - late < r["start_unix"] + r["e2e_s"] <= t["counted_to"] + slack + late]
        ok = [r for r in inside if r["outcome"] == "success"]
        ends = sorted(r["start_unix"] + r["e2e_s"] for r in mine)
        assert t["complete"] and len(inside) <= t["requests"] <= len(near), (engine, t, slack, late, len(near), ends)
        assert len(ok) <= t["successes"] <= t["requests"]
        tokens = sum(r["completion_tokens"] for r in ok)
        assert tokens <= t["output_tokens"] <= sum(r["completion_tokens"] or 0 for r in near if r["outcome"] == "success")
        assert t["output_tokens_per_s"] == pytest.approx(t["output_tokens"] / t["announced_s"])
    assert "## Round totals" in (out / "EVIDENCE.md").read_text()
