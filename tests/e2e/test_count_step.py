"""The exact counts' step against the scrape interval the store reports (SPEC 29), on a real Prometheus.

One target scraped every second under the proxies' job, one every 5 s under another: the export's check
reads each job's interval from Prometheus' configuration, and, as for a store without one (VictoriaMetrics),
from the spacing of the job's ``up`` samples; a ``count_step`` longer than the interval is a warning naming
both, one not longer is none.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import yaml

from dashboards.catalogue import MIXIN
from dashboards.promql import COUNT_STEP
from exporter.evidence.promapi import Prometheus, parse_duration
from exporter.evidence.stepcheck import check_count_step
from exporter.evidence.windows import Window

from tests.helpers import require_prometheus, scrapes_since, start_prometheus_on_port_0

pytestmark = pytest.mark.slow


class _Metrics(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        body = b"# TYPE x gauge\nx 1\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    require_prometheus()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    target = f"127.0.0.1:{server.server_address[1]}"
    tmp = tmp_path_factory.mktemp("prom")
    config = tmp / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"scrape_interval": "5s", "scrape_timeout": "1s"}, "scrape_configs": [
        {"job_name": MIXIN.job, "scrape_interval": "1s", "static_configs": [{"targets": [target]}]},
        {"job_name": "slow", "static_configs": [{"targets": [target]}]}]}))
    child, url = start_prometheus_on_port_0(config, tmp / "data", tmp)
    try:
        yield url, target
    finally:
        child.stop()
        server.shutdown()


def test_a_step_longer_than_the_configured_interval_is_named(prom: tuple[str, str]) -> None:
    url, _ = prom
    api = Prometheus(url)
    intervals = api.scrape_intervals()
    assert intervals == {MIXIN.job: 1.0, "slow": 5.0}
    now = time.time()
    window = Window(now - 60, now, "last:1m")
    fast = check_count_step(api, MIXIN.job, window, intervals)
    assert fast["scrape_interval_s"] == 1.0 and "status/config" in fast["source"]
    assert parse_duration(COUNT_STEP) > 1.0  # the mixin's default, the case the issue measured
    assert f"count_step {COUNT_STEP} is longer than job {MIXIN.job}'s scrape interval 1s" in fast["warning"]
    slow = check_count_step(api, "slow", window, intervals)
    assert (slow["scrape_interval_s"], slow["warning"]) == (5.0, None)


def test_without_a_config_api_the_up_samples_tell_the_interval(prom: tuple[str, str]) -> None:
    url, target = prom
    api = Prometheus(url)
    since = time.time()
    last = scrapes_since(url, target, since, n=6)  # both jobs' up samples: the 1 s job's are most of them
    window = Window(since, last + 0.001, "given")
    fast = check_count_step(api, MIXIN.job, window, {})  # as from VictoriaMetrics: no configuration
    assert fast["scrape_interval_s"] == pytest.approx(1.0, abs=0.1) and "spacing of up" in fast["source"]
    assert f"count_step {COUNT_STEP} is longer than job {MIXIN.job}'s scrape interval" in fast["warning"]
    missing = check_count_step(api, "no-such-job", window, {})
    assert missing["scrape_interval_s"] is None and missing["warning"] is None and "unknown" in missing["source"]
