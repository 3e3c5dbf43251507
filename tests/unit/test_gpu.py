"""The GPU collector on the CPU: simulated GPUs, NVML missing, and NVML failing with its real error codes."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pynvml
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exporter.proxy.gpu import FIELDS, LABELS, GpuCollector, NvmlSource, SimSource, check_source, make_source

from tests.helpers import metric_value, samples


class _Mem:
    def __init__(self, used: int, free: int) -> None:
        self.used, self.free, self.total = used, free, used + free


class _Util:
    gpu, memory = 97, 41


def fake_nvml(count: int = 3, broken: dict[tuple[int, str], int] | None = None, init_error: int | None = None) -> types.ModuleType:
    """A stand-in NVML: the real pynvml error classes and constants, canned readings."""
    broken = broken or {}
    m = types.ModuleType("fake_pynvml")
    m.NVMLError = pynvml.NVMLError
    for const in ("NVML_CLOCK_SM", "NVML_CLOCK_MEM", "NVML_TEMPERATURE_GPU", "nvmlMemory_v2"):
        setattr(m, const, getattr(pynvml, const))

    def check(i: int, what: str) -> None:
        code = broken.get((i, what)) or broken.get((i, "*"))
        if code is not None:
            raise pynvml.NVMLError(code)

    def init() -> None:
        if init_error is not None:
            raise pynvml.NVMLError(init_error)

    m.nvmlInit = init
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: count
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetUUID = lambda h: f"GPU-{h:08d}"
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=f"00000000:{h:02X}:00.0".encode())
    m.nvmlDeviceGetName = lambda h: "NVIDIA H200"

    def mem(h: int, version: Any = None) -> _Mem:
        check(h, "mem")
        return _Mem(126_976 * 2**20, 16_000 * 2**20)

    def clock(h: int, kind: int) -> int:
        check(h, "clock")
        return 1980 if kind == pynvml.NVML_CLOCK_SM else 3201

    def util(h: int) -> _Util:
        check(h, "util")
        return _Util()

    def power(h: int) -> int:
        check(h, "power")
        return 512_345

    def temp(h: int, sensor: int) -> int:
        check(h, "temp")
        return 61

    m.nvmlDeviceGetMemoryInfo = mem
    m.nvmlDeviceGetClockInfo = clock
    m.nvmlDeviceGetUtilizationRates = util
    m.nvmlDeviceGetPowerUsage = power
    m.nvmlDeviceGetTemperature = temp
    return m


def _samples(text: str, name: str) -> list[dict[str, str]]:
    return [s.labels for s in samples(text, name)]


def test_nvml_readings_units_and_labels() -> None:
    readings, errors = NvmlSource(fake_nvml(2)).read()
    assert errors == []
    r = readings[1]
    assert r.labels == {"gpu": "1", "UUID": "GPU-00000001", "pci_bus_id": "00000000:01:00.0", "device": "nvidia1",
                        "modelName": "NVIDIA H200", "Hostname": r.labels["Hostname"]} and set(r.labels) == set(LABELS)
    assert r.values == {"DCGM_FI_DEV_FB_USED": 126_976.0, "DCGM_FI_DEV_FB_FREE": 16_000.0, "DCGM_FI_DEV_SM_CLOCK": 1980.0,
                        "DCGM_FI_DEV_MEM_CLOCK": 3201.0, "DCGM_FI_DEV_GPU_UTIL": 97.0, "DCGM_FI_DEV_MEM_COPY_UTIL": 41.0,
                        "DCGM_FI_DEV_POWER_USAGE": 512.345, "DCGM_FI_DEV_GPU_TEMP": 61.0}


def test_failing_field_and_lost_gpu_are_skipped_and_counted() -> None:
    nvml = fake_nvml(3, broken={(0, "power"): pynvml.NVML_ERROR_NOT_SUPPORTED, (2, "*"): pynvml.NVML_ERROR_GPU_IS_LOST})
    readings, errors = NvmlSource(nvml).read()
    assert ("0", "DCGM_FI_DEV_POWER_USAGE") in errors and len([e for e in errors if e[0] == "2"]) == len(FIELDS)
    registry = CollectorRegistry()
    collector = GpuCollector(registry)
    collector.update(readings, errors)
    text = generate_latest(registry).decode()
    assert metric_value(text, "DCGM_FI_DEV_POWER_USAGE", gpu="1") == 512.345
    assert {s["gpu"] for s in _samples(text, "DCGM_FI_DEV_POWER_USAGE")} == {"1"}  # GPU 0's power skipped
    assert metric_value(text, "DCGM_FI_DEV_SM_CLOCK", gpu="0") == 1980  # the rest of GPU 0 still reports
    assert all(s["gpu"] != "2" for name in FIELDS for s in _samples(text, name))  # the lost GPU is skipped
    assert metric_value(text, "llmbench_gpu_collector_errors_total", gpu="0", field="DCGM_FI_DEV_POWER_USAGE") == 1
    assert metric_value(text, "llmbench_gpu_collector_errors_total", gpu="2", field="DCGM_FI_DEV_GPU_TEMP") == 1


def test_nvml_init_failure_logs_one_line(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    with caplog.at_level(logging.WARNING, "llmbench.gpu"):
        assert make_source("nvml", lambda: 0) is None
    assert len(caplog.records) == 1 and "NVML failed to initialise" in caplog.text and "Driver Not Loaded" in caplog.text


def test_nvml_missing_library(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    with caplog.at_level(logging.WARNING, "llmbench.gpu"):
        assert make_source("nvml", lambda: 0) is None
    assert len(caplog.records) == 1 and "nvidia-ml-py is not installed" in caplog.text


def test_sim_source_follows_load() -> None:
    load = {"n": 0.0}
    src = SimSource(8, lambda: load["n"])
    idle, _ = src.read()
    load["n"] = 32
    busy, _ = src.read()
    assert [r.labels["gpu"] for r in busy] == [str(i) for i in range(8)]
    assert all("simulated" in r.labels["modelName"] and set(r.labels) == set(LABELS) for r in busy)
    assert len({r.labels["UUID"] for r in busy}) == 8
    assert all(set(r.values) == set(FIELDS) for r in busy)
    assert all(b.values["DCGM_FI_DEV_GPU_UTIL"] > 90 > i.values["DCGM_FI_DEV_GPU_UTIL"] for b, i in zip(busy, idle))
    assert busy[0].values["DCGM_FI_DEV_SM_CLOCK"] == 1980 and idle[0].values["DCGM_FI_DEV_SM_CLOCK"] < 1000
    assert 120 < busy[0].values["DCGM_FI_DEV_FB_USED"] / 1024 < 130  # ~124 GiB, as in the seed


async def test_exporter_metrics_carry_dcgm_names(upstream: Any, proxy_factory: Any) -> None:
    _, server = upstream
    client = await proxy_factory(server.port, gpu="sim:2", gpu_interval_s=0.05)
    for _ in range(100):
        text = await (await client.get("/metrics")).text()
        if "DCGM_FI_DEV_FB_USED{" in text:
            break
        await asyncio.sleep(0.05)
    for name in FIELDS:
        assert f"# TYPE {name} gauge" in text
        assert sorted(s["gpu"] for s in _samples(text, name)) == ["0", "1"]
    line = next(x for x in text.splitlines() if x.startswith("DCGM_FI_DEV_SM_CLOCK{"))
    for label in LABELS:
        assert f'{label}="' in line


async def test_exporter_without_nvml_still_serves(upstream: Any, proxy_factory: Any, caplog: pytest.LogCaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _, server = upstream
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    with caplog.at_level(logging.WARNING, "llmbench.gpu"):
        client = await proxy_factory(server.port, gpu="nvml")
        text = await (await client.get("/metrics")).text()
    assert "DCGM_FI_DEV" not in text and "llmbench_requests_in_flight" in text
    resp = await client.post("/vllm/v1/completions", json={"prompt": "x", "stream": True})
    assert resp.status == 200
    assert "NVML failed to initialise" in caplog.text


# --- gpu: nvml must refuse to start without a driver (issue 12) -------------------------------

@pytest.mark.parametrize("code, words", [(pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
                                         (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "Library Not Found")])
def test_check_source_names_the_nvml_failure(code: int, words: str) -> None:
    line = check_source("nvml", fake_nvml(init_error=code))
    assert line is not None and "\n" not in line
    assert line.startswith("gpu: nvml") and words in line and "gpu: off" in line


def test_check_source_without_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    line = check_source("nvml")
    assert line is not None and "nvidia-ml-py" in line and "[nvml]" in line


def test_check_source_passes_a_working_nvml_and_other_sources() -> None:
    calls: list[str] = []
    nvml = fake_nvml(1)
    nvml.nvmlInit = lambda: calls.append("init")
    nvml.nvmlShutdown = lambda: calls.append("shutdown")
    assert check_source("nvml", nvml) is None and calls == ["init", "shutdown"]  # released again
    assert check_source("off") is None and check_source("sim:4") is None


_SERVE = Path(__file__).resolve().parents[2] / "exporter" / "proxy" / "serve.py"


@pytest.mark.slow  # a subprocess: runs in the full suite
@pytest.mark.skipif("check_source" not in _SERVE.read_text(), reason="serve.py does not call gpu.check_source yet")
@pytest.mark.skipif(check_source("nvml") is None, reason="NVML works here (a driver is installed)")
def test_serve_refuses_nvml_without_a_driver(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"engines: [{{name: e, upstream: 'http://127.0.0.1:9'}}]\nrecords_dir: {tmp_path / 'run'}\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run([sys.executable, "-m", "exporter.cli", "serve", "--config", str(cfg), "--gpu", "nvml",
                          "--listen", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=30,
                         cwd=_SERVE.parents[2])
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "gpu: nvml" in lines[0] and "NVML" in lines[0] and "Traceback" not in out.stderr
