"""Issue 27 / SPEC 22: ``llm-bench-exporter load`` stopped by SIGINT (Ctrl-C) or SIGTERM mid-round
clears the scenario it announced before it exits, so the next client's requests are not labelled
with it; ``GET /-/scenarios`` (``active``) shows it, on a real ``serve --workers 2``."""

from __future__ import annotations

import http.server
import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from exporter.harness.stack import Child, exporter_argv, free_port, wait_http


class _Engine(http.server.BaseHTTPRequestHandler):
    """An engine that lists a model and never answers a completion."""

    arrived = threading.Event()
    release = threading.Event()

    def do_GET(self) -> None:  # noqa: N802
        body = json.dumps({"data": [{"id": "m"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).arrived.set()
        type(self).release.wait(120)  # held until the test ends: the round stays mid-flight

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def engine() -> Iterator[int]:
    _Engine.arrived.clear()
    _Engine.release.clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        _Engine.release.set()
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_load_stopped_by_a_signal_clears_its_scenario(tmp_path: Path, engine: int, signum: int) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cfg = tmp_path / "proxy.yaml"
    cfg.write_text(yaml.safe_dump({
        "listen": f"127.0.0.1:{port}", "records_dir": str(tmp_path / "run"), "scenarios": ["s1"],
        "engines": [{"name": "vllm", "upstream": f"http://127.0.0.1:{engine}"},
                    {"name": "sglang", "upstream": f"http://127.0.0.1:{engine}"}]}))
    proxy = Child("proxy", exporter_argv("serve", "--config", str(cfg), "--workers", "2"), tmp_path)
    load = None
    try:
        wait_http(f"{url}/-/ready", 60, proxy)
        load = Child("load", exporter_argv("load", "--base-url", f"{url}/vllm", "--scenario", "s1", "--model", "m",
                                           "--concurrency", "2", "--requests", "4", "--input-tokens", "4",
                                           "--output-tokens", "2"), tmp_path)
        assert _Engine.arrived.wait(60), load.log_path.read_text()
        active = requests.get(f"{url}/-/scenarios", timeout=10).json()["active"]
        assert active == {"vllm": {"scenario": "s1", "round": 1}, "sglang": None}
        os.kill(load.proc.pid, signum)
        rc = load.proc.wait(60)
        log = load.log_path.read_text()
        assert rc == 128 + signum, log
        name = signal.Signals(signum).name
        assert f"llm-bench-exporter load: interrupted ({name}); the scenario it announced is cleared" in log
        assert "Traceback" not in log
        assert requests.get(f"{url}/-/scenarios", timeout=10).json()["active"] == {"vllm": None, "sglang": None}
    finally:
        if load is not None:
            load.stop()
        proxy.stop()
