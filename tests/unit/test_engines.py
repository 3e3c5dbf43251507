"""The engine watch: what each engine is (vLLM, SGLang, neither), whether it is up, its ups and
downs, the time to ready of a start the proxy saw, and no secret in any of it.  In-process
engines only (aiohttp servers on loopback ports)."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from exporter import __version__
from exporter.harness.sim import create_sim_app
from exporter.harness.sim_engine import PROFILES
from exporter.harness.sim_identity import sim_version
from exporter.proxy.app import create_app
from exporter.proxy.config import load_config
from exporter.proxy.engines import PROBE_INTERVAL_S, PROBE_USER_AGENT, REDACTED, identity_of, redact

from tests.helpers import AppOnPort, eventually, make_config, metric_value

SECRET = "sk-live-SECRET-42"


def test_redact_every_named_secret_at_any_depth() -> None:
    args = {"api_key": SECRET, "Admin_API_KEY": SECRET, "hf_token": SECRET, "tokenizer_path": "/m",
            "apiKey": SECRET, "authToken": SECRET, "HFTOKEN": SECRET, "ssl_keyfile_password": SECRET,
            "max_total_tokens": 4096, "max_prefill_tokens": 16384, "skip_tokenizer_init": False,
            "nested": {"db_password": SECRET, "list": [{"client_secret": SECRET}, "plain"], "tp_size": 2},
            "argv": ["--model", "m", "--api-key", SECRET, "--hf-token=" + SECRET, "--port", "8000",
                     "--max-total-tokens", "4096"]}
    out = redact(args)
    assert SECRET not in json.dumps(out)
    assert out["api_key"] == out["Admin_API_KEY"] == out["hf_token"] == REDACTED
    assert out["apiKey"] == out["authToken"] == out["HFTOKEN"] == out["ssl_keyfile_password"] == REDACTED
    # counts and paths a report needs are not secrets, though their names hold "token"
    assert (out["tokenizer_path"], out["max_total_tokens"], out["max_prefill_tokens"]) == ("/m", 4096, 16384)
    assert out["skip_tokenizer_init"] is False
    assert out["nested"]["tp_size"] == 2 and out["nested"]["list"][1] == "plain"
    assert out["argv"] == ["--model", "m", "--api-key", REDACTED, "--hf-token=" + REDACTED, "--port", "8000",
                           "--max-total-tokens", "4096"]


def test_identity_of_each_kind() -> None:
    sglang = identity_of({"version": "0.5.4", "model_path": "/w/Qwen", "served_model_name": "qwen", "tp_size": 8,
                          "api_key": SECRET, "internal_states": [{"x": 1}]}, None,
                         {"data": [{"id": "qwen", "root": "/w/Qwen", "max_model_len": 4096}]},
                         {"model_path": "/w/Qwen", "weight_version": "default"})
    assert (sglang["kind"], sglang["version"], sglang["model"], sglang["root"], sglang["max_model_len"]) == \
        ("sglang", "0.5.4", "qwen", "/w/Qwen", 4096)
    assert sglang["server_args"]["api_key"] == REDACTED and "internal_states" not in sglang["server_args"]
    vllm = identity_of(None, {"version": "0.11.0"}, {"data": [{"id": "m", "root": "/w/m", "max_model_len": 2048}]},
                       None)
    assert (vllm["kind"], vllm["version"], vllm["model"], vllm["server_args"]) == ("vllm", "0.11.0", "m", None)
    other = identity_of(None, None, {"data": [{"id": "x"}]}, None)
    assert (other["kind"], other["version"], other["model"], other["root"]) == ("unknown", None, "x", None)
    assert identity_of(None, None, None, None)["kind"] == "unknown"


async def _engines(client: TestClient) -> dict[str, dict[str, Any]]:
    doc = await (await client.get("/-/engines")).json()
    return {e["name"]: e for e in doc["engines"]}


@pytest.fixture
async def sims(unused_tcp_port_factory: Any) -> AsyncIterator[dict[str, AppOnPort]]:
    engines = {p: await AppOnPort(functools.partial(create_sim_app, PROFILES[p]), unused_tcp_port_factory()).start()
               for p in ("vllm", "sglang")}
    yield engines
    for e in engines.values():
        await e.stop()


def _config(tmp_path: Path, engines: dict[str, int]) -> Any:
    return make_config(tmp_path, 1, engines=[{"name": n, "upstream": f"http://127.0.0.1:{port}"}
                                             for n, port in engines.items()])


async def test_simulated_engines_say_what_they_are(sims: dict[str, AppOnPort], aiohttp_client: Any,
                                                   tmp_path: Path) -> None:
    client = await aiohttp_client(create_app(_config(tmp_path, {n: e.port for n, e in sims.items()})))
    got = await eventually(lambda: _identified(client, "vllm", "sglang"))
    vllm, sglang = got["vllm"], got["sglang"]
    assert vllm["up"] and sglang["up"]
    assert (vllm["kind"], vllm["version"], vllm["model"], vllm["max_model_len"]) == \
        ("vllm", sim_version(), "sim-model", 32768)
    assert vllm["root"] == "/models/sim/sim-model"
    assert vllm["server_args"]["vllm_config"]["scheduler_config"]["max_num_seqs"] == 32
    assert (sglang["kind"], sglang["version"], sglang["model"]) == ("sglang", sim_version(), "default")
    args = sglang["server_args"]
    assert args["api_key"] == args["admin_api_key"] == REDACTED and args["tp_size"] == 1
    assert args["sim_params"]["profile"] == "sglang" and sglang["model_info"]["is_generation"] is True
    for e in (vllm, sglang):
        assert e["checked_at"] <= time.time() and e["ready_at"] is not None and e["time_to_ready_s"] is None
    text = await (await client.get("/metrics")).text()
    assert metric_value(text, "llmbench_engine_up", engine="vllm") == 1
    assert metric_value(text, "llmbench_engine_info", engine="sglang", kind="sglang", version=sim_version(),
                        model="default") == 1
    lines = [json.loads(x) for x in (tmp_path / "run" / "engines.jsonl").read_text().splitlines()]
    assert lines[0]["event"] == "start" and lines[0]["proxy"]["version"]
    me = (await (await client.get("/-/engines")).json())["proxy"]  # the proxy's identity, to Prometheus too
    assert metric_value(text, "llmbench_proxy_info", version=__version__, config_sha256="", run_id=me["run_id"]) == 1
    assert text.count("llmbench_proxy_info{") == 1 and me["run_id"] == lines[0]["run_id"]
    assert {(x["engine"], x["kind"]) for x in lines if x["event"] == "identity"} == {("vllm", "vllm"),
                                                                                    ("sglang", "sglang")}


async def _identified(client: TestClient, *names: str) -> dict[str, dict[str, Any]] | None:
    got = await _engines(client)
    return got if all(got[n]["kind"] != "unknown" for n in names) else None


@pytest.mark.slow  # waits on the watch's own 1 s probe cadence
async def test_down_within_5_s_and_back_with_its_time_to_ready(unused_tcp_port: int, aiohttp_client: Any,
                                                               tmp_path: Path) -> None:
    engine = await AppOnPort(lambda: create_sim_app(PROFILES["vllm"]), unused_tcp_port).start()
    try:
        client = await aiohttp_client(create_app(_config(tmp_path, {"vllm": unused_tcp_port})))
        await eventually(lambda: _identified(client, "vllm"))
        await engine.stop()
        stopped = time.monotonic()
        await eventually(lambda: _is(client, "vllm", up=False), timeout_s=6)
        assert time.monotonic() - stopped < 5.0
        text = await (await client.get("/metrics")).text()
        assert metric_value(text, "llmbench_engine_up", engine="vllm") == 0
        await asyncio.sleep(1.5)
        await engine.start()
        back = await eventually(lambda: _is(client, "vllm", up=True, identified=True), timeout_s=6)
    finally:
        await engine.stop()
    assert back["restarts"] == 1 and back["kind"] == "vllm"
    assert back["ready_from"] in ("down_seen", "process_start") and back["time_to_ready_s"] >= 1.5
    events = [json.loads(x) for x in (tmp_path / "run" / "engines.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events if e["event"] != "ready"] == ["start", "up", "identity", "down", "up"]
    down, up = (e for e in events if e["event"] in ("down", "up") and e["unix"] > events[2]["unix"])
    assert up["seen_down"] and up["time_to_ready_s"] >= 1.5 and up["run_id"] == events[0]["run_id"]
    assert "connect" in down["detail"].lower()


async def _is(client: TestClient, name: str, up: bool, identified: bool = False) -> dict[str, Any] | None:
    e = (await _engines(client))[name]
    if e["up"] != up or (identified and (e["kind"] == "unknown" or e["ready_at"] is None)):
        return None
    return e if not identified or e["restarts"] else None


@pytest.mark.slow  # waits on the watch's own 1 s probe cadence
async def test_an_engine_that_is_neither_is_unknown_and_probed_at_most_once_a_second(
        upstream: Any, aiohttp_client: Any, tmp_path: Path) -> None:
    up, server = upstream
    client = await aiohttp_client(create_app(make_config(tmp_path, server.port)))

    async def probed() -> bool:  # two engines on this upstream: three rounds of probes each
        return sum(p == "/health" for p in up.probes) >= 6
    await eventually(probed, timeout_s=30)
    got = await _engines(client)
    assert got["vllm"]["up"] and got["vllm"]["kind"] == "unknown" and got["vllm"]["version"] is None
    # at most once a second per engine: any three probes of the two engines span a second (less
    # the jitter of a probe's own way there); a busy machine only spaces them further
    times = [t for t, p in zip(up.probe_times, up.probes) if p == "/health"]
    assert all(b - a >= 0.8 * PROBE_INTERVAL_S for a, b in zip(times, times[2:])), times
    assert up.seen == []  # nothing on the measured path
    text = await (await client.get("/metrics")).text()
    assert metric_value(text, "llmbench_engine_info", engine="vllm", kind="unknown") == 1


async def test_no_secret_reaches_any_output(unused_tcp_port: int, aiohttp_client: Any, tmp_path: Path) -> None:
    async def server_info(request: web.Request) -> web.Response:
        assert PROBE_USER_AGENT in request.headers["User-Agent"]
        return web.json_response({"version": "0.5.4", "model_path": "/w/m", "api_key": SECRET,
                                  "admin_api_key": SECRET, "nested": {"hf_token": SECRET, "password": SECRET},
                                  "internal_states": [{"api_key": SECRET}]})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def model_info(request: web.Request) -> web.Response:
        return web.json_response({"model_path": "/w/m", "secret_sauce": SECRET})

    def make() -> web.Application:
        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/server_info", server_info)
        app.router.add_get("/model_info", model_info)
        return app

    engine = await AppOnPort(make, unused_tcp_port).start()
    try:
        client = await aiohttp_client(create_app(_config(tmp_path, {"sglang": unused_tcp_port})))
        await eventually(lambda: _identified(client, "sglang"))
        outputs = [await (await client.get("/-/engines")).text(), await (await client.get("/metrics")).text(),
                   (tmp_path / "run" / "engines.jsonl").read_text()]
    finally:
        await engine.stop()
    assert all(SECRET not in text for text in outputs)
    assert '"api_key": "<redacted>"' in outputs[0].replace('":"', '": "')


def test_the_config_hash_is_of_the_file_as_read(tmp_path: Path) -> None:
    import hashlib

    path = tmp_path / "proxy.yaml"
    path.write_bytes(b"engines:\n  - name: vllm\n    upstream: http://127.0.0.1:1\n# a comment counts\n")
    config = load_config(path)
    assert config.config_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert config.model_copy(update={"gpu": "off"}).config_sha256 == config.config_sha256  # serve's workers


async def test_under_serve_the_supervisor_watches_once_for_all_workers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sims: dict[str, AppOnPort], aiohttp_client: Any) -> None:
    """``serve``'s set-up in this process: the supervisor's renderer runs the one engine watch;
    each worker forwards ``GET /-/engines`` to it, and /metrics has the two gauges once."""
    from prometheus_client import values

    from exporter.proxy.shared import SharedScenarios
    from exporter.proxy.valuefiles import use_multiprocess_values
    from exporter.proxy.workers import render_forever, worker_app

    run_dir = tmp_path / "serve"
    run_dir.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(run_dir))
    monkeypatch.setattr(values, "ValueClass", values.ValueClass)  # restored after the test
    use_multiprocess_values()
    SharedScenarios.create(run_dir / "scenarios.state").close()
    config = _config(tmp_path, {n: e.port for n, e in sims.items()})
    stop = asyncio.Event()
    renderer = asyncio.create_task(render_forever(config, run_dir, stop, nice=0, run_id="run-under-test"))
    try:
        for _ in range(500):
            if (run_dir / "metrics.sock").exists() or renderer.done():
                break
            await asyncio.sleep(0.01)
        workers = [await aiohttp_client(worker_app(config, i, 2, run_dir, "run-under-test")) for i in range(2)]
        got = await eventually(lambda: _identified(workers[1], "vllm", "sglang"))
        assert got["sglang"]["version"] == sim_version() and got["vllm"]["kind"] == "vllm"
        doc = await (await workers[0].get("/-/engines")).json()
        assert doc["run_id"] == "run-under-test" and doc["proxy"]["config_sha256"] is None  # not read from a file
        text = await (await workers[0].get("/metrics")).text()
        assert metric_value(text, "llmbench_engine_up") == 2  # one series per engine, not per worker
        assert metric_value(text, "llmbench_engine_info", kind="vllm") == 1
        assert metric_value(text, "llmbench_proxy_info", version=__version__, run_id="run-under-test") == 1
        assert text.count("llmbench_proxy_info{") == 1  # one series for the proxy, not one per worker
    finally:
        stop.set()
        await renderer
    lines = [json.loads(x) for x in (tmp_path / "run" / "engines.jsonl").read_text().splitlines()]
    assert {x["run_id"] for x in lines} == {"run-under-test"}
    assert sum(1 for x in lines if x["event"] == "start") == 1  # one watch, not one per worker


async def test_each_simulator_answers_its_own_engines_identity_routes(aiohttp_client: Any) -> None:
    vllm = await aiohttp_client(create_sim_app(PROFILES["vllm"]))
    assert await (await vllm.get("/version")).json() == {"version": sim_version()}
    config = (await (await vllm.get("/server_info")).json())["vllm_config"]  # as VLLM_SERVER_DEV_MODE=1 has it
    assert config["model_config"]["max_model_len"] == 32768 and config["sim_params"]["profile"] == "vllm"
    assert (await vllm.get("/get_server_info")).status == 404 and (await vllm.get("/model_info")).status == 404
    model, = (await (await vllm.get("/v1/models")).json())["data"]
    assert (model["id"], model["root"], model["max_model_len"], model["owned_by"]) == \
        ("sim-model", "/models/sim/sim-model", 32768, "vllm")
    sglang = await aiohttp_client(create_sim_app(PROFILES["sglang"]))
    assert (await sglang.get("/version")).status == 404
    for path in ("/server_info", "/get_server_info"):
        info = await (await sglang.get(path)).json()
        assert info["version"] == sim_version() and info["model_path"] == "/models/sim/default"
        assert "api_key" in info and "internal_states" in info
    for path in ("/model_info", "/get_model_info"):
        assert (await (await sglang.get(path)).json())["is_generation"] is True


@pytest.mark.slow  # waits on the watch's own 1 s probe cadence
async def test_an_sglang_is_probed_on_ready_not_on_its_generating_health(unused_tcp_port: int, aiohttp_client: Any,
                                                                        tmp_path: Path) -> None:
    """SGLang's /health runs a one-token generation through its scheduler: once the proxy knows
    an engine is SGLang it probes /ready, so that no request of its own joins the measured batch."""
    paths: list[str] = []

    def sim() -> web.Application:
        app = create_sim_app(PROFILES["sglang"])

        @web.middleware
        async def seen(request: web.Request, handler: Any) -> web.StreamResponse:
            paths.append(request.path)
            return await handler(request)

        app.middlewares.append(seen)
        return app

    engine = await AppOnPort(sim, unused_tcp_port).start()
    try:
        client = await aiohttp_client(create_app(_config(tmp_path, {"sglang": unused_tcp_port})))
        await eventually(lambda: _identified(client, "sglang"))
        known = len(paths)
        await eventually(lambda: _after(paths, known, "/ready", 2), timeout_s=6)
    finally:
        await engine.stop()
    probes = [p for p in paths[known:] if p in ("/health", "/ready")]
    assert probes and set(probes) == {"/ready"}, paths


async def _after(paths: list[str], start: int, path: str, n: int) -> bool | None:
    return True if paths[start:].count(path) >= n else None
