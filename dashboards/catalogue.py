"""The panel catalogue: every query the boards, the recording rules, the rule tests and the
evidence export use.  Each PromQL expression is written once, here.

Board expressions carry Grafana variables (``$engine``, ``$scenario``, ``$instance``,
``$engine_instance``, ``$host``, ``$gpu``, ``$__range``); :func:`expand` fills them in for
Prometheus itself (all values selected).  Selectors and groupings come from the mixin
(:mod:`dashboards.mixin`); every query sums the proxies by engine, so any number of proxy
instances add up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .mixin import CONFIG as MIXIN

__all__ = [
    "ENGINE_COLORS", "LINE_STYLES", "DATASOURCE_UID", "VM_DATASOURCE_UID", "RATE_WINDOW", "COUNT_STEP", "Query",
    "Panel", "Board", "Annotation", "BOARDS", "PANELS", "ROUND_ANNOTATIONS", "expand", "rule_expr", "exact_count",
    "SLO_TTFT_S", "SLO_TPOT_S", "MIXIN",
]

#: Fixed colours: SGLang blue, vLLM orange (Grafana and the PNG evidence alike).
ENGINE_COLORS: dict[str, str] = {"sglang": "#1f77b4", "vllm": "#ff7f0e"}
#: Where one engine has several series on a panel: legend word -> line style.
LINE_STYLES: dict[str, str] = {"proxy": "dash", "queue": "dot"}
#: The provisioned Prometheus datasource's uid (compose/grafana/provisioning).
DATASOURCE_UID = "llmbench-prometheus"
#: The second one, VictoriaMetrics, in compose's `scale` profile.
VM_DATASOURCE_UID = "llmbench-victoriametrics"
#: The seed's boards take P95 over 1-minute histogram windows.  With the 5 s scrape
#: interval of prometheus/prometheus.yml that is 12 samples, >= 4 scrape intervals.
RATE_WINDOW = "1m"
W = RATE_WINDOW
#: The SLO the boards and alerts draw; the proxy's config defaults read it from the mixin too.
SLO_TTFT_S = MIXIN.slo_ttft_s
SLO_TPOT_S = MIXIN.slo_tpot_s

E = MIXIN.engine_label
BY_E = MIXIN.by_engine
LEGEND = MIXIN.engine_legend
#: The subquery step of the restart-safe exact counts (:func:`exact_count`).
COUNT_STEP = MIXIN.count_step
_ES = f'{MIXIN.engine_matcher()}, scenario=~"$scenario"'
_HOST = '{gpu=~"$gpu", Hostname=~"$host"}'
_HOST_LC = '{gpu=~"$gpu", hostname=~"$host"}'
_INST = f'{MIXIN.instance_label}=~"$instance"'
_ENGINE_INST = f'{MIXIN.instance_label}=~"$engine_instance"'


def _p(quantile: float, metric: str, by: str, *matchers: str) -> str:
    sel = MIXIN.proxy(*matchers)
    return f"histogram_quantile({quantile:g}, sum by ({by}, le) (rate({metric}_bucket{sel}[{W}])))"


def _p95(metric: str) -> str:
    return _p(0.95, metric, E, _ES)


def _rate(metric: str, *matchers: str) -> str:
    return f"sum {BY_E} (rate({metric}{MIXIN.proxy(*matchers, _ES)}[{W}]))"


_OK_M, _JUDGED_M, _MET_M = 'outcome="success"', 'outcome!="client_abort"', 'result="met"'
_OK = "llmbench_requests_total" + MIXIN.proxy(_OK_M, _ES)
#: judged requests: every outcome but client_abort
_JUDGED = "llmbench_requests_total" + MIXIN.proxy(_JUDGED_M, _ES)
_FAILED = "llmbench_requests_total" + MIXIN.proxy('outcome="failure"', _ES)
_EMPTY = "llmbench_empty_text_responses_total" + MIXIN.proxy(_ES)
_MET = "llmbench_slo_requests_total" + MIXIN.proxy(_MET_M, _ES)


def exact_count(selector: str, range_: str = "$__range") -> str:
    """Exact count of a counter's events in the time range, per series, right across restarts.

    A sum of resets-aware differences between consecutive samples, without ``increase()``'s
    extrapolation to fractional requests: at each step of ``COUNT_STEP`` (at most the scrape
    interval) the newest sample minus the one before it, or, where the counter went down (the
    exporter restarted), the new value itself, as ``increase()`` does.  The previous sample is
    looked up with a range selector, so it is found across the stale gap a restart leaves.
    A series' first sample is its baseline, and the window's is the last sample before its first
    step (at most ``COUNT_STEP`` before the range starts).  Like ``increase()``, it cannot see a
    restart after which the counter is back at or above its last sample before the restart.
    Aggregate the result (``sum by (engine)``), never the counter before it: each proxy instance
    restarts on its own.  Prometheus and VictoriaMetrics give the same numbers."""
    cur = f"last_over_time({selector}[{COUNT_STEP}])"
    prev = f"last_over_time({selector}[{range_}] offset {COUNT_STEP})"
    return f"sum_over_time(({cur} - {prev} * ({prev} <= bool {cur}))[{range_}:{COUNT_STEP}])"


def _count(selector: str, by: str = BY_E) -> str:
    return f"sum {by} ({exact_count(selector)})"


def _dcgm(metric: str, scale: str = "") -> str:
    # dcgm-exporter versions spell the host label Hostname or hostname: accept both.  Two proxies
    # on one host report the same GPU: one series per host and GPU.
    return f"max by (Hostname, hostname, gpu) ({metric}{_HOST}{scale} or {metric}{_HOST_LC}{scale})"


def _engine(name: str, metric: str, *matchers: str) -> str:
    return f"{metric}{MIXIN.engine_job(name, _ENGINE_INST, *matchers)}"


@dataclass(frozen=True)
class Annotation:
    """A Grafana annotation query: each series' value is the unix time of an event."""

    name: str
    expr: str
    title: str
    text: str
    color: str


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
    low_is_bad: bool = False  # thresholds mark the bottom (a ratio that must stay high)
    log_scale: bool = False

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
    annotations: tuple[Annotation, ...] = ()
    columns: int = 2
    extra: dict[str, str] = field(default_factory=dict)


