"""``evidence report --format llm-d --prometheus URL``: each round's report carries the engine's own
time series under ``results.observability.components`` (KV-cache usage, running and waiting
requests, the GPUs where scraped), pulled with the boards' own queries over the round's window,
still valid against the published schema; without ``--prometheus`` none is asked for."""

from __future__ import annotations

import json
import os
import statistics
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from exporter.evidence.cli import main as evidence
from exporter.evidence.llmd_series import FIELDS, query_of

from tests.report_records import write_records

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = Path(os.environ.get("LLMBENCH_LLMD_SCHEMA", ROOT.parent / "shared" / "reference" / "llm-d-benchmark-report"
                             / "br_v0_2_1_json_schema.json"))
#: a metric name in a query -> the values of its series at successive instants (one list per series)
SERVED = {"kv_cache_usage_perc": [[0.25, 0.5, 0.75]], "token_usage": [[0.1, 0.2]],
          "num_requests_running": [[3.0, 4.0]], "num_running_reqs": [[1.0]],
          "DCGM_FI_DEV_GPU_UTIL": [[10.0, 30.0], [50.0, 70.0]]}


class _Prometheus(BaseHTTPRequestHandler):
    asked: list[str] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        url = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        if url.path != "/api/v1/query_range":
            self.send_response(404)
            self.end_headers()
            return
        self.asked.append(q["query"])
        start, end, step = float(q["start"]), float(q["end"]), float(q["step"])
        grid = [start + i * step for i in range(int((end - start) // step) + 1)]
        served = next((v for k, v in SERVED.items() if k in q["query"]), [])
        result = [{"metric": {"gpu": str(i)}, "values": [[t, str(series[j % len(series)])] for j, t in enumerate(grid)]}
                  for i, series in enumerate(served)]
        body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def prometheus() -> Iterator[str]:
    _Prometheus.asked = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Prometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _validator() -> Any:
    import jsonschema

    if not SCHEMA.exists():
        pytest.skip(f"no llm-d schema at {SCHEMA} (set LLMBENCH_LLMD_SCHEMA)")
    schema = json.loads(SCHEMA.read_text())
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _reports(out: Path) -> dict[tuple[str, str, int], dict[str, Any]]:
    manifest = json.loads((out / "manifest.json").read_text())
    return {(e["engine"], e["scenario"], e["round"]): json.loads((out / e["path"]).read_text())
            for e in manifest["reports"]}


def test_each_round_carries_its_engines_own_time_series(tmp_path: Path, prometheus: str) -> None:
    validator = _validator()
    out = tmp_path / "llmd"
    records = write_records(tmp_path / "run")
    assert evidence(["report", "--format", "llm-d", "--records", str(records), "--out", str(out),
                     "--prometheus", prometheus]) == 0
    reports = _reports(out)
    assert reports
    for (engine, _, _), report in reports.items():
        errors = sorted(validator.iter_errors(report), key=str)
        assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]]
        obs = report["results"]["observability"]
        component, = obs["components"]
        assert component["component_label"] == engine == report["scenario"]["stack"][0]["metadata"]["label"]
        notes = obs["engine_series"]
        # the boards' own queries, the engine's picked by its kind, and nothing else asked
        assert notes["queries"] == {f.name: query_of(f, engine) for f in FIELDS}
        assert set(notes["queries"].values()) <= set(_Prometheus.asked)
        assert notes["missing"] == ["num_requests_waiting", "power_consumption", "gpu_memory_usage"]
        series = component["time_series"]
        assert "num_requests_waiting" not in series and "waiting_requests" not in component["aggregate"]
        kv = series["kv_cache_usage"]
        assert kv["units"] == "percent"
        served = SERVED["kv_cache_usage_perc" if engine == "vllm" else "token_usage"][0]
        values = [p["value"] for p in kv["series"]]
        assert values == [pytest.approx(served[i % len(served)] * 100) for i in range(len(values))]
        assert len(values) >= 2  # a round shorter than the scrape interval still has two points
        assert component["aggregate"]["kv_cache_usage"]["mean"] == pytest.approx(statistics.fmean(values))
        gpu = series["gpu_utilization"]["series"]
        a, b = SERVED["DCGM_FI_DEV_GPU_UTIL"]
        for j, point in enumerate(gpu):  # two GPUs: their mean, min and max at each instant
            pair = [a[j % len(a)], b[j % len(b)]]
            assert (point["mean"], point["min"], point["max"]) == (pytest.approx(statistics.fmean(pair)),
                                                                   min(pair), max(pair))
        window = notes["window"]
        assert report["run"]["time"]["start"] == window["start"] and report["run"]["time"]["end"] == window["end"]


def test_without_prometheus_nothing_is_asked(tmp_path: Path, prometheus: str) -> None:
    out = tmp_path / "llmd"
    assert evidence(["report", "--format", "llm-d", "--records", str(write_records(tmp_path / "run")),
                     "--out", str(out)]) == 0
    assert _Prometheus.asked == []
    for report in _reports(out).values():
        assert "components" not in report["results"]["observability"]


def test_an_unreachable_prometheus_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = evidence(["report", "--format", "llm-d", "--records", str(write_records(tmp_path / "run")),
                     "--out", str(tmp_path / "llmd"), "--prometheus", "http://127.0.0.1:9"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("evidence: ") and "Traceback" not in err[0]
