"""Running the stack's processes on one machine: free ports, children, Prometheus's config.

Used by ``llm-bench-exporter demo`` and by the tests that feed a real Prometheus.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

import requests
import yaml

__all__ = ["REPO_FILES", "ENGINES", "free_port", "Child", "LocalStack", "render_prometheus_config", "wait_http",
           "start_prometheus", "wait_for_scrapes", "scrapes_since", "rules_evaluated_after"]

#: prometheus/ and dashboards/ next to the package (a source checkout or an editable install).
REPO_FILES = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout_s: float = 30.0, child: Child | None = None) -> None:
    """Poll ``url`` until it answers 200; fail early if ``child`` died."""
    deadline = time.monotonic() + timeout_s
    last: str = ""
    while time.monotonic() < deadline:
        if child is not None and child.proc.poll() is not None:
            raise RuntimeError(f"{child.name} exited with status {child.proc.returncode}; log: {child.log_path}")
        try:
            r = requests.get(url, timeout=2)
            if r.status_code == 200:
                return
            last = f"HTTP {r.status_code}"
        except requests.RequestException as exc:
            last = type(exc).__name__
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout_s:.0f} s ({last})")


class Child:
    """A child process with its output in a log file; stopped with SIGTERM, then SIGKILL."""

    def __init__(self, name: str, argv: Sequence[str], log_dir: Path, env: Mapping[str, str] | None = None) -> None:
        self.name = name
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name}.log"
        self._log: IO[bytes] = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            list(argv), stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})}, start_new_session=True,
        )

    def stop(self, timeout_s: float = 10.0) -> int | None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        self._log.close()
        return self.proc.returncode


def exporter_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "exporter.cli", *args]


def render_prometheus_config(targets: Mapping[str, Sequence[str]], out_dir: Path,
                             template: Path | None = None, scrape_interval: str | None = None) -> Path:
    """Copy the repo's prometheus.yml and rules to ``out_dir`` with each job's targets replaced.

    A job absent from ``targets`` is dropped (e.g. dcgm-exporter when there is no GPU).
    """
    template = template or REPO_FILES / "prometheus" / "prometheus.yml"
    doc: dict[str, Any] = yaml.safe_load(template.read_text(encoding="utf-8"))
    jobs = []
    for job in doc["scrape_configs"]:
        name = job["job_name"]
        if name in targets:
            job["static_configs"] = [{"targets": list(targets[name])}]
            if scrape_interval:
                job["scrape_interval"] = scrape_interval
                job["scrape_timeout"] = scrape_interval
            jobs.append(job)
    unknown = set(targets) - {j["job_name"] for j in doc["scrape_configs"]}
    if unknown:
        raise ValueError(f"no such scrape jobs in {template}: {sorted(unknown)}")
    doc["scrape_configs"] = jobs
    if scrape_interval:
        doc["global"].update(scrape_interval=scrape_interval, scrape_timeout=scrape_interval,
                             evaluation_interval=scrape_interval)
    out_dir.mkdir(parents=True, exist_ok=True)
    rules_src = template.parent / "rules"
    if rules_src.is_dir():
        shutil.copytree(rules_src, out_dir / "rules", dirs_exist_ok=True)
    path = out_dir / "prometheus.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def start_prometheus(config: Path, data_dir: Path, port: int, log_dir: Path) -> Child:
    """Debian's ``prometheus`` on loopback; raises FileNotFoundError when it is not installed."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise FileNotFoundError("prometheus")
    child = Child("prometheus", [
        binary, f"--config.file={config}", f"--storage.tsdb.path={data_dir}",
        f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle",
        "--storage.tsdb.retention.time=7d",
    ], log_dir)
    wait_http(f"http://127.0.0.1:{port}/-/ready", 60, child)
    return child


def wait_for_scrapes(prom_url: str, targets: int, timeout_s: float = 60.0) -> None:
    """Prometheus staggers first scrapes over an interval: wait until ``targets`` are up,
    so that load started afterwards is seen from its first request."""
    from exporter.evidence.promapi import PromError, Prometheus

    prom = Prometheus(prom_url, timeout_s=5)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            result = prom.query("sum(up)")
            if result and float(result[0]["value"][1]) >= targets:
                return
        except (PromError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"Prometheus at {prom_url} did not scrape {targets} targets within {timeout_s:.0f} s")


def scrapes_since(prom_url: str, instance: str, since: float, n: int = 1, rules: bool = False,
                  timeout_s: float = 60.0) -> float:
    """Wait until ``prom_url`` (Prometheus or VictoriaMetrics) holds ``n`` scrapes of ``instance``
    that started after ``since`` (unix seconds) and succeeded (``up`` 1), and, with ``rules``, every rule group there has
    been evaluated after the last of them; return that scrape's timestamp.  A scrape's samples
    carry its start, so its counters were read after ``since``: what happened before is in."""
    from exporter.evidence.promapi import Prometheus

    prom = Prometheus(prom_url)
    deadline = time.monotonic() + timeout_s
    stamps: list[float] = []
    while time.monotonic() < deadline:
        window = max(60, int(time.time() - since) + 60)
        series = prom.query(f'up{{instance="{instance}"}}[{window}s]')
        stamps = sorted(float(t) for s in series for t, v in s.get("values", []) if float(t) > since and v == "1")
        if len(stamps) >= n and (not rules or rules_evaluated_after(prom_url, stamps[n - 1])):
            return stamps[n - 1]
        time.sleep(0.1)
    raise TimeoutError(f"{len(stamps)} of {n} scrapes of {instance} after {since:.3f}"
                       f"{' and the rules evaluated after them' if rules else ''} within {timeout_s:.0f} s")


