"""The panel catalogue: every query the boards, the recording rules, the rule tests and the
evidence export use.  Each PromQL expression is written once, here.

Board expressions carry Grafana variables (``$engine``, ``$scenario``, ``$instance``,
``$engine_instance``, ``$host``, ``$gpu``, ``$__range``); :func:`expand` fills them in for
Prometheus itself (all values selected).  Selectors and groupings come from the mixin
(:mod:`dashboards.mixin`); every query sums the proxies by engine, so any number of proxy
instances add up.
"""

from __future__ import annotations

from .mixin import CONFIG as MIXIN
from .promql import COUNT_STEP, Annotation, Board, Panel, Query, Row, exact_count, expand, for_job

__all__ = [
    "ENGINE_COLORS", "LINE_STYLES", "DATASOURCE_UID", "VM_DATASOURCE_UID", "RATE_WINDOW", "COUNT_STEP", "Query",
    "Panel", "Board", "Annotation", "BOARDS", "PANELS", "ROUND_ANNOTATIONS", "ENGINE_ANNOTATIONS", "expand",
    "exact_count", "SLO_TTFT_S", "SLO_TPOT_S", "MIXIN", "Row", "for_job", "boards_for", "GPU_ENERGY_MJ",
    "GPU_MODELS",
]

#: Fixed colours: SGLang blue, vLLM orange (Grafana and the PNG evidence alike).
ENGINE_COLORS: dict[str, str] = {"sglang": "#1f77b4", "vllm": "#ff7f0e"}
#: Where one engine has several series on a panel: legend word -> line style.
LINE_STYLES: dict[str, str] = {"mean": "dashdot", "proxy": "dash", "queue": "dot", "max": "dot",
                               "completions": "dash"}
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
_ITL = "llmbench_inter_token_latency_seconds"


def _count(selector: str, by: str = BY_E) -> str:
    return f"sum {by} ({exact_count(selector)})"


def _dcgm(metric: str, scale: str = "") -> str:
    # dcgm-exporter versions spell the host label Hostname or hostname: accept both.  Two proxies
    # on one host report the same GPU: one series per host and GPU.
    return f"max by (Hostname, hostname, gpu) ({metric}{_HOST}{scale} or {metric}{_HOST_LC}{scale})"


def _engine(name: str, metric: str, *matchers: str) -> str:
    """An engine's own series.  vLLM spells its names ``vllm:NAME``; SGLang servers are seen with
    ``sglang:NAME`` and ``sglang_NAME``, so its selector matches both (a server has one)."""
    if name == "sglang":
        return MIXIN.engine_job(name, f'__name__=~"sglang[:_]{metric}"', _ENGINE_INST, *matchers)
    return f"vllm:{metric}{MIXIN.engine_job(name, _ENGINE_INST, *matchers)}"


def _engine_p95(name: str, metric: str) -> str:
    return f"histogram_quantile(0.95, sum by (le) (rate({_engine(name, metric + '_bucket')}[{W}])))"


def _engine_mean(name: str, metric: str) -> str:
    """The exact mean, where a coarse histogram's P95 can only say "inside the first bucket"."""
    return f"sum(rate({_engine(name, metric + '_sum')}[{W}])) / sum(rate({_engine(name, metric + '_count')}[{W}]))"


def _p95_and_mean(name: str, metric: str, what: str, refs: str) -> tuple[Query, Query]:
    return (Query(_engine_p95(name, metric), f"{name} {what} P95", refs[0]),
            Query(_engine_mean(name, metric), f"{name} {what} mean", refs[1]))


#: Where a successful request's TTFT went, by the engine's own clock: (legend word, proxy histogram).
_TTFT_PARTS = (("queue", "llmbench_engine_queue_seconds"), ("prefill", "llmbench_engine_prefill_seconds"),
               ("outside engine", "llmbench_ttft_outside_engine_seconds"))
_PARTS_NOTE = ("queue: the engine held the request before scheduling it; prefill: from scheduling to its first "
               "output token; outside engine: the proxy's TTFT minus both (the HTTP server, tokenizing, the "
               "hand-offs between the engine's processes, detokenizing, the network). Successful requests whose "
               "engine tells its own clock in the stream (vLLM started with --enable-per-request-metrics); SGLang "
               "writes it to its request log only, which `evidence summarize --engine-log DIR` joins after the run.")


