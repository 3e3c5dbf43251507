"""A small Prometheus HTTP API client with clear errors (for the evidence tool)."""

from __future__ import annotations

import math
import re
from typing import Any

import requests
import yaml

__all__ = ["PromError", "Prometheus", "MAX_POINTS"]

#: Prometheus refuses range queries of more than 11,000 points per series.
MAX_POINTS = 11_000


class PromError(Exception):
    """Prometheus could not be reached or refused the query; the message says which."""


class Prometheus:
    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.session = requests.Session()

    def _get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        try:
            r = self.session.get(f"{self.url}{path}", params=params, timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise PromError(f"cannot reach Prometheus at {self.url}: {type(exc).__name__}") from None
        try:
            doc = r.json()
        except ValueError:
            raise PromError(f"{self.url}{path}: HTTP {r.status_code}, not a Prometheus API answer") from None
        if doc.get("status") != "success":
            raise PromError(f"Prometheus refused {params.get('query') if params else path!r}: "
                            f"{doc.get('errorType', 'error')}: {doc.get('error', r.status_code)}")
        return doc["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return list(self._get("/api/v1/query", params)["result"])

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        points = math.floor((end - start) / step) + 1
        if points > MAX_POINTS:
            raise PromError(f"step {step:g}s gives {points} points per series over the window; "
                            f"Prometheus allows {MAX_POINTS}: use a step of at least {math.ceil((end - start) / (MAX_POINTS - 1))}s")
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return list(self._get("/api/v1/query_range", params)["result"])

    def buildinfo(self) -> dict[str, Any]:
        return dict(self._get("/api/v1/status/buildinfo"))

    def scrape_intervals(self) -> dict[str, float]:
        """Each scrape job's interval in seconds, from the running configuration."""
        cfg = yaml.safe_load(self._get("/api/v1/status/config")["yaml"]) or {}
        default = parse_duration(str((cfg.get("global") or {}).get("scrape_interval", "1m")))
        return {j["job_name"]: parse_duration(str(j.get("scrape_interval", f"{default}s")))
                for j in cfg.get("scrape_configs") or []}


_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def parse_duration(text: str) -> float:
    """Prometheus durations: ``90s``, ``1m30s``, ``1.5h`` (a float part allowed), ``250ms``."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)", text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ValueError(f"not a duration: {text!r} (e.g. 30m, 2h, 90s)")
    return sum(float(n) * _UNITS[u] for n, u in parts)