def rules_evaluated_after(prom_url: str, at: float) -> bool:
    """Every rule group of the Prometheus at ``prom_url`` has been evaluated after ``at``."""
    groups = requests.get(f"{prom_url}/api/v1/rules", timeout=10).json()["data"]["groups"]

    def unix(stamp: str) -> float:  # RFC 3339 with nanoseconds; fromisoformat takes microseconds
        head, _, frac = stamp.rstrip("Z").partition(".")
        return datetime.fromisoformat(head).replace(tzinfo=timezone.utc).timestamp() + float(f"0.{frac or 0}")

    return bool(groups) and all(unix(g["lastEvaluation"]) > at for g in groups)


ENGINES = ("sglang", "vllm")


class LocalStack:
    """A simulated SGLang and vLLM, the proxy in front of both and, on request, a real
    Prometheus with the repo's config, all on loopback, under ``out``.  A context manager:
    leaving it stops every child, also when start-up failed half-way."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.logs = out / "logs"
        self.ports = {name: free_port() for name in (*ENGINES, "proxy", "prometheus")}
        self.children: list[Child] = []
        self.prom_config = out / "prometheus" / "prometheus.yml"
        self.prom_url: str | None = None

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['proxy']}"

    def start(self, *, scenarios: Sequence[str], speed: float, vllm_faults: Sequence[str] = (),
              gpu: str = "off", gpu_interval_s: float = 5.0, seed: int = 7, tokenizer: Path | None = None,
              block_size: int = 512) -> None:
        """The engines and the proxy (records in ``out/records``), ready; Prometheus's config
        rendered for them.  The simulated vLLM tells its own clock per request, as the real one
        started with ``--enable-per-request-metrics`` (where TTFT goes).  With ``tokenizer`` the
        engines count prompt tokens with it and the proxy captures a trace (``trace:``, blocks of
        ``block_size`` tokens)."""
        for name in ENGINES:
            flags = [*vllm_faults, "--per-request-metrics"] if name == "vllm" else []
            flags += ["--tokenizer", str(tokenizer)] if tokenizer is not None else []
            self.children.append(Child(f"sim-{name}", exporter_argv(
                "sim", "--profile", name, "--listen", f"127.0.0.1:{self.ports[name]}",
                "--speed", str(speed), "--seed", str(seed), *flags), self.logs))
        config = {
            "listen": f"127.0.0.1:{self.ports['proxy']}",
            # the simulated vLLM is asked for its token ids: an empty-text 200 then says what it generated
            "engines": [{"name": n, "upstream": f"http://127.0.0.1:{self.ports[n]}", **({"token_ids": True} if n == "vllm" else {})}
                        for n in ENGINES],
            "scenarios": list(scenarios),
            "records_dir": str(self.out / "records"),
            "gpu": gpu,
            "gpu_interval_s": gpu_interval_s,
            # this stack stops its Prometheus first, once the evidence is taken: no scraper reads again
            "drain_scrape_timeout_s": 0,
            **({"trace": {"tokenizer": str(tokenizer), "block_size": block_size}} if tokenizer is not None else {}),
        }
        cfg = self.out / "stack.yaml"
        cfg.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        proxy = Child("proxy", exporter_argv("serve", "--config", str(cfg)), self.logs)
        self.children.append(proxy)
        for child, name in zip(self.children, ENGINES):
            wait_http(f"http://127.0.0.1:{self.ports[name]}/health", 30, child)
        wait_http(f"{self.proxy_url}/-/ready", 30, proxy)
        render_prometheus_config({
            "llmbench-exporter": [f"127.0.0.1:{self.ports['proxy']}"],
            **{n: [f"127.0.0.1:{self.ports[n]}"] for n in ENGINES},
        }, self.prom_config.parent)

    def start_prometheus(self) -> str:
        """Prometheus, once it has scraped all three targets; FileNotFoundError without one."""
        self.children.append(start_prometheus(self.prom_config, self.out / "prometheus" / "data",
                                              self.ports["prometheus"], self.logs))
        self.prom_url = f"http://127.0.0.1:{self.ports['prometheus']}"
        wait_for_scrapes(self.prom_url, 1 + len(ENGINES))
        return self.prom_url

    def alive(self) -> bool:
        return all(c.proc.poll() is None for c in self.children)

    def stop(self) -> None:
        for child in reversed(self.children):
            child.stop()

    def __enter__(self) -> LocalStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
