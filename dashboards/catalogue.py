"""The panel catalogue: every query the boards, the recording rules, the rule tests and the
evidence export use.  Each PromQL expression is written once, here.

Board expressions carry Grafana variables (``$engine``, ``$scenario``, ``$host``, ``$gpu``,
``$__range``); :func:`expand` fills them in for Prometheus itself (all values selected).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from exporter.proxy.config import DEFAULT_SLO

from .mixin import CONFIG as MIXIN

__all__ = [
    "ENGINE_COLORS", "LINE_STYLES", "DATASOURCE_UID", "RATE_WINDOW", "Query", "Panel", "Board", "BOARDS",
    "PANELS", "expand", "rule_expr", "SLO_TTFT_S", "SLO_TPOT_S", "MIXIN",
]

#: Fixed colours: SGLang blue, vLLM orange (Grafana and the PNG evidence alike).
ENGINE_COLORS: dict[str, str] = {"sglang": "#1f77b4", "vllm": "#ff7f0e"}
#: Where one engine has several series on a panel: legend word -> line style.
LINE_STYLES: dict[str, str] = {"proxy": "dash", "queue": "dot"}
#: The provisioned Prometheus datasource's uid (compose/grafana/provisioning).
DATASOURCE_UID = "llmbench-prometheus"
#: The seed's boards take P95 over 1-minute histogram windows.  With the 5 s scrape
#: interval of prometheus/prometheus.yml that is 12 samples, >= 4 scrape intervals.
RATE_WINDOW = "1m"
W = RATE_WINDOW
#: The SLO the boards and alerts draw (the config's defaults, SPEC section 11).
SLO_TTFT_S = DEFAULT_SLO.ttft_s
SLO_TPOT_S = DEFAULT_SLO.tpot_s

_ES = 'engine=~"$engine", scenario=~"$scenario"'
_HOST = '{gpu=~"$gpu", Hostname=~"$host"}'
_HOST_LC = '{gpu=~"$gpu", hostname=~"$host"}'


def _p95(metric: str) -> str:
    return f"histogram_quantile(0.95, sum by (engine, le) (rate({metric}_bucket{{{_ES}}}[{W}])))"


_OK = 'llmbench_requests_total{outcome="success", ' + _ES + "}"
_JUDGED = 'llmbench_requests_total{outcome!="client_abort", ' + _ES + "}"
_FAILED = 'llmbench_requests_total{outcome="failure", ' + _ES + "}"
_EMPTY = "llmbench_empty_text_responses_total{" + _ES + "}"


def _delta(selector: str) -> str:
    """Exact count in the time range: the counters start at zero (the exporter creates every
    series up front), so max - min over the range counts every event, without increase()'s
    extrapolation to fractional requests.  Assumes no exporter restart inside the range."""
    return f"max_over_time({selector}[$__range]) - min_over_time({selector}[$__range])"


def _dcgm(metric: str, scale: str = "") -> str:
    # dcgm-exporter versions spell the host label Hostname or hostname: accept both.
    return f"({metric}{_HOST}{scale} or {metric}{_HOST_LC}{scale})"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str
    ref: str = "A"


@dataclass(frozen=True)
class Panel:
    key: str
    title: str
    unit: str
    queries: tuple[Query, ...]
    kind: str = "timeseries"  # or "stat"
    description: str = ""
    width: int = 12
    height: int = 8
    rule: str | None = None  # recording rule name, when the query is also recorded
    per_engine_colors: bool = True
    thresholds: tuple[float, ...] = ()

    @property
    def exprs(self) -> list[str]:
        return [q.expr for q in self.queries]


@dataclass(frozen=True)
class Board:
    uid: str
    title: str
    panels: tuple[Panel, ...]
    variables: tuple[str, ...]
    tags: tuple[str, ...] = ("llm-bench",)
    annotations: bool = False
    columns: int = 2
    extra: dict[str, str] = field(default_factory=dict)


def _q(expr: str, legend: str = "{{engine}}") -> tuple[Query, ...]:
    return (Query(expr, legend),)


COMPARISON = Board(
    uid="llmbench-engine-comparison",
    title="LLM bench: engine comparison",
    variables=("datasource", "engine", "scenario"),
    annotations=True,
    panels=(
        Panel("success_ratio", "Success ratio", "percentunit", kind="stat", width=8, height=4,
              queries=_q(f"sum by (engine) ({_delta(_OK)}) / sum by (engine) ({_delta(_JUDGED)})"),
              description="Successful / (successful + failed) requests in the time range; client aborts excluded."),
        Panel("failures_by_reason", "Failures by reason", "short", kind="stat", width=8, height=4,
              queries=_q(f"sum by (engine, reason) ({_delta(_FAILED)}) > 0", "{{engine}} {{reason}}"),
              description="Failed requests in the time range by the first failing check (SPEC section 4)."),
        Panel("empty_text", "Empty-text HTTP 200 responses", "short", kind="stat", width=8, height=4,
              queries=_q(f"sum by (engine) ({_delta(_EMPTY)})"),
              description="HTTP 200 streams with [DONE] and no visible text: counted as failures here, "
                          "as successes by clients that do not look at the text."),
        Panel("ttft_p95", "TTFT P95", "s", queries=_q(_p95("llmbench_time_to_first_token_seconds")),
              rule="engine:llmbench_time_to_first_token_seconds:p95_rate1m", thresholds=(SLO_TTFT_S,),
              description="Time to the first non-empty text, successful requests, P95 over 1-minute windows."),
        Panel("tpot_p95", "Per-request TPOT P95", "s", queries=_q(_p95("llmbench_time_per_output_token_seconds")),
              rule="engine:llmbench_time_per_output_token_seconds:p95_rate1m", thresholds=(SLO_TPOT_S,),
              description="Per-request average time per output token, P95 over 1-minute windows."),
        Panel("throughput", "Successful output throughput", "suffix: tok/s",
              queries=_q(f'sum by (engine) (rate(llmbench_output_tokens_total{{outcome="success", {_ES}}}[{W}]))'),
              rule="engine:llmbench_output_tokens:rate1m",
              description="Completion tokens of successful requests per second (server usage)."),
        Panel("e2e_p95", "Full-stream E2E P95", "s", queries=_q(_p95("llmbench_e2e_request_latency_seconds")),
              rule="engine:llmbench_e2e_request_latency_seconds:p95_rate1m",
              description="Request sent to the end of the stream after [DONE], successful requests."),
        Panel("success_ratio_1m", "Success ratio (1-minute windows)", "percentunit",
              queries=_q(f'sum by (engine) (rate(llmbench_requests_total{{outcome="success", {_ES}}}[{W}]))'
                         f' / sum by (engine) (rate(llmbench_requests_total{{outcome!="client_abort", {_ES}}}[{W}]))'),
              rule="engine:llmbench_requests:success_ratio_rate1m"),
        Panel("failure_ratio", "Failure ratio by reason", "percentunit", per_engine_colors=False,
              queries=_q(f'sum by (engine, reason) (rate(llmbench_requests_total{{outcome="failure", {_ES}}}[{W}]))'
                         f' / ignoring (reason) group_left sum by (engine) (rate(llmbench_requests_total{{outcome!="client_abort", {_ES}}}[{W}]))',
                         "{{engine}} {{reason}}"),
              rule="engine_reason:llmbench_requests:failure_ratio_rate1m"),
        Panel("in_flight", "Requests in flight", "short",
              queries=_q('sum by (engine) (llmbench_requests_in_flight{engine=~"$engine"})')),
    ),
)

GPU = Board(
    uid="llmbench-gpu-resources",
    title="LLM bench: GPU resources",
    variables=("datasource", "host", "gpu"),
    panels=(
        Panel("gpu_fb_used", "Framebuffer used", "gbytes", per_engine_colors=False,
              queries=_q(_dcgm("DCGM_FI_DEV_FB_USED", " / 1024"), "{{Hostname}}{{hostname}} GPU {{gpu}}"),
              description="DCGM_FI_DEV_FB_USED (MiB) / 1024, one series per GPU."),
        Panel("gpu_sm_clock", "SM clock", "hertz", per_engine_colors=False,
              queries=_q(_dcgm("DCGM_FI_DEV_SM_CLOCK", " * 1000000"), "{{Hostname}}{{hostname}} GPU {{gpu}}"),
              description="DCGM_FI_DEV_SM_CLOCK (MHz), shown in Hz units so Grafana prints GHz."),
        Panel("gpu_util", "GPU utilisation", "percent", per_engine_colors=False,
              queries=_q(_dcgm("DCGM_FI_DEV_GPU_UTIL"), "{{Hostname}}{{hostname}} GPU {{gpu}}")),
        Panel("gpu_power", "Power draw", "watt", per_engine_colors=False,
              queries=_q(_dcgm("DCGM_FI_DEV_POWER_USAGE"), "{{Hostname}}{{hostname}} GPU {{gpu}}")),
        Panel("gpu_temp", "GPU temperature", "celsius", per_engine_colors=False,
              queries=_q(_dcgm("DCGM_FI_DEV_GPU_TEMP"), "{{Hostname}}{{hostname}} GPU {{gpu}}")),
    ),
)

INTERNALS = Board(
    uid="llmbench-engine-internals",
    title="LLM bench: engine internals",
    variables=("datasource", "engine"),
    panels=(
        Panel("engine_running", "Running requests (engine)", "short", queries=(
            Query("sum(vllm:num_requests_running)", "vllm running", "A"),
            Query("sum(sglang:num_running_reqs)", "sglang running", "B"))),
        Panel("engine_waiting", "Waiting requests (engine queue)", "short", queries=(
            Query("sum(vllm:num_requests_waiting)", "vllm waiting", "A"),
            Query("sum(sglang:num_queue_reqs)", "sglang waiting", "B"))),
        Panel("engine_kv_cache", "KV-cache usage", "percentunit", queries=(
            # vLLM before the v1 metrics rename spells it gpu_cache_usage_perc
            Query("max(vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc)", "vllm kv cache", "A"),
            Query("max(sglang:token_usage)", "sglang token usage", "B"))),
        Panel("engine_ttft_vs_proxy", "TTFT P95: engine-side vs proxy, and queue time", "s", queries=(
            Query(f"histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[{W}])))",
                  "vllm engine TTFT", "A"),
            Query(f"histogram_quantile(0.95, sum by (le) (rate(sglang:time_to_first_token_seconds_bucket[{W}])))",
                  "sglang engine TTFT", "B"),
            Query(f"histogram_quantile(0.95, sum by (le) (rate(vllm:request_queue_time_seconds_bucket[{W}])))",
                  "vllm queue time", "C"),
            Query(f'histogram_quantile(0.95, sum by (engine, le) (rate(llmbench_time_to_first_token_seconds_bucket{{engine=~"$engine"}}[{W}])))',
                  "{{engine}} proxy TTFT", "D")),
              description="How much of a long TTFT was queueing: engine-side TTFT and queue time beside the proxy's."),
        Panel("engine_generation", "Generation throughput (engine)", "suffix: tok/s", queries=(
            Query(f"sum(rate(vllm:generation_tokens_total[{W}]))", "vllm generated", "A"),
            Query(f"sum(rate(sglang:generation_tokens_total[{W}]))", "sglang generated", "B"))),
        Panel("engine_prompt", "Prompt throughput (engine)", "suffix: tok/s", queries=(
            Query(f"sum(rate(vllm:prompt_tokens_total[{W}]))", "vllm prompt", "A"),
            Query(f"sum(rate(sglang:prompt_tokens_total[{W}]))", "sglang prompt", "B"))),
    ),
)

BOARDS: dict[str, Board] = {"comparison": COMPARISON, "gpu": GPU, "internals": INTERNALS}
PANELS: dict[str, Panel] = {p.key: p for b in BOARDS.values() for p in b.panels}

_SELECTOR = re.compile(r"\{([^{}]*)\}")


def _drop_match_all(m: re.Match[str]) -> str:
    kept = [x.strip() for x in m.group(1).split(",") if x.strip() and not x.strip().endswith('=~".*"')]
    return "{" + ", ".join(kept) + "}" if kept else ""


def expand(expr: str, range_s: float | None = None, **values: str) -> str:
    """Fill Grafana variables: each ``$name`` by ``values[name]`` (default ``.*``) and
    ``$__range`` by ``range_s`` seconds; ``label=~".*"`` matchers are dropped."""
    if "$__range" in expr:
        if range_s is None:
            raise ValueError("this query needs a range: pass range_s")
        expr = expr.replace("$__range", f"{max(1, int(round(range_s)))}s")
    expr = re.sub(r"\$(\w+)", lambda m: values.get(m.group(1), ".*"), expr)
    return _SELECTOR.sub(_drop_match_all, expr)


def rule_expr(panel: Panel) -> str:
    """The recording rule's expression: the panel's own query with every value selected."""
    return expand(panel.queries[0].expr)
