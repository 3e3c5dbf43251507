"""The private library contract the proxy relies on (exporter/proxy/internals.py), exercised
against the installed prometheus_client through real multiprocess files: a release that breaks
it turns this test red, by name."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, values
from prometheus_client.multiprocess import MultiProcessCollector

from exporter.proxy.internals import use_multiprocess_values


def test_multiprocess_values_go_to_the_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker inherits prometheus_client imported without PROMETHEUS_MULTIPROC_DIR: the
    value class is replaced, and metrics made after it write this process's files."""
    monkeypatch.setattr(values, "ValueClass", values.ValueClass)  # restored after the test
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    use_multiprocess_values()
    counter = Counter("llmbench_internals_probe", "probe", ["k"], registry=None)
    counter.labels("a").inc(3)
    assert list(tmp_path.glob("counter_*.db"))
    merged = CollectorRegistry()
    MultiProcessCollector(merged, path=str(tmp_path))
    assert merged.get_sample_value("llmbench_internals_probe_total", {"k": "a"}) == 3.0