def _q(expr: str, legend: str = LEGEND) -> tuple[Query, ...]:
    return (Query(expr, legend),)


def _round_marks(which: str, agg: str, color: str) -> Annotation:
    gauge = f"llmbench_scenario_round_{which}_timestamp_seconds{MIXIN.proxy(_ES)}"
    return Annotation(f"Round {which}s", f"{agg} by ({E}, scenario, round) ({gauge}) * 1000",
                      f"{{{{scenario}}}} #{{{{round}}}} {which}", LEGEND, color)


#: Each round's start and end, exact to the proxy's clock even for rounds shorter than a scrape
#:; the same round on several proxies: from the first start to the last end.
ROUND_ANNOTATIONS = (_round_marks("start", "min", "rgba(0, 160, 80, 0.8)"),
                     _round_marks("end", "max", "rgba(120, 120, 120, 0.6)"))

COMPARISON = Board(
    uid="llmbench-engine-comparison",
    title="LLM bench: engine comparison",
    variables=("datasource", "engine", "scenario"),
    annotations=ROUND_ANNOTATIONS,
    panels=(
        Panel("success_ratio", "Success ratio", "percentunit", kind="stat", width=6, height=4,
              queries=_q(f"{_count(_OK)} / {_count(_JUDGED)}"),
              description="Successful / (successful + failed) requests in the time range; client aborts excluded. "
                          "Exact counts, right across exporter restarts."),
        Panel("goodput_ratio", "Goodput (SLO met)", "percentunit", kind="stat", width=6, height=4,
              queries=_q(f"{_count(_MET)} / {_count(_JUDGED)}"), thresholds=(MIXIN.goodput_ratio_min,),
              low_is_bad=True,
              description=f"Requests that met the SLO (TTFT <= {SLO_TTFT_S:g} s and TPOT <= {SLO_TPOT_S * 1000:g} ms "
                          "by default; the config's slo and slo_by_scenario) / judged requests (every outcome but "
                          "client_abort): failures count against it. Exact counts in the time range."),
        Panel("failures_by_reason", "Failures by reason", "short", kind="stat", width=6, height=4,
              queries=_q(f"{_count(_FAILED, f'by ({E}, reason)')} > 0", f"{LEGEND} {{{{reason}}}}"),
              description="Failed requests in the time range by the first failing check."),
        Panel("empty_text", "Empty-text HTTP 200 responses", "short", kind="stat", width=6, height=4,
              queries=_q(_count(_EMPTY)),
              description="HTTP 200 streams with [DONE] and no visible text: counted as failures here, "
                          "as successes by clients that do not look at the text."),
        Panel("ttft_p95", "TTFT P95", "s", queries=_q(_p95("llmbench_time_to_first_token_seconds")),
              rule="engine:llmbench_time_to_first_token_seconds:p95_rate1m", thresholds=(SLO_TTFT_S,),
              description="Time to the first non-empty text, successful requests, P95 over 1-minute windows."),
        Panel("tpot_p95", "Per-request TPOT P95", "s", queries=_q(_p95("llmbench_time_per_output_token_seconds")),
              rule="engine:llmbench_time_per_output_token_seconds:p95_rate1m", thresholds=(SLO_TPOT_S,),
              description="Per-request average time per output token, P95 over 1-minute windows."),
        Panel("throughput", "Successful output throughput", "suffix: tok/s",
              queries=_q(_rate("llmbench_output_tokens_total", _OK_M)),
              rule="engine:llmbench_output_tokens:rate1m",
              description="Completion tokens of successful requests per second (server usage)."),
        Panel("e2e_p95", "Full-stream E2E P95", "s", queries=_q(_p95("llmbench_e2e_request_latency_seconds")),
              rule="engine:llmbench_e2e_request_latency_seconds:p95_rate1m",
              description="Request sent to the end of the stream after [DONE], successful requests."),
        Panel("goodput_ratio_1m", "Goodput ratio (1-minute windows)", "percentunit",
              queries=_q(_rate("llmbench_slo_requests_total", _MET_M) + " / " + _rate("llmbench_requests_total", _JUDGED_M)),
              rule="engine:llmbench_slo_requests:goodput_ratio_rate1m", thresholds=(MIXIN.goodput_ratio_min,),
              low_is_bad=True,
              description="SLO met / judged requests (failures count against it), 1-minute windows; "
                          "the LLMBenchGoodputLow alert watches this."),
        Panel("goodput_throughput", "Goodput throughput", "suffix: tok/s",
              queries=_q(_rate("llmbench_goodput_tokens_total")), rule="engine:llmbench_goodput_tokens:rate1m",
              description="Output tokens per second of the requests that met the SLO."),
        Panel("success_ratio_1m", "Success ratio (1-minute windows)", "percentunit",
              queries=_q(_rate("llmbench_requests_total", _OK_M) + " / " + _rate("llmbench_requests_total", _JUDGED_M)),
              rule="engine:llmbench_requests:success_ratio_rate1m"),
        Panel("failure_ratio", "Failure ratio by reason", "percentunit", per_engine_colors=False,
              queries=_q(f"sum by ({E}, reason) (rate({_FAILED}[{W}]))"
                         " / ignoring (reason) group_left " + _rate("llmbench_requests_total", _JUDGED_M),
                         f"{LEGEND} {{{{reason}}}}"),
              rule="engine_reason:llmbench_requests:failure_ratio_rate1m"),
        Panel("in_flight", "Requests in flight", "short",
              queries=_q(f"sum {BY_E} (llmbench_requests_in_flight{MIXIN.proxy(MIXIN.engine_matcher())})")),
    ),
)

