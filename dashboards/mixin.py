"""The selectors every board and rule is built with, in one place (kubernetes-mixin style).

Change the job label or the engine label here (or build a :class:`MixinConfig` of your own)
and the boards, the recording and alert rules, the rule tests and the evidence export follow.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MixinConfig", "CONFIG"]


@dataclass(frozen=True)
class MixinConfig:
    #: the Prometheus job that scrapes the proxies (prometheus/prometheus.yml)
    job: str = "llmbench-exporter"
    #: the label that names an engine on the proxy's series
    engine_label: str = "engine"

    @property
    def job_selector(self) -> str:
        return f'job="{self.job}"'


CONFIG = MixinConfig()
