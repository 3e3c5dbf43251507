"""The supervisor's merge (exporter/proxy/merge.py) answers byte for byte what
prometheus_client's own MultiProcessCollector and encoders answer for the same value files,
written by real metrics of two "processes", while values move, series and files appear and a
dead worker's live gauges go; and an unchanged family is neither merged nor encoded again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, values
from prometheus_client.exposition import generate_latest
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.openmetrics import exposition as openmetrics

from exporter.proxy.exposition import render
from exporter.proxy.merge import MergedValues

OM = "application/openmetrics-text; version=1.0.0"


class Proc:
    """One worker's metrics, writing value files as process ``pid``."""

    def __init__(self, pid: int) -> None:
        values.ValueClass = values.MultiProcessValue(process_identifier=lambda: pid)
        self.requests = Counter("t_requests", "requests", ["engine", "outcome"], registry=None)
        self.ttft = Histogram("t_ttft_seconds", "ttft", ["engine"], buckets=(0.1, 0.5, 1.0), registry=None)
        self.live = Gauge("t_in_flight", "in flight", ["engine"], multiprocess_mode="livesum", registry=None)
        self.each = Gauge("t_each", "per process", multiprocess_mode="all", registry=None)
        self.high = Gauge("t_high", "max", multiprocess_mode="max", registry=None)
        self.recent = Gauge("t_recent", 'help with "quotes" and \\ and\nnewline', multiprocess_mode="mostrecent",
                            registry=None)


@pytest.fixture
def procs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[int], Proc]:
    monkeypatch.setattr(values, "ValueClass", values.ValueClass)  # restored after the test
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    return Proc


def _expected(path: Path) -> tuple[bytes, bytes]:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(path))
    return generate_latest(registry), openmetrics.generate_latest(registry)


def _ours(registry: Any) -> tuple[bytes, bytes]:
    return render(registry, "", "identity")[0], render(registry, OM, "identity")[0]


def test_the_merge_answers_what_prometheus_client_answers(procs: Callable[[int], Proc], tmp_path: Path) -> None:
    a, b = procs(101), procs(202)
    merged = MergedValues(tmp_path)
    registry = CollectorRegistry()
    registry.register(merged)

    def same() -> None:
        assert _ours(registry) == _expected(tmp_path)

    for p, n in ((a, 3), (b, 5)):
        p.requests.labels("vllm", "success").inc(n)
        p.ttft.labels("vllm").observe(0.05 * n)
        p.live.labels("vllm").set(n)
        p.each.set(n)
        p.high.set(10 * n)
        p.recent.set(n)
    same()
    before = merged.merges
    same()  # nothing moved: nothing merged again
    assert merged.merges == before
    a.requests.labels("vllm", "success").inc()  # one family moves
    same()
    assert merged.merges == before + 1
    b.requests.labels("sglang", "failure").inc(2)  # a new series, appended to a file
    b.ttft.labels("sglang").observe(0.7)
    same()
    c = procs(303)  # a new worker's files
    c.live.labels("vllm").set(7)
    c.high.set(99)
    same()
    mark_process_dead(303, str(tmp_path))  # its live gauges go with it
    same()


def test_a_file_being_created_is_refused_as_prometheus_client_refuses_it(tmp_path: Path) -> None:
    import struct

    (tmp_path / "counter_4242.db").write_bytes(b"")
    with pytest.raises(struct.error):
        MergedValues(tmp_path).collect()
    with pytest.raises(struct.error):
        MultiProcessCollector(None, path=str(tmp_path)).collect()


def test_an_unchanged_family_is_encoded_once(procs: Callable[[int], Proc], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    a = procs(101)
    a.requests.labels("vllm", "success").inc()
    a.each.set(1)
    registry = CollectorRegistry()
    registry.register(MergedValues(tmp_path))
    render(registry, OM, "identity")
    encoded: list[str] = []
    real = openmetrics.generate_latest

    def counting(reg: Any, *args: Any, **kwargs: Any) -> bytes:
        encoded.extend(f.name for f in reg.collect())
        return real(reg, *args, **kwargs)

    monkeypatch.setattr(openmetrics, "generate_latest", counting)
    a.each.set(2)
    render(registry, OM, "identity")
    assert encoded == ["t_each"]