_GPU_LEGEND = "{{Hostname}}{{hostname}} GPU {{gpu}}"
GPU = Board(
    uid="llmbench-gpu-resources",
    title="LLM bench: GPU resources",
    variables=("datasource", "host", "gpu"),
    panels=(
        Panel("gpu_fb_used", "Framebuffer used", "gbytes", per_engine_colors=False,
              queries=_q(_dcgm("DCGM_FI_DEV_FB_USED", " / 1024"), _GPU_LEGEND),
              description="DCGM_FI_DEV_FB_USED (MiB) / 1024, one series per GPU."),
        Panel("gpu_sm_clock", "SM clock", "hertz", per_engine_colors=False,
              queries=_q(_dcgm("DCGM_FI_DEV_SM_CLOCK", " * 1000000"), _GPU_LEGEND),
              description="DCGM_FI_DEV_SM_CLOCK (MHz), shown in Hz units so Grafana prints GHz."),
        Panel("gpu_util", "GPU utilisation", "percent", per_engine_colors=False,
              queries=_q(_dcgm("DCGM_FI_DEV_GPU_UTIL"), _GPU_LEGEND)),
        Panel("gpu_power", "Power draw", "watt", per_engine_colors=False,
              queries=_q(_dcgm("DCGM_FI_DEV_POWER_USAGE"), _GPU_LEGEND)),
        Panel("gpu_temp", "GPU temperature", "celsius", per_engine_colors=False,
              queries=_q(_dcgm("DCGM_FI_DEV_GPU_TEMP"), _GPU_LEGEND)),
    ),
)

