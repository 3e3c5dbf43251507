"""THE Prometheus HTTP API client of the evidence tool (and of the tests): clear errors,
any Prometheus-compatible backend (Prometheus, VictoriaMetrics, Thanos, Mimir).

* The base URL may carry a path prefix (``http://host/prometheus``, ``http://vm:8428/vm``).
* Extra headers (``--header X-Scope-OrgID:tenant``) go with every request.
* A bearer token is read from ``$LLMBENCH_PROM_TOKEN``; it is sent, never stored in an
  attribute that outputs print, never put in a message.  :attr:`Prometheus.url` has any
  ``user:password@`` removed, so it is safe to print and to write into manifests.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests
import yaml

__all__ = ["PromError", "Prometheus", "MAX_POINTS", "TOKEN_ENV", "parse_header", "parse_duration"]

#: Prometheus refuses range queries of more than 11,000 points per series.
MAX_POINTS = 11_000
#: The environment variable holding a bearer token for the query API.
TOKEN_ENV = "LLMBENCH_PROM_TOKEN"


class PromError(Exception):
    """Prometheus could not be reached or refused the query; the message says which."""


def parse_header(text: str) -> tuple[str, str]:
    """``NAME:VALUE`` -> (name, value); a ValueError names what is wrong (never the value)."""
    name, sep, value = text.partition(":")
    name = name.strip()
    if not sep or not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", name):
        raise ValueError(f"--header wants NAME:VALUE with a token NAME (got a header named {name[:40]!r})")
    if any(ord(c) < 32 and c != "\t" for c in value):
        raise ValueError(f"--header {name}: the value has a control character")
    return name, value.strip()


def _safe_url(url: str) -> str:
    parts = urlsplit(url.rstrip("/"))
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class Prometheus:
    """Queries one Prometheus-compatible API; ``url`` is the base, path prefix included."""

    def __init__(self, url: str, timeout_s: float = 30.0, headers: dict[str, str] | None = None,
                 token: str | None = None) -> None:
        self._base = url.rstrip("/")
        self.url = _safe_url(url)
        self.timeout_s = timeout_s
        self.session = requests.Session()
        self.session.headers.update(headers or {})
        self.header_names = sorted(headers or {})
        token = os.environ.get(TOKEN_ENV) if token is None else token
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"
            self.header_names.append("Authorization (bearer token from $" + TOKEN_ENV + ")")
        self.extra_params: dict[str, str] = {}

    def _get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        try:
            r = self.session.get(f"{self._base}{path}", params={**(params or {}), **self.extra_params},
                                 timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise PromError(f"cannot reach Prometheus at {self.url}: {type(exc).__name__}") from None
        if r.status_code in (401, 403):
            raise PromError(f"{self.url}{path}: HTTP {r.status_code}: not authorised "
                            f"(set ${TOKEN_ENV} or --header as the backend wants)")
        try:
            doc = r.json()
        except ValueError:
            raise PromError(f"{self.url}{path}: HTTP {r.status_code}, not a Prometheus API answer "
                            "(is the path prefix right?)") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            doc = doc if isinstance(doc, dict) else {}
            raise PromError(f"Prometheus refused {params.get('query') if params else path!r}: "
                            f"{doc.get('errorType', 'error')}: {doc.get('error', r.status_code)}")
        return doc.get("data")

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
        """The build info; empty where the backend answers with an empty document (VictoriaMetrics)."""
        try:
            data = self._get("/api/v1/status/buildinfo")
        except PromError as exc:
            if "cannot reach" in str(exc) or "not authorised" in str(exc):
                raise
            return {}
        return dict(data) if isinstance(data, dict) else {}

    def backend(self) -> dict[str, Any]:
        """``{"name", "version", "revision", "how"}``: which backend answered, where the API tells."""
        build = self.buildinfo()
        if build.get("version"):
            name = str(build.get("application") or "Prometheus")
            return {"name": name, "version": str(build["version"]), "revision": build.get("revision"),
                    "how": "status/buildinfo"}
        name = "unknown Prometheus-compatible backend"
        try:
            tsdb = self._get("/api/v1/status/tsdb")
            if isinstance(tsdb, dict) and "totalSeries" in tsdb and "headStats" not in tsdb:
                name = "VictoriaMetrics"
        except PromError:
            pass
        return {"name": name, "version": None, "revision": None,
                "how": "status/buildinfo is empty; backend told by status/tsdb's shape"}

    def scrape_intervals(self) -> dict[str, float]:
        """Each scrape job's interval in seconds, from the running configuration ({} when the
        backend does not serve its configuration, as VictoriaMetrics and remote stores do)."""
        try:
            data = self._get("/api/v1/status/config")
            cfg = yaml.safe_load((data or {}).get("yaml") or "") or {}
        except (PromError, yaml.YAMLError, AttributeError) as exc:
            if "cannot reach" in str(exc) or "not authorised" in str(exc):
                raise
            return {}
        if not isinstance(cfg, dict):
            return {}
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
