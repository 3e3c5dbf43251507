"""The engine watch against real engines: what the real vLLM (the CPU build, a tiny random-weight
llama built here) says it is, through ``GET /-/engines``, the metrics and ``engines.jsonl``; and the
engine killed and started again under load: the proxy sees it go down within 5 s and come back,
measures the restart's time to ready, and judges the requests of the outage ``connect_error`` or
``upstream_disconnect``.  The real SGLang's identity too (``tests/sglang_engine.py``), first, before
the vLLM of the other tests starts.

Needs ``.ci/install-vllm.sh`` and ``.ci/install-sglang.sh`` (each test skipped without its engine,
failed without it when LLMBENCH_REQUIRE_VLLM=1 / LLMBENCH_REQUIRE_SGLANG=1).
The restart test kills the engine, so it stays last.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.helpers import metric_value, read_records
from tests.vllm_engine import MAX_MODEL_LEN, VllmServer, build_model, require_vllm, start_proxy

pytestmark = pytest.mark.slow

REQ = {"model": "tiny", "prompt": "def fib(n):", "max_tokens": 24, "ignore_eos": True, "temperature": 0,
       "stream": True, "stream_options": {"include_usage": True}}


@dataclass
class Stack:
    vllm: VllmServer
    proxy: str
    out: Path
    model: Path

    def engines(self) -> dict[str, dict[str, Any]]:
        doc = requests.get(f"{self.proxy}/-/engines", timeout=10).json()
        return {e["name"]: e for e in doc["engines"]}

    def events(self) -> list[dict[str, Any]]:
        path = self.out / "run" / "engines.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _until(check: Any, timeout_s: float, every_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every_s)
    raise AssertionError(f"not within {timeout_s:.0f} s")


def test_the_real_sglang_says_what_it_is(tmp_path: Path) -> None:
    """The real SGLang (``tests/sglang_engine.py``): its version, model and every server argument,
    the keys among them redacted, through ``GET /-/engines``, the metrics and ``engines.jsonl``."""
    from tests.sglang_engine import SglangServer, require_sglang
    from tests.sglang_engine import build_model as build_sglang_model

    require_sglang()
    model = build_sglang_model(tmp_path / "model")
    with contextlib.ExitStack() as exits:
        server = SglangServer(model, tmp_path / "logs")
        exits.callback(server.stop)
        server.start()
        proxy, url = start_proxy(tmp_path, [{"name": "sglang", "upstream": server.url}])
        exits.callback(proxy.stop)
        s = Stack(server, url, tmp_path, model)  # type: ignore[arg-type]  # an SglangServer in the vllm slot
        e = _until(lambda: (x := s.engines()["sglang"])["kind"] == "sglang" and x, 60)
        info = requests.get(f"{server.url}/server_info", timeout=30).json()
        text = requests.get(f"{url}/metrics", timeout=10).text
        # once known as SGLang it is probed on /ready: its /health would run a generation
        log = _until(lambda: (x := server.log_path.read_text(errors="replace")).count('"GET /ready ') >= 2 and x, 30)
    after = log[log.index('"GET /ready '):]
    assert '"GET /health ' not in after, after[-2000:]
    assert (e["up"], e["version"], e["model"], e["root"]) == (True, info["version"], "tiny", str(model))
    assert isinstance(e["max_model_len"], int) and e["max_model_len"] > 0
    args = e["server_args"]
    assert args["api_key"] == args["admin_api_key"] == "<redacted>" and args["served_model_name"] == "tiny"
    assert args["model_path"] == str(model) and "internal_states" not in args and "version" not in args
    assert e["model_info"]["model_path"] == str(model)
    assert metric_value(text, "llmbench_engine_info", engine="sglang", kind="sglang", version=info["version"]) == 1
    ident = [x for x in s.events() if x["event"] == "identity"]
    assert [(x["engine"], x["kind"], x["version"]) for x in ident] == [("sglang", "sglang", info["version"])]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    require_vllm()
    out = tmp_path_factory.mktemp("engines-real")
    with contextlib.ExitStack() as exits:
        model = build_model(out / "model")
        server = VllmServer(model, out / "logs")
        exits.callback(server.stop)
        server.start()
        proxy, url = start_proxy(out, [{"name": "vllm", "upstream": server.url}])
        exits.callback(proxy.stop)
        s = Stack(server, url, out, model)
        exits.callback(lambda: s.vllm.stop())  # the server the restart test started again, if it did
        _until(lambda: s.engines()["vllm"]["kind"] == "vllm", 60)
        yield s


def test_the_real_vllm_says_what_it_is(stack: Stack) -> None:
    e = stack.engines()["vllm"]
    version = requests.get(f"{stack.vllm.url}/version", timeout=10).json()["version"]
    assert (e["up"], e["kind"], e["version"], e["model"]) == (True, "vllm", version, "tiny")
    assert e["root"] == str(stack.model) and e["max_model_len"] == MAX_MODEL_LEN
    assert e["upstream"] == stack.vllm.url and e["checked_at"] > time.time() - 5
    text = requests.get(f"{stack.proxy}/metrics", timeout=10).text
    assert metric_value(text, "llmbench_engine_up", engine="vllm") == 1
    assert metric_value(text, "llmbench_engine_info", engine="vllm", kind="vllm", version=version, model="tiny") == 1
    ident = [x for x in stack.events() if x["event"] == "identity"]
    assert [(x["engine"], x["kind"], x["version"]) for x in ident] == [("vllm", "vllm", version)]
    proxy = stack.events()[0]["proxy"]
    config = (stack.out / "proxy.yaml").read_bytes()
    assert proxy["config_sha256"] == hashlib.sha256(config).hexdigest() and proxy["version"]


class Load:
    """Streamed requests through the proxy, one after another on each of ``n`` threads, until stopped."""

    def __init__(self, proxy: str, n: int = 2) -> None:
        self.proxy = proxy
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)]

    def _run(self, i: int) -> None:
        k = 0
        while not self.stop.is_set():
            k += 1
            with contextlib.suppress(requests.RequestException):
                requests.post(f"{self.proxy}/vllm/v1/completions", json=REQ, timeout=60,
                              headers={"X-Request-Id": f"load-{i}-{k}"}).close()
            time.sleep(0.25)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=90)


def test_killed_and_started_again_mid_run(stack: Stack) -> None:
    """Last: kills the engine under load and starts it again on the same port."""
    with Load(stack.proxy):
        _until(lambda: len(read_records(stack.out)) >= 4, 120)
        killed = time.time()
        _kill(stack.vllm)
        _until(lambda: not stack.engines()["vllm"]["up"], 10, 0.05)
        assert time.time() - killed < 5.0, f"down seen {time.time() - killed:.1f} s after the kill"
        time.sleep(3)  # the outage: requests keep coming
        again = VllmServer(stack.model, stack.out / "logs-again")
        again.port = stack.vllm.port  # the proxy's upstream
        stack.vllm = again.start()
        back = _until(lambda: (e := stack.engines()["vllm"])["up"] and e["kind"] == "vllm" and e, 60)
        _until(lambda: any(r["start_unix"] > time.time() - 5 and r["outcome"] == "success"
                           for r in read_records(stack.out)), 60)
    assert back["restarts"] == 1 and back["ready_at"] >= killed
    time.sleep(2)  # the time to ready from the engine's own process start, where its /metrics has it
    e = stack.engines()["vllm"]
    assert e["ready_from"] in ("process_start", "down_seen")
    assert 0 < e["time_to_ready_s"] <= again.startup_s + 10, (e, again.startup_s)
    events = [x for x in stack.events() if x["unix"] >= killed]
    assert [x["event"] for x in events if x["event"] in ("down", "up")] == ["down", "up"]
    assert next(x for x in events if x["event"] == "up")["seen_down"] is True
    outage = [r for r in read_records(stack.out) if killed - 1 <= r["start_unix"] <= float(back["ready_at"])
              and r["outcome"] == "failure"]
    assert outage, "no request failed during the outage"
    assert {r["reason"] for r in outage} <= {"connect_error", "upstream_disconnect"}, \
        sorted({(r["reason"], r.get("detail")) for r in outage})


def _kill(server: VllmServer) -> None:
    """SIGKILL every process of the server (the API server and its engine core)."""
    for pid in server.pids():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert server.child is not None
    server.child.proc.wait(timeout=30)
