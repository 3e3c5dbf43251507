"""OTLP export of the GenAI metrics (SPEC section 17), received by an in-test OTLP/HTTP receiver.

No OpenTelemetry Collector or OTLP-capable store is installable here (Debian's Prometheus 2.42
and VictoriaMetrics 1.79 predate their OTLP receivers; the Collector is not on PyPI or Debian),
so the receiver is an aiohttp server that decodes the protobuf with opentelemetry-proto, as a
collector would.  It runs in a thread of its own, like a separate process: the proxy's final
export at shutdown blocks the proxy's event loop.
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

pytest.importorskip("opentelemetry.sdk.metrics", reason="extra 'otel' not installed")

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (  # noqa: E402
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData  # noqa: E402

from exporter.proxy.metrics import TTFT_BUCKETS  # noqa: E402
from exporter.proxy.otlp import MAX_MODELS, MODEL_OTHER, OtlpObserver  # noqa: E402

from tests.helpers import make_config, read_records, stream_events, wait_for_records  # noqa: E402
from tests.transcripts import CASES  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BY_NAME = {c.name: c for c in CASES}
TTFT, TPOT = "gen_ai.server.time_to_first_token", "gen_ai.server.time_per_output_token"
DURATION, TOKENS = "gen_ai.server.request.duration", "gen_ai.client.token.usage"
UNITS = {TTFT: "s", TPOT: "s", DURATION: "s", TOKENS: "{token}"}


class Receiver:
    """An OTLP/HTTP metrics receiver (POST /v1/metrics, protobuf) on its own thread and loop."""

    def __init__(self) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self.content_types: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def _handle(self, request: web.Request) -> web.Response:
        msg = ExportMetricsServiceRequest()
        msg.ParseFromString(await request.read())
        self.requests.append(msg)
        self.content_types.append(request.headers.get("Content-Type", ""))
        return web.Response(body=ExportMetricsServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/metrics", self._handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]

    def __enter__(self) -> Receiver:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.runner is not None
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def latest(self) -> dict[tuple[str, frozenset[tuple[str, str]]], dict[str, Any]]:
        """(metric, attributes) -> the latest cumulative point: count, sum, bounds, unit."""
        out: dict[tuple[str, frozenset[tuple[str, str]]], dict[str, Any]] = {}
        for req in self.requests:
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        for p in m.histogram.data_points:
                            attrs = frozenset((a.key, a.value.string_value) for a in p.attributes)
                            out[m.name, attrs] = {"count": p.count, "sum": p.sum, "unit": m.unit,
                                                  "bounds": list(p.explicit_bounds), "buckets": list(p.bucket_counts),
                                                  "min": p.min, "max": p.max,
                                                  "temporality": m.histogram.aggregation_temporality}
        return out

    def resource(self) -> dict[str, str]:
        rm = self.requests[-1].resource_metrics[0]
        return {a.key: a.value.string_value for a in rm.resource.attributes}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


def _expected(records: list[dict[str, Any]]) -> dict[tuple[str, frozenset[tuple[str, str]]], list[float]]:
    """What the convention asks for, computed independently from the proxy's records."""
    want: dict[tuple[str, frozenset[tuple[str, str]]], list[float]] = defaultdict(list)
    for r in records:
        base = {"gen_ai.operation.name": {"/v1/completions": "text_completion",
                                          "/v1/chat/completions": "chat"}[r["route"]],
                "gen_ai.provider.name": r["engine"]}
        if r.get("model"):
            base["gen_ai.request.model"] = r["model"]
        if r["outcome"] == "success":
            want[TTFT, frozenset(base.items())].append(r["ttft_s"])
            want[TPOT, frozenset(base.items())].append(r["tpot_s"])
            want[DURATION, frozenset(base.items())].append(r["e2e_s"])
        else:
            want[DURATION, frozenset({**base, "error.type": r["reason"]}.items())].append(r["e2e_s"])
        for kind, field in (("input", "prompt_tokens"), ("output", "completion_tokens")):
            if r[field] is not None:
                want[TOKENS, frozenset({**base, "gen_ai.token.type": kind}.items())].append(r[field])
    return want


LOAD = [  # (engine, route, transcript, model)
    *[("vllm", "completions", "vllm_completions_ok", "m")] * 3,
    *[("sglang", "chat/completions", "vllm_chat_role_then_content", "chat-model")] * 2,
    ("vllm", "completions", "vllm_seed_empty_text_128", "m"),  # failure with usage
    ("sglang", "completions", "http_500", None),  # failure without usage
    ("sglang", "completions", "vllm_sse_error_then_done", "m"),
]


