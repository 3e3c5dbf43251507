"""The selectors and knobs every board and rule is built with, in one place (kubernetes-mixin style).

Change the job labels or the engine label here (or build a :class:`MixinConfig` of your own)
and the boards, the recording and alert rules, the rule tests and the evidence export follow.
Regenerate with ``llm-bench-exporter dashboards --rules``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MixinConfig", "CONFIG"]


@dataclass(frozen=True)
class MixinConfig:
    #: the Prometheus job that scrapes the proxies (prometheus/prometheus.yml)
    job: str = "llmbench-exporter"
    #: the jobs that scrape the engines' own /metrics (engine-internals board)
    vllm_job: str = "vllm"
    sglang_job: str = "sglang"
    #: the label that names an engine on the proxy's series
    engine_label: str = "engine"
    #: the label that tells proxies (and engine servers) apart
    instance_label: str = "instance"
    #: the step of the restart-safe exact counts: at most the scrape interval
    count_step: str = "5s"
    #: LLMBenchGoodputLow fires below this goodput ratio (SLO met / judged) for 5 minutes
    goodput_ratio_min: float = 0.9
    #: LLMBenchProxyLagging fires when the requests' timing error P95 (per engine) is above this for 5 minutes
    proxy_lag_max_s: float = 0.001
    #: the SLO every board, rule and round table draws, and the proxy's default ``slo`` (the seed's)
    slo_ttft_s: float = 3.0
    slo_tpot_s: float = 0.050

    @property
    def job_selector(self) -> str:
        return f'job="{self.job}"'

    @property
    def by_engine(self) -> str:
        """The grouping every board and rule aggregates proxies with: ``by (engine)``."""
        return f"by ({self.engine_label})"

    @property
    def engine_legend(self) -> str:
        return "{{" + self.engine_label + "}}"

    def proxy(self, *matchers: str) -> str:
        """A selector of the proxies' series: the job, then ``matchers``."""
        return "{" + ", ".join((self.job_selector, *matchers)) + "}"

    def engine_matcher(self, variable: str = "$engine") -> str:
        return f'{self.engine_label}=~"{variable}"'

    def engine_job(self, name: str, *matchers: str) -> str:
        """A selector of an engine's own series (``vllm`` or ``sglang``)."""
        job = self.vllm_job if name == "vllm" else self.sglang_job
        return "{" + ", ".join((f'job="{job}"', *matchers)) + "}"


CONFIG = MixinConfig()
