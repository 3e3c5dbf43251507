"""GPU collector: NVML readings (or simulated GPUs) under dcgm-exporter's metric names.

dcgm-exporter names, units and labels, so the GPU board works the same against either:

==========================  =====  =========================================
``DCGM_FI_DEV_FB_USED``      MiB   framebuffer used
``DCGM_FI_DEV_FB_FREE``      MiB   framebuffer free
``DCGM_FI_DEV_SM_CLOCK``     MHz   SM clock
``DCGM_FI_DEV_MEM_CLOCK``    MHz   memory clock
``DCGM_FI_DEV_GPU_UTIL``     %     GPU utilisation
``DCGM_FI_DEV_MEM_COPY_UTIL`` %    memory copy utilisation
``DCGM_FI_DEV_POWER_USAGE``  W     power draw
``DCGM_FI_DEV_GPU_TEMP``     C     GPU temperature
==========================  =====  =========================================

Labels: ``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname``.

A background task polls the source every ``gpu_interval_s`` (15 s by default, the seed's
resolution; set ``gpu_interval_s: 1`` in the config for finer boards).  NVML calls run in a
worker thread, never on the event loop.  A field or GPU that fails is skipped and counted
in ``llmbench_gpu_collector_errors_total``; the others still report.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
import random
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["FIELDS", "GpuReading", "NvmlSource", "SimSource", "GpuCollector", "make_source", "check_source",
           "poll_forever"]

log = logging.getLogger("llmbench.gpu")

#: metric name -> help text (units as dcgm-exporter has them)
FIELDS: dict[str, str] = {
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
    "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
    "DCGM_FI_DEV_SM_CLOCK": "SM clock frequency (in MHz).",
    "DCGM_FI_DEV_MEM_CLOCK": "Memory clock frequency (in MHz).",
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "Memory utilization (in %).",
    "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W).",
    "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C).",
}
LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")


@dataclass
class GpuReading:
    labels: dict[str, str]
    values: dict[str, float] = field(default_factory=dict)


class Source(Protocol):
    def read(self) -> tuple[list[GpuReading], list[tuple[str, str]]]:
        """Readings, and (gpu, field) pairs that failed this time."""

    def close(self) -> None:
        """Release the library."""


class NvmlSource:
    """Reads every GPU through nvidia-ml-py (``import pynvml``)."""

    def __init__(self, module: ModuleType | None = None) -> None:
        nvml = module if module is not None else importlib.import_module("pynvml")  # optional extra
        self.nvml = nvml
        nvml.nvmlInit()
        self.host = socket.gethostname()
        self.devices: list[tuple[Any, dict[str, str]]] = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            labels = {
                "gpu": str(i),
                "UUID": _text(nvml.nvmlDeviceGetUUID(h)),
                "pci_bus_id": _text(nvml.nvmlDeviceGetPciInfo(h).busId),
                "device": f"nvidia{i}",
                "modelName": _text(nvml.nvmlDeviceGetName(h)),
                "Hostname": self.host,
            }
            self.devices.append((h, labels))

    def _fields(self, h: Any) -> Iterator[tuple[str, Callable[[], float]]]:
        n = self.nvml

        def memory() -> Any:
            try:  # v2 excludes driver-reserved memory, as nvidia-smi's memory.used does
                return n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
            except (TypeError, AttributeError):
                return n.nvmlDeviceGetMemoryInfo(h)

        yield "DCGM_FI_DEV_FB_USED", lambda: memory().used / 2**20
        yield "DCGM_FI_DEV_FB_FREE", lambda: memory().free / 2**20
        yield "DCGM_FI_DEV_SM_CLOCK", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)
        yield "DCGM_FI_DEV_MEM_CLOCK", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)
        yield "DCGM_FI_DEV_GPU_UTIL", lambda: n.nvmlDeviceGetUtilizationRates(h).gpu
        yield "DCGM_FI_DEV_MEM_COPY_UTIL", lambda: n.nvmlDeviceGetUtilizationRates(h).memory
        yield "DCGM_FI_DEV_POWER_USAGE", lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0
        yield "DCGM_FI_DEV_GPU_TEMP", lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)

    def read(self) -> tuple[list[GpuReading], list[tuple[str, str]]]:
        readings, errors = [], []
        for h, labels in self.devices:
            r = GpuReading(dict(labels))
            for name, get in self._fields(h):
                try:
                    r.values[name] = float(get())
                except self.nvml.NVMLError:
                    errors.append((labels["gpu"], name))
            readings.append(r)
        return readings, errors

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class SimSource:
    """N simulated GPUs whose utilisation, clocks and power follow the proxy's in-flight load.

    Memory stays near the seed's ~124 GiB per card (weights plus a preallocated KV cache).
    """

    MODEL = "NVIDIA H20-3e (simulated)"
    TOTAL_MIB = 143_771.0

    def __init__(self, count: int, load: Callable[[], float], seed: int = 0) -> None:
        self.count = count
        self.load = load
        self.rng = random.Random(seed)
        self.host = socket.gethostname()

    def read(self) -> tuple[list[GpuReading], list[tuple[str, str]]]:
        busy = max(0.0, min(1.0, self.load() / 32.0))
        out = []
        for i in range(self.count):
            jitter = self.rng.uniform(-1.0, 1.0)
            util = 0.0 if busy == 0 else min(100.0, 60.0 + 40.0 * math.sqrt(busy) + 2 * jitter)
            used = 126_976.0 + 64.0 * i + 256.0 * busy
            out.append(GpuReading(
                {"gpu": str(i), "UUID": f"GPU-5157{i:04d}-0000-4000-8000-{i:012d}",
                 "pci_bus_id": f"00000000:{0x18 + 0x10 * i:02X}:00.0", "device": f"nvidia{i}",
                 "modelName": self.MODEL, "Hostname": self.host},
                {"DCGM_FI_DEV_FB_USED": used, "DCGM_FI_DEV_FB_FREE": self.TOTAL_MIB - used,
                 "DCGM_FI_DEV_SM_CLOCK": 1980.0 if busy else 345.0,
                 "DCGM_FI_DEV_MEM_CLOCK": 2619.0,
                 "DCGM_FI_DEV_GPU_UTIL": round(util),
                 "DCGM_FI_DEV_MEM_COPY_UTIL": round(util * 0.45),
                 "DCGM_FI_DEV_POWER_USAGE": 90.0 + 250.0 * busy + 5 * jitter,
                 "DCGM_FI_DEV_GPU_TEMP": 34.0 + 30.0 * busy + jitter},
            ))
        return out, []

    def close(self) -> None:
        pass


class GpuCollector(Collector):
    """Exposes the latest snapshot; the poll task replaces it."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.snapshot: list[GpuReading] = []
        self.errors = Counter("llmbench_gpu_collector_errors", "GPU fields or devices that failed to read.",
                              ("gpu", "field"), registry=registry)
        registry.register(self)

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshot = self.snapshot
        for name, doc in FIELDS.items():
            fam = GaugeMetricFamily(name, doc, labels=LABELS)
            for r in snapshot:
                if name in r.values:
                    fam.add_metric([r.labels[k] for k in LABELS], r.values[name])
            yield fam

    def update(self, readings: list[GpuReading], errors: list[tuple[str, str]]) -> None:
        self.snapshot = readings
        for gpu, name in errors:
            self.errors.labels(gpu, name).inc()