_LAG = "llmbench_proxy_event_loop_lag_seconds"
INTERNALS = Board(
    uid="llmbench-engine-internals",
    title="LLM bench: engine internals",
    variables=("datasource", "engine", "instance", "engine_instance"),
    panels=(
        Panel("engine_running", "Running requests (engine)", "short", queries=(
            Query(f"sum({_engine('vllm', 'vllm:num_requests_running')})", "vllm running", "A"),
            Query(f"sum({_engine('sglang', 'sglang:num_running_reqs')})", "sglang running", "B"))),
        Panel("engine_waiting", "Waiting requests (engine queue)", "short", queries=(
            Query(f"sum({_engine('vllm', 'vllm:num_requests_waiting')})", "vllm waiting", "A"),
            Query(f"sum({_engine('sglang', 'sglang:num_queue_reqs')})", "sglang waiting", "B"))),
        Panel("engine_kv_cache", "KV-cache usage", "percentunit", queries=(
            # vLLM before the v1 metrics rename spells it gpu_cache_usage_perc
            Query(f"max({_engine('vllm', 'vllm:kv_cache_usage_perc')} or {_engine('vllm', 'vllm:gpu_cache_usage_perc')})",
                  "vllm kv cache", "A"),
            Query(f"max({_engine('sglang', 'sglang:token_usage')})", "sglang token usage", "B"))),
        Panel("engine_ttft_vs_proxy", "TTFT P95: engine-side vs proxy, and queue time", "s", queries=(
            Query(f"histogram_quantile(0.95, sum by (le) (rate({_engine('vllm', 'vllm:time_to_first_token_seconds_bucket')}[{W}])))",
                  "vllm engine TTFT", "A"),
            Query(f"histogram_quantile(0.95, sum by (le) (rate({_engine('sglang', 'sglang:time_to_first_token_seconds_bucket')}[{W}])))",
                  "sglang engine TTFT", "B"),
            Query(f"histogram_quantile(0.95, sum by (le) (rate({_engine('vllm', 'vllm:request_queue_time_seconds_bucket')}[{W}])))",
                  "vllm queue time", "C"),
            Query(_p(0.95, "llmbench_time_to_first_token_seconds", E, MIXIN.engine_matcher(), _INST),
                  f"{LEGEND} proxy TTFT", "D")),
              description="How much of a long TTFT was queueing: engine-side TTFT and queue time beside the proxy's."),
        Panel("engine_generation", "Generation throughput (engine)", "suffix: tok/s", queries=(
            Query(f"sum(rate({_engine('vllm', 'vllm:generation_tokens_total')}[{W}]))", "vllm generated", "A"),
            Query(f"sum(rate({_engine('sglang', 'sglang:generation_tokens_total')}[{W}]))", "sglang generated", "B"))),
        Panel("engine_prompt", "Prompt throughput (engine)", "suffix: tok/s", queries=(
            Query(f"sum(rate({_engine('vllm', 'vllm:prompt_tokens_total')}[{W}]))", "vllm prompt", "A"),
            Query(f"sum(rate({_engine('sglang', 'sglang:prompt_tokens_total')}[{W}]))", "sglang prompt", "B"))),
        Panel("proxy_timing_error", "Proxy timing error", "s", log_scale=True, width=24,
              thresholds=(MIXIN.proxy_lag_max_s,), rule=f"instance_worker:{_LAG}:p99_rate1m", queries=(
                  Query(_p(0.99, _LAG, f"{MIXIN.instance_label}, worker", _INST),
                        "loop lag P99 {{instance}} {{worker}}", "A"),
                  Query(_p(0.95, "llmbench_time_to_first_token_seconds", E, MIXIN.engine_matcher(), _INST),
                        f"{LEGEND} TTFT P95", "B")),
              description="How late the proxy's timestamps can be: its event-loop lag P99 per proxy (and worker), "
                          "beside the TTFT it measures (log scale). Records carry the per-request bound "
                          "timing_uncertainty_s; the LLMBenchProxyLagging alert fires above "
                          f"{MIXIN.proxy_lag_max_s * 1000:g} ms for 5 minutes."),
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