def _ttft_parts(p95: bool) -> tuple[Query, ...]:
    """Per engine that told its clock in the window: an engine that never does (SGLang, live) has
    no series rather than a NaN one."""
    def told(metric: str) -> str:
        return f"{_rate(metric + '_count')} > 0"

    def p95_of(metric: str) -> str:
        buckets = f"sum by ({E}, le) (rate({metric}_bucket{MIXIN.proxy(_ES)}[{W}]))"
        return f"histogram_quantile(0.95, {buckets} and on ({E}) {told(metric)})"

    def mean_of(metric: str) -> str:
        return f"{_rate(metric + '_sum')} / {_rate(metric + '_count')} and {told(metric)}"

    return tuple(Query(p95_of(metric) if p95 else mean_of(metric), f"{LEGEND} {word} {'P95' if p95 else 'mean'}", ref)
                 for (word, metric), ref in zip(_TTFT_PARTS, "ABC"))


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

_ENGINE_UP = f"llmbench_engine_up{MIXIN.proxy(MIXIN.engine_matcher())}"
#: An engine the proxy's health probe (once a second) found down: a red region while it is down, and
#: a green one for the minute after it came back (its start, seen by the proxy).
ENGINE_ANNOTATIONS = (
    Annotation("Engine down", f"min {BY_E} ({_ENGINE_UP}) == 0", f"{LEGEND} down",
               "the proxy's health probe got no answer, or a 5xx", "rgba(220, 40, 40, 0.8)",
               value_is_time=False, tags=E),
    Annotation("Engine back up", f"(max {BY_E} ({_ENGINE_UP}) == 1) and on ({E}) "
               f"(min {BY_E} (min_over_time({_ENGINE_UP}[{W}])) == 0)", f"{LEGEND} up again",
               "the engine answers the proxy's health probe again (GET /-/engines: its time to ready)",
               "rgba(0, 160, 80, 0.6)", value_is_time=False, tags=E),
)

COMPARISON = Board(
    uid="llmbench-engine-comparison",
    title="LLM bench: engine comparison",
    variables=("datasource", "engine", "scenario"),
    annotations=ROUND_ANNOTATIONS + ENGINE_ANNOTATIONS,
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
        Panel("failure_ratio", "Failure ratio by reason", "percentunit", per_engine_colors=False, top=5,
              queries=_q(f"sum by ({E}, reason) (rate({_FAILED}[{W}]))"
                         " / ignoring (reason) group_left " + _rate("llmbench_requests_total", _JUDGED_M),
                         f"{LEGEND} {{{{reason}}}}"),
              rule="engine_reason:llmbench_requests:failure_ratio_rate1m"),
        Panel("ttft_parts", "Where TTFT goes", "s", per_engine_colors=False, stack=True, from_zero=True,
              queries=_ttft_parts(p95=False),
              description="Per engine, the exact mean (rate of _sum / rate of _count, 1-minute windows) of each "
                          "part of TTFT, stacked: queue, prefill, outside the engine add up to the mean TTFT of "
                          "these requests. " + _PARTS_NOTE),
        Panel("ttft_parts_p95", "Where TTFT goes: P95 of each part", "s", per_engine_colors=False,
              queries=_ttft_parts(p95=True),
              description="Per engine, the P95 of each part of TTFT over 1-minute windows, side by side (P95s do "
                          "not add up: the stacked means beside them do). " + _PARTS_NOTE),
        Panel("cached_share", "Prompt tokens from the prefix cache", "percentunit", width=24, from_zero=True,
              queries=_q(f"{_rate('llmbench_prompt_tokens_cached_total')} / {_rate('llmbench_prompt_tokens_total')}"),
              description="The share of the prompt tokens that each engine took from its prefix cache, 1-minute "
                          "windows (usage.prompt_tokens_details.cached_tokens over prompt_tokens). Multi-turn "
                          "sessions resend their history: a high share is the cache at work, a low one a cache "
                          "too small or sessions spread over replicas. 0 where the engine does not report cached "
                          "tokens: vLLM needs --enable-prompt-tokens-details, SGLang --enable-cache-report."),
        Panel("offered_load", "Arrivals and completions", "reqps", width=8, queries=(
            Query(_rate("llmbench_arrivals_total"), f"{LEGEND} arrivals/s", "A"),
            Query(_rate("llmbench_requests_total"), f"{LEGEND} completions/s", "B")),
              description="Requests per second as they arrive at the proxy (the load offered: what the engine "
                          "received) and as they finish, whatever the outcome, 1-minute windows. Arrivals above "
                          "completions for long: the engine falls behind and requests pile up in flight."),
        Panel("in_flight", "Requests in flight", "short", width=8,
              queries=_q(f"sum {BY_E} (llmbench_requests_in_flight{MIXIN.proxy(MIXIN.engine_matcher())})"),
              description="Requests between their arrival and their last byte: a closed loop holds it at its "
                          "concurrency."),
        Panel("client_backpressure", "Client back-pressure per request", "s", width=8, queries=(
            Query(_p95("llmbench_client_backpressure_seconds"), f"{LEGEND} back-pressure P95", "A"),
            Query(f"{_rate('llmbench_client_backpressure_seconds_sum')} / "
                  f"{_rate('llmbench_client_backpressure_seconds_count')}", f"{LEGEND} back-pressure mean", "B")),
              description="Time each request's bytes waited for the client to take them (its socket full), P95 "
                          "and mean over 1-minute windows. Above zero, the client is the bottleneck: its own "
                          "figures and its closed loop are not the engine's; records mark such requests "
                          "client_bound."),
        Panel("itl_p95_p99", "Inter-token latency P95 and P99", "s", width=12, thresholds=(SLO_TPOT_S,), queries=(
            Query(_p95(_ITL), f"{LEGEND} ITL P95", "A"),
            Query(_p(0.99, _ITL, E, _ES), f"{LEGEND} ITL P99", "B")),
              description="Every per-token gap of successful streams, pooled over requests, 1-minute windows: a gap "
                          "between two visible-text arrivals counts once for each token of the later arrival, at "
                          "the gap divided by those tokens (several tokens in one event, or events merged in one "
                          "read, never make zero gaps). TPOT is each request's mean; these are its tails."),
        Panel("ttft_vs_ttfo", "TTFT and time to first output token, P95", "s", width=12, thresholds=(SLO_TTFT_S,),
              queries=(Query(_p95("llmbench_time_to_first_token_seconds"), f"{LEGEND} TTFT P95", "A"),
                       Query(_p95("llmbench_time_to_first_output_token_seconds"), f"{LEGEND} TTFO P95", "B")),
              description="TTFT counts the first visible text, reasoning included; TTFO the first answer text after "
                          "any reasoning (chat-like streams that carry answer text). The distance between them is "
                          "the time a reasoning model thought before it answered."),
    ),
    rows=(Row("Offered load", "offered_load"),),
)