async def test_genai_metrics_reach_an_otlp_receiver(upstream: Any, proxy_factory: Any, tmp_path: Path,
                                                    receiver: Receiver) -> None:
    up, server = upstream

    async def by_case(request: web.Request) -> web.StreamResponse:
        case = BY_NAME[request.headers["X-Case"]]
        if case.status != 200:
            return web.Response(status=case.status, body=case.body, content_type="application/json")
        return await stream_events(request, [case.body])

    up.handler = by_case
    client = await proxy_factory(server.port, otlp={"endpoint": f"http://127.0.0.1:{receiver.port}",
                                                    "interval_s": 0.2})
    for engine, route, case, model in LOAD:
        body: dict[str, Any] = {"prompt": "hi", "stream": True, "stream_options": {"include_usage": True}}
        if route.startswith("chat"):
            body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
        if model is not None:
            body["model"] = model
        resp = await client.post(f"/{engine}/v1/{route}", json=body, headers={"X-Case": case})
        await resp.read()
    records = await wait_for_records(tmp_path, len(LOAD))
    assert Counter(r["outcome"] for r in records) == {"success": 5, "failure": 3}
    await client.close()  # shutdown: the observer's close() exports what is left

    got = receiver.latest()
    want = _expected(read_records(tmp_path))
    assert set(got) == set(want)
    for key, values in want.items():
        point = got[key]
        assert point["count"] == len(values), key
        assert math.isclose(point["sum"], sum(values), rel_tol=1e-9, abs_tol=1e-9), key
        assert point["unit"] == UNITS[key[0]]
        assert point["temporality"] == 2  # cumulative
        # OTLP buckets are upper-inclusive: bucket i holds bounds[i-1] < v <= bounds[i]
        want_buckets = Counter(sum(1 for b in point["bounds"] if b < v) for v in values)
        assert point["buckets"] == [want_buckets[i] for i in range(len(point["bounds"]) + 1)], key
        assert (point["min"], point["max"]) == (min(values), max(values))
    ttft_bounds = next(p["bounds"] for (name, _), p in got.items() if name == TTFT)
    assert ttft_bounds == list(TTFT_BUCKETS) and ttft_bounds[-1] == 600.0  # past the convention's 10 s
    errors = {dict(attrs).get("error.type") for name, attrs in got if name == DURATION}
    assert errors == {None, "empty_text", "http_status", "sse_error"}
    assert all("error.type" not in dict(attrs) for name, attrs in got if name != DURATION)
    assert {dict(a)["gen_ai.operation.name"] for _, a in got} == {"text_completion", "chat"}
    assert {dict(a).get("gen_ai.request.model") for _, a in got} == {"m", "chat-model", None}  # None: no model
    assert receiver.resource()["service.name"] == "llm-bench-exporter"
    assert set(receiver.content_types) == {"application/x-protobuf"}


class Capture(MetricExporter):
    """Keeps what the SDK would export."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[MetricsData] = []

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        self.batches.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


def _record(**over: Any) -> dict[str, Any]:
    return {"engine": "vllm", "route": "/v1/completions", "outcome": "success", "reason": None, "ttft_s": 0.5,
            "tpot_s": 0.02, "e2e_s": 1.0, "prompt_tokens": 10, "completion_tokens": 20, **over}


def test_aborts_unknown_usage_and_model_flood(tmp_path: Path) -> None:
    capture = Capture()
    config = make_config(tmp_path, 1, otlp={"endpoint": "http://127.0.0.1:9", "interval_s": 3600})
    observer = OtlpObserver(config, exporter=capture)
    observer.observe(_record(outcome="client_abort", reason="client_abort", ttft_s=0.1, completion_tokens=None,
                             prompt_tokens=None))
    for i in range(MAX_MODELS + 10):
        observer.observe(_record(model=f"model-{i}"))
    observer.observe(_record(model="x" * 129))
    observer.close()
    observer.close()  # twice is harmless
    points = {(m.name, frozenset(p.attributes.items())): p
              for rm in capture.batches[-1].resource_metrics for sm in rm.scope_metrics
              for m in sm.metrics for p in m.data.data_points}
    abort = frozenset({"gen_ai.operation.name": "text_completion", "gen_ai.provider.name": "vllm",
                       "error.type": "client_abort"}.items())
    assert points[DURATION, abort].count == 1
    ttft_models = Counter(dict(a).get("gen_ai.request.model") for name, a in points if name == TTFT)
    assert None not in ttft_models  # the abort fed no TTFT
    assert len(ttft_models) == MAX_MODELS + 1  # bounded: the first 64 models, then _OTHER
    assert points[TTFT, frozenset({"gen_ai.operation.name": "text_completion", "gen_ai.provider.name": "vllm",
                                   "gen_ai.request.model": MODEL_OTHER}.items())].count == 11
    edge = points[TTFT, frozenset({"gen_ai.operation.name": "text_completion", "gen_ai.provider.name": "vllm",
                                   "gen_ai.request.model": "model-0"}.items())]
    assert list(edge.explicit_bounds)[list(edge.bucket_counts).index(1)] == 0.5  # 0.5 s lands in (0.4, 0.5]
    tokens = sum(p.count for (name, _), p in points.items() if name == TOKENS)
    assert tokens == 2 * (MAX_MODELS + 11)  # input and output of each record with usage, none for the abort


IMPORT_CHECK = """
import sys
from exporter.proxy.app import create_app
from exporter.proxy.config import validate
config = {"engines": [{"name": "e", "upstream": "http://127.0.0.1:9"}], "records_dir": sys.argv[1]}
create_app(validate(config))
print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
create_app(validate({**config, "otlp": {"endpoint": "http://127.0.0.1:9", "interval_s": 60}}))
print("opentelemetry.sdk.metrics" in sys.modules)
"""


@pytest.mark.slow  # a subprocess: runs in the full suite
def test_sdk_imported_only_when_configured(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", IMPORT_CHECK, str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "True"]  # none without otlp; the SDK once it is configured
