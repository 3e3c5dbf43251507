"""Counters that never go back (:mod:`exporter.proxy.snapshot`): a snapshot of the value files in the records
directory, restored as a value file of its own under the next start, adds to that start's live counts on
every scrape; two proxies never share a records directory."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import Counter, Histogram, values

from exporter.cli import main as cli_main
from exporter.proxy.merge import MergedValues
from exporter.proxy.snapshot import SNAPSHOT, RecordsInUse, lock_records, restore, write_snapshot


class Proc:
    """One worker's counter and histogram, writing value files as process ``pid`` into the current directory."""

    def __init__(self, pid: int) -> None:
        values.ValueClass = values.MultiProcessValue(process_identifier=lambda: pid)
        self.requests = Counter("t_requests", "requests", ["engine", "outcome"], registry=None)
        self.lag = Histogram("t_lag_seconds", "lag", buckets=(0.001, 0.01, 1.0), registry=None)


@pytest.fixture
def start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Path]:
    """A run directory of its own for each start of the proxy (value files go there)."""
    monkeypatch.setattr(values, "ValueClass", values.ValueClass)  # restored after the test

    def make(name: str) -> Path:
        run = tmp_path / name
        run.mkdir()
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(run))
        return run

    return make


def _samples(run: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in MergedValues(run).collect() for s in f.samples}


def test_a_restart_continues_every_counter_and_histogram(start: Callable[[str], Path], tmp_path: Path) -> None:
    records = tmp_path / "records"
    records.mkdir()
    first = start("first")
    assert "every count starts at 0" in restore(records, first)  # a new records directory
    a, b = Proc(11), Proc(12)  # two workers
    a.requests.labels("vllm", "success").inc(5)
    b.requests.labels("vllm", "success").inc(2)
    b.requests.labels("sglang", "failure").inc()
    a.lag.observe(0.0005)
    b.lag.observe(0.5)
    before = _samples(first)
    write_snapshot(records, first, "run-1", final=True)

    second = start("second")
    assert "exact: a graceful stop, run run-1" in restore(records, second)
    assert _samples(second) == before  # nothing new yet: every series where it stopped
    c = Proc(21)
    c.requests.labels("vllm", "success").inc(3)
    c.lag.observe(0.5)
    after = _samples(second)
    key = ("t_requests_total", (("engine", "vllm"), ("outcome", "success")))
    assert (before[key], after[key]) == (7.0, 10.0)
    assert after[("t_requests_total", (("engine", "sglang"), ("outcome", "failure")))] == 1.0
    assert after[("t_lag_seconds_count", ())] == 3.0 and after[("t_lag_seconds_bucket", (("le", "1.0"),))] == 3.0
    assert after[("t_lag_seconds_sum", ())] == pytest.approx(1.0005)
    write_snapshot(records, second, "run-2", final=False)  # the next start adds up both
    third = start("third")
    assert "from the last periodic snapshot, run run-2" in restore(records, third)
    assert _samples(third) == after


def test_a_snapshot_that_cannot_be_read_starts_from_zero(start: Callable[[str], Path], tmp_path: Path) -> None:
    (tmp_path / SNAPSHOT).write_text('{"format": 1, "counter": [["k", "x"]]')
    run = start("run")
    note = restore(tmp_path, run)
    assert note.endswith("every count starts at 0") and "cannot be read" in note
    assert list(run.iterdir()) == []


def test_two_proxies_never_share_a_records_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = tmp_path / "run"
    records.mkdir()
    held = lock_records(records)
    try:
        with pytest.raises(RecordsInUse, match=r"is in use by another proxy \(pid \d+\)"):
            lock_records(records)
        config = tmp_path / "proxy.yaml"
        config.write_text(json.dumps({"listen": "127.0.0.1:1", "records_dir": str(records),
                                      "engines": [{"name": "vllm", "upstream": "http://127.0.0.1:2"}]}))
        assert cli_main(["serve", "--config", str(config)]) == 2  # refused before it binds or forks
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is in use by another proxy" in err and "Traceback" not in err
    finally:
        os.close(held)
    os.close(lock_records(records))  # free once the holder is gone