_GPU_LEGEND = "{{Hostname}}{{hostname}} GPU {{gpu}}"
GPU = Board(
    uid="llmbench-gpu-resources",
    title="LLM bench: GPU resources",
    variables=("datasource", "host", "gpu"),
    panels=(
        Panel("gpu_fb_used", "Framebuffer used", "gbytes", per_engine_colors=False, from_zero=True,
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

#: Not on a board, read by the report's energy per output token: each GPU's energy counter
#: (dcgm-exporter's DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ since the driver loaded), and the GPU
#: models scraped (the proxy's simulated GPUs say "(simulated)" in theirs).
GPU_ENERGY_MJ = _dcgm("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
GPU_MODELS = f"count by (modelName) (DCGM_FI_DEV_POWER_USAGE{_HOST} or DCGM_FI_DEV_POWER_USAGE{_HOST_LC})"

_LAG = "llmbench_proxy_event_loop_lag_seconds"
_UNCERTAINTY = "llmbench_request_timing_uncertainty_seconds"
_ADDED = "llmbench_proxy_added_seconds"
_UNCERTAINTY_SEL = (MIXIN.engine_matcher(), _INST)
INTERNALS = Board(
    uid="llmbench-engine-internals",
    title="LLM bench: engine internals",
    variables=("datasource", "engine", "instance", "engine_instance"),
    annotations=ENGINE_ANNOTATIONS,
    panels=(
        Panel("engine_running", "Running requests (engine)", "short", queries=(
            Query(f"sum({_engine('vllm', 'num_requests_running')})", "vllm running", "A"),
            Query(f"sum({_engine('sglang', 'num_running_reqs')})", "sglang running", "B"))),
        Panel("engine_waiting", "Waiting requests (engine queue)", "short", queries=(
            Query(f"sum({_engine('vllm', 'num_requests_waiting')})", "vllm waiting", "A"),
            Query(f"sum({_engine('sglang', 'num_queue_reqs')})", "sglang waiting", "B"))),
        Panel("engine_kv_cache", "KV-cache usage", "percentunit", queries=(
            # vLLM before the v1 metrics rename spells it gpu_cache_usage_perc
            Query(f"max({_engine('vllm', 'kv_cache_usage_perc')} or {_engine('vllm', 'gpu_cache_usage_perc')})",
                  "vllm kv cache", "A"),
            Query(f"max({_engine('sglang', 'token_usage')})", "sglang token usage", "B"))),
        Panel("engine_ttft_vs_proxy", "TTFT P95: engine-side vs proxy, and queue time", "s", queries=(
            *_p95_and_mean("vllm", "time_to_first_token_seconds", "engine TTFT", "AE"),
            *_p95_and_mean("sglang", "time_to_first_token_seconds", "engine TTFT", "BF"),
            *_p95_and_mean("vllm", "request_queue_time_seconds", "queue time", "CG"),
            Query(_p(0.95, "llmbench_time_to_first_token_seconds", E, MIXIN.engine_matcher(), _INST),
                  f"{LEGEND} proxy TTFT", "D")),
              description="How much of a long TTFT was queueing: engine-side TTFT and queue time beside the proxy's. "
                          "Beside each engine-side P95, the exact mean (rate of _sum / rate of _count): an engine "
                          "histogram's P95 that lies in its first bucket (vLLM's queue time starts at 0.3 s) only "
                          "says \"below that bound\", while the mean is exact."),
        Panel("decode_stalls", "Decode stalls beside the engines' load", "short", width=24,
              right_unit=("short", "requests"), queries=(
                  Query(f"sum {BY_E} (rate(llmbench_decode_stalls_total{MIXIN.proxy(MIXIN.engine_matcher())}[{W}]))",
                        f"{LEGEND} stalls/s", "A"),
                  Query(f"sum({_engine('vllm', 'num_requests_running')})", "vllm running", "B", right=True),
                  Query(f"sum({_engine('sglang', 'num_running_reqs')})", "sglang running", "C", right=True),
                  Query(f"sum({_engine('vllm', 'num_requests_waiting')})", "vllm waiting", "D", right=True),
                  Query(f"sum({_engine('sglang', 'num_queue_reqs')})", "sglang waiting", "E", right=True)),
              description="Gaps between two visible-text arrivals longer than the proxy's stall_s (0.5 s by "
                          "default) per second, every finished request, beside each engine's running and waiting "
                          "requests (right axis) and above its prompt throughput: stalls that rise with waiting "
                          "requests and prompt tokens are decode steps held up by other requests' prefills."),
        Panel("engine_generation", "Generation throughput (engine)", "suffix: tok/s", queries=(
            Query(f"sum(rate({_engine('vllm', 'generation_tokens_total')}[{W}]))", "vllm generated", "A"),
            Query(f"sum(rate({_engine('sglang', 'generation_tokens_total')}[{W}]))", "sglang generated", "B"))),
        Panel("engine_prompt", "Prompt throughput (engine)", "suffix: tok/s", queries=(
            Query(f"sum(rate({_engine('vllm', 'prompt_tokens_total')}[{W}]))", "vllm prompt", "A"),
            Query(f"sum(rate({_engine('sglang', 'prompt_tokens_total')}[{W}]))", "sglang prompt", "B"))),
        Panel("proxy_timing_error", "Proxy timing error", "s", width=24, right_unit=("ms", "timing error"),
              thresholds=(MIXIN.proxy_lag_max_s,), rule=f"instance_worker:{_LAG}:p99_rate1m", queries=(
                  Query(_p(0.99, _LAG, f"{MIXIN.instance_label}, worker", _INST),
                        "loop lag P99 {{instance}} {{worker}}", "A", right=True),
                  Query(_p(0.95, _UNCERTAINTY, E, *_UNCERTAINTY_SEL), f"{LEGEND} timing error P95", "B",
                        rule=f"engine:{_UNCERTAINTY}:p95_rate1m", right=True),
                  Query(_p(1, _UNCERTAINTY, E, *_UNCERTAINTY_SEL), f"{LEGEND} timing error max", "C", right=True),
                  Query(_p(0.95, "llmbench_time_to_first_token_seconds", E, MIXIN.engine_matcher(), _INST),
                        f"{LEGEND} proxy TTFT P95", "D"),
                  Query(_p(0.95, _ADDED, E, *_UNCERTAINTY_SEL), f"{LEGEND} proxy added P95", "E", right=True)),
              description="How late the proxy's timestamps can be, as the requests felt it: the P95 and the max "
                          "(to its bucket's bound) of each finished request's timing_uncertainty_s (the largest "
                          "loop lag while it was in flight), beside the event-loop lag P99 per proxy (and worker), "
                          "on the right axis, with the P95 of what the proxy added to the TTFT its clients saw "
                          "(proxy_added_s: the request's hold before it left for the engine, and the first text's "
                          "before it left for the client; a client's TTFT is the record's ttft_s plus it); the TTFT "
                          "they bound on the left. A short stall is a tiny share of the "
                          "loop's samples but the whole story for every request in flight during it. The "
                          f"LLMBenchProxyLagging alert fires when the timing error P95 is above "
                          f"{MIXIN.proxy_lag_max_s * 1000:g} ms for 5 minutes."),
    ),
)

BOARDS: dict[str, Board] = {"comparison": COMPARISON, "gpu": GPU, "internals": INTERNALS}
PANELS: dict[str, Panel] = {p.key: p for b in BOARDS.values() for p in b.panels}


def boards_for(job: str | None = None) -> dict[str, Board]:
    """The boards on the proxies of Prometheus job ``job`` (default: the mixin's)."""
    return for_job(BOARDS, job)
