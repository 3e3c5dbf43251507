"""The supervisor's merge (exporter/proxy/merge.py) answers the samples prometheus_client's own
MultiProcessCollector answers for the same value files, written by real metrics of two
"processes", while values move, series and files appear and a dead worker's live gauges go; its
answer's bytes are prometheus_client's encoders' for the same families; and a series that did
not change is neither merged nor encoded again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, values
from prometheus_client.exposition import generate_latest
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from exporter.proxy import exposition
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


def _families(registry: Any) -> list[tuple[str, str, str, list[tuple[str, tuple[tuple[str, str], ...], float]]]]:
    """Families in order, each one's samples as a sorted list (the order inside a family is
    prometheus_client's version's own: 0.22 puts every histogram sum first)."""
    return [(f.name, f.type, f.documentation,
             sorted((s.name, tuple(sorted(s.labels.items())), s.value) for s in f.samples))
            for f in registry.collect()]


def _expected(path: Path) -> Any:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(path))
    return _families(registry)


class _Fixed:
    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> list[Any]:
        return self.families


def _check(registry: Any, merged: MergedValues, path: Path) -> None:
    """Our samples are prometheus_client's; our bytes, its encoders' for our families."""
    families = merged.collect()
    assert _families(_Fixed(families)) == _expected(path)
    fixed = _Fixed(families)
    assert render(registry, "", "identity")[0] == generate_latest(fixed)  # type: ignore[arg-type]
    assert render(registry, OM, "identity")[0] == openmetrics.generate_latest(fixed)  # type: ignore[arg-type]
    text_string_to_metric_families(render(registry, OM, "identity")[0].decode())  # a valid OpenMetrics answer


def test_the_merge_answers_what_prometheus_client_answers(procs: Callable[[int], Proc], tmp_path: Path) -> None:
    a, b = procs(101), procs(202)
    merged = MergedValues(tmp_path)
    registry = CollectorRegistry()
    registry.register(merged)

    def same() -> None:
        _check(registry, merged, tmp_path)

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
    a.requests.labels("vllm", "success").inc()  # one series moves
    b.ttft.labels("vllm").observe(0.2)
    same()
    assert merged.merges == before + 2
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


def test_an_unchanged_series_is_encoded_once(procs: Callable[[int], Proc], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    a = procs(101)
    for engine in ("vllm", "sglang"):
        a.requests.labels(engine, "success").inc()
        a.ttft.labels(engine).observe(0.3)
    a.each.set(1)
    registry = CollectorRegistry()
    registry.register(MergedValues(tmp_path))
    render(registry, OM, "identity")
    encoded: list[tuple[str, list[dict[str, str]]]] = []
    real = exposition._Encoding.whole

    def counting(self: Any, family: Any) -> bytes:
        encoded.append((family.name, [s.labels for s in family.samples]))
        return real(self, family)

    monkeypatch.setattr(exposition._Encoding, "whole", counting)
    a.ttft.labels("sglang").observe(0.3)
    render(registry, OM, "identity")
    assert [name for name, _ in encoded] == ["t_ttft_seconds"]  # one family, one series of it
    assert {labels["engine"] for _, samples in encoded for labels in samples} == {"sglang"}