def check_source(spec: str, module: ModuleType | None = None) -> str | None:
    """Why the GPU source ``spec`` cannot start here (one line for the user), or None.

    ``serve`` calls it before it starts: ``gpu: nvml`` on a machine without the library or the
    driver refuses to start rather than serve on without the GPU board's data."""
    if spec != "nvml":
        return None
    try:
        nvml = module if module is not None else importlib.import_module("pynvml")
    except ImportError:
        return "gpu: nvml needs nvidia-ml-py (pip install 'llm-bench-exporter[nvml]'), or set gpu: off"
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ... all subclass NVMLError
        return f"gpu: nvml cannot start, NVML failed to initialise: {exc} (no NVIDIA driver here? set gpu: off)"
    try:
        nvml.nvmlShutdown()
    except Exception:  # the check passed; a failing shutdown changes nothing
        pass
    return None


def make_source(spec: str, load: Callable[[], float]) -> Source | None:
    """``nvml``, ``sim:N`` or ``off``; NVML absent or failing gives None and one log line."""
    if spec == "off":
        return None
    if spec.startswith("sim:"):
        return SimSource(int(spec[4:]), load)
    try:
        return NvmlSource()
    except ImportError:
        log.warning("GPU collector off: nvidia-ml-py is not installed (pip install 'llm-bench-exporter[nvml]')")
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ... all subclass NVMLError
        log.warning("GPU collector off: NVML failed to initialise: %s", exc)
    return None


async def poll_forever(source: Source, collector: GpuCollector, interval_s: float) -> None:
    """Read in a worker thread every ``interval_s``; a failed read is counted, never fatal."""
    while True:
        try:
            readings, errors = await asyncio.to_thread(source.read)
            collector.update(readings, errors)
        except Exception as exc:  # a whole read failed (e.g. the driver went away)
            log.warning("GPU read failed: %s", exc)
            collector.update([], [("all", "read")])
        await asyncio.sleep(interval_s)
