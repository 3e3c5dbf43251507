"""The llm-d Benchmark Report, version 0.2.1, as pydantic models: the part of it this tool fills.

Written from the published JSON schema (field names, types, required fields, enumerations), not
from llm-d's code.  Every model forbids extra fields where the schema does, so a report that
validates here has only the schema's names; ``exclude_none`` leaves out what is not known.
Optional blocks this tool never fills (multi-modal payloads, sessions, replica status) are not
modelled: their absence is valid; of the components' resource metrics, only those it can pull
from Prometheus (the engines' KV cache and queues, the GPUs) are.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from exporter.core.stats import percentile

__all__ = ["VERSION", "Units", "Statistics", "SequenceLength", "LoadStandardized", "Load", "LoadMetadata",
           "LoadNative", "ComponentMetadata", "ComponentNative", "Parallelism", "Accelerator", "EngineModel",
           "InferenceEngine", "Generic", "Component", "Scenario", "RunTime", "Run", "AggregateRequests",
           "AggregateLatency", "AggregateThroughput", "AggregatePerformance", "RequestPerformance",
           "PodStartup", "PodStartupTimes", "Observability", "ReplicaHealth", "ComponentHealth", "Results",
           "BenchmarkReport", "TimeSeriesPoint", "TimeSeriesData", "ResourceMetrics", "TimeSeriesResourceMetrics",
           "ComponentObservability", "statistics_of", "PERCENTILES"]

VERSION = "0.2.1"

Units = Literal["count", "pixels", "percent", "fraction", "ratio", "ms", "s", "bytes", "MB", "GB", "TB", "MiB",
                "GiB", "TiB", "Mbit/s", "Gbit/s", "Tbit/s", "GiB/s", "MB/s", "GB/s", "TB/s", "ms/token", "s/token",
                "tokens/s", "queries/s", "images/s", "videos/s", "audios/s", "Watts"]
NonNegative = Annotated[int, Field(ge=0)]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Statistics(BaseModel):
    """A quantity's statistics: ``units`` and ``mean`` required; percentiles ``pX`` (``p0p1`` is
    the 0.1st, ``p99p9`` the 99.9th)."""

    units: Units
    mean: float
    mode: float | None = None
    stddev: Annotated[float, Field(ge=0)] | None = None
    min: float | None = None
    p0p1: float | None = None
    p1: float | None = None
    p5: float | None = None
    p10: float | None = None
    p25: float | None = None
    p50: float | None = None
    p75: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p99p9: float | None = None
    max: float | None = None


#: the schema's percentile fields and the percentile each is
PERCENTILES = {"p0p1": 0.1, "p1": 1, "p5": 5, "p10": 10, "p25": 25, "p50": 50, "p75": 75, "p90": 90, "p95": 95,
               "p99": 99, "p99p9": 99.9}


def statistics_of(values: Sequence[float], units: Units) -> Statistics | None:
    """Exact statistics of ``values`` (None when there are none)."""
    xs = [float(v) for v in values]
    if not xs:
        return None
    return Statistics(units=units, mean=statistics.fmean(xs), min=min(xs), max=max(xs),
                      stddev=statistics.pstdev(xs), **{k: percentile(xs, q) for k, q in PERCENTILES.items()})


class SequenceLength(_Closed):
    distribution: Literal["fixed", "gaussian", "uniform", "other"]
    value: Annotated[float, Field(ge=0)]
    std_dev: Annotated[float, Field(ge=0)] | None = None
    min: NonNegative | None = None
    max: Annotated[int, Field(ge=1)] | None = None


class LoadMetadata(_Closed):
    schema_version: str = "0.0.1"
    cfg_id: str | None = None
    description: str | None = None


class LoadStandardized(_Closed):
    tool: str
    tool_version: str
    parallelism: Annotated[int, Field(ge=1)] = 1
    source: Literal["random", "sampled", "unknown"]
    stage: NonNegative = 0
    input_seq_len: SequenceLength
    output_seq_len: SequenceLength | None = None
    rate_qps: Annotated[float, Field(gt=0)] | None = None
    concurrency: Annotated[float, Field(ge=1)] | None = None


class LoadNative(_Closed):
    args: dict[str, Any] | None = None
    envars: dict[str, Any] | None = None
    config: Any = None


class Load(_Closed):
    metadata: LoadMetadata
    standardized: LoadStandardized
    native: LoadNative


class ComponentMetadata(_Closed):
    schema_version: str = "0.0.1"
    label: str
    cfg_id: str
    description: str | None = None


class ComponentNative(_Closed):
    args: dict[str, Any] | None = None
    envars: dict[str, Any] | None = None
    config: Any = None


class Parallelism(_Closed):
    tp: NonNegative = 1
    dp: NonNegative = 1
    dp_local: NonNegative = 1
    workers: NonNegative = 1
    ep: Annotated[int, Field(ge=1)] = 1
    pp: Annotated[int, Field(ge=1)] = 1


class Accelerator(_Closed):
    model: str
    count: NonNegative
    parallelism: Parallelism


class EngineModel(_Closed):
    name: str


class InferenceEngine(_Closed):
    kind: Literal["inference_engine"] = "inference_engine"
    tool: str
    tool_version: str
    role: Literal["replica", "prefill", "decode"] = "replica"
    replicas: Annotated[int, Field(ge=1)] = 1
    model: EngineModel
    accelerator: Accelerator


class Generic(BaseModel):
    """A component with no standardized class of its own (extra fields allowed)."""

    model_config = ConfigDict(extra="allow")
    kind: Literal["generic"] = "generic"
    tool: str
    tool_version: str


class Component(_Closed):
    metadata: ComponentMetadata
    standardized: InferenceEngine | Generic
    native: ComponentNative


class Scenario(_Closed):
    stack: list[Component] | None = None
    load: Load | None = None


class RunTime(_Closed):
    start: str | None = None  # RFC 3339
    end: str | None = None
    duration: str | None = None  # ISO 8601, e.g. PT49.97S


class Run(_Closed):
    uid: str
    eid: str | None = None
    cid: str | None = None
    pid: str | None = None
    time: RunTime | None = None
    user: str | None = None
    description: str | None = None
    keywords: list[str] | None = None


class AggregateRequests(_Closed):
    total: NonNegative
    failures: NonNegative | None = None
    incomplete: NonNegative | None = None
    input_length: Statistics | None = None
    output_length: Statistics | None = None


class AggregateLatency(_Closed):
    time_to_first_token: Statistics | None = None
    normalized_time_per_output_token: Statistics | None = None
    time_per_output_token: Statistics | None = None
    inter_token_latency: Statistics | None = None
    request_latency: Statistics | None = None


class AggregateThroughput(_Closed):
    input_token_rate: Statistics | None = None
    output_token_rate: Statistics | None = None
    total_token_rate: Statistics | None = None
    request_rate: Statistics | None = None


class AggregatePerformance(_Closed):
    requests: AggregateRequests | None = None
    latency: AggregateLatency | None = None
    throughput: AggregateThroughput | None = None


class RequestPerformance(_Closed):
    aggregate: AggregatePerformance | None = None


class PodStartup(_Closed):
    name: str
    model: str | None = None
    role: str | None = None
    node: str | None = None
    creation_timestamp: str | None = None
    ready_timestamp: str | None = None
    startup_seconds: Annotated[float, Field(ge=0)] | None = None


class PodStartupTimes(_Closed):
    collected_at: str | None = None
    pods: list[PodStartup] | None = None
    aggregate: Statistics | None = None


class TimeSeriesPoint(_Closed):
    """One instant: ``value`` of a single series, or ``mean``/``min``/``max`` over several (GPUs)."""

    ts: str
    value: float | None = None
    mean: float | None = None
    min: float | None = None
    max: float | None = None


class TimeSeriesData(_Closed):
    units: Units
    series: list[TimeSeriesPoint]


class ResourceMetrics(_Closed):
    """A component's resource metrics over the round, as statistics of its time series' points."""

    kv_cache_usage: Statistics | None = None
    gpu_memory_usage: Statistics | None = None
    gpu_utilization: Statistics | None = None
    power_consumption: Statistics | None = None
    running_requests: Statistics | None = None
    waiting_requests: Statistics | None = None


class TimeSeriesResourceMetrics(_Closed):
    kv_cache_usage: TimeSeriesData | None = None
    gpu_memory_usage: TimeSeriesData | None = None
    gpu_utilization: TimeSeriesData | None = None
    power_consumption: TimeSeriesData | None = None
    num_requests_running: TimeSeriesData | None = None
    num_requests_waiting: TimeSeriesData | None = None


class ComponentObservability(_Closed):
    component_label: str
    aggregate: ResourceMetrics | None = None
    time_series: TimeSeriesResourceMetrics | None = None


class Observability(BaseModel):
    """Observability (extra fields allowed: the proxy's timing uncertainty and engine timing go here)."""

    model_config = ConfigDict(extra="allow")
    components: list[ComponentObservability] | None = None
    pod_startup_times: PodStartupTimes | None = None


class ReplicaHealth(_Closed):
    replica_id: str
    restarts: NonNegative | None = None
    healthy: bool | None = None


class ComponentHealth(_Closed):
    component_label: str
    total_restarts: NonNegative | None = None
    failed_replicas: NonNegative | None = None
    replica_health: list[ReplicaHealth] | None = None


class Results(_Closed):
    request_performance: RequestPerformance | None = None
    observability: Observability | None = None
    component_health: list[ComponentHealth] | None = None


class BenchmarkReport(_Closed):
    version: str = VERSION
    run: Run
    scenario: Scenario | None = None
    results: Results

    def document(self) -> dict[str, Any]:
        """The report as JSON-ready data, unknowns left out."""
        return self.model_dump(mode="json", exclude_none=True)
