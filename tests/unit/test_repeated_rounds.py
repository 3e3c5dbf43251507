"""A round announced twice in one run (the quick start's curl around ``vllm bench serve``, then
``load --plan`` announcing the same round 1 again) is never merged into one.

* ``evidence export --window scenario:NAME#ROUND`` (``:steady`` too) refuses it: exit 2, one line
  with each announcement's span as ``START,END`` for ``--window``;
* ``evidence summarize`` shows each announcement as a round of its own, with a ``warning:`` line;
* ``POST /-/scenario`` still sets it, and its answer (and one log line) warns.

No process is started: Prometheus is :class:`FakeProm`, the proxy runs in the test's loop."""

from __future__ import annotations

import csv
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from exporter.evidence import cli as evidence_cli
from exporter.evidence.cli import main as evidence_main
from exporter.evidence.summarize import summarize
from exporter.evidence.windows import WindowError, parse_window
from exporter.proxy.app import create_app
from exporter.proxy.metrics import ProxyMetrics
from exporter.proxy.records import JsonlWriter
from exporter.proxy.scenarios import MAX_ROUNDS, ScenarioBoard
from exporter.proxy.shared import SharedScenarios
from exporter.proxy.state import Worker

from tests.helpers import make_config
from tests.unit.test_evidence_export_surfaces import RUN_1, RUN_2, T0, FakeProm, _event, _records

SPAN = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z),(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)")


def _requests(scenario: str, rnd: int, t0: float, n: int, *, engine: str = "vllm", run: str = RUN_1,
              tag: str = "") -> list[dict[str, Any]]:
    """``n`` requests of 1 s, 4 at a time, from ``t0``."""
    return [{"id": f"{run}-{engine}-{scenario}-{rnd}-{tag}{i}", "run_id": run, "engine": engine, "scenario": scenario,
             "round": rnd, "start_unix": t0 + (i // 4) * 1.0, "e2e_s": 1.0, "ttft_s": 0.1, "tpot_s": 0.01,
             "completion_tokens": 128, "outcome": "success", "reason": None} for i in range(n)]


def _announced_twice(tmp: Path, *, scenarios_log: bool = True) -> Path:
    """The bug as seen: short-c32#1 on vllm at T0..T0+16 (the bench), short-c1#1 and a warm-up in
    between, then short-c32#1 again at T0+97..T0+104 (load); sglang ran short-c32#1 once."""
    events = [_event(RUN_1, T0, "short-c32", 1), _event(RUN_1, T0 + 16, None, None),
              _event(RUN_1, T0 + 20, "short-c32", 1, ("sglang",)), _event(RUN_1, T0 + 30, None, None, ("sglang",)),
              _event(RUN_1, T0 + 40, "warmup", 0), _event(RUN_1, T0 + 45, "short-c1", 1),
              _event(RUN_1, T0 + 90, None, None),
              _event(RUN_1, T0 + 97, "short-c32", 1), _event(RUN_1, T0 + 104, None, None)]
    records = (_requests("short-c32", 1, T0, 16, tag="a") + _requests("short-c32", 1, T0 + 20, 8, engine="sglang")
               + _requests("warmup", 0, T0 + 40, 4) + _requests("short-c1", 1, T0 + 45, 12)
               + _requests("short-c32", 1, T0 + 97, 12, tag="b"))
    d = _records(tmp / "run", events if scenarios_log else [], records)
    if not scenarios_log:
        (d / "scenarios.jsonl").unlink()
    return d


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeProm:
    prom = FakeProm()
    monkeypatch.setattr(evidence_cli, "_prom", lambda args: prom)
    return prom


# --- evidence export: the windows -----------------------------------------------------------------

def test_a_round_announced_twice_in_a_run_is_refused_with_each_span(tmp_path: Path) -> None:
    d = _announced_twice(tmp_path)
    with pytest.raises(WindowError) as caught:
        parse_window("scenario:short-c32#1", records=d)
    message = str(caught.value)
    assert "\n" not in message and "scenario:short-c32#1" in message and RUN_1 in message
    assert "vllm 2 times" in message and "sglang" not in message  # sglang announced it once
    assert "evidence summarize" in message and "--window " in message
    spans = SPAN.findall(message)
    assert len(spans) == 3  # vllm's two, then the example
    # each START,END given parses as a window, and is the announcement's span to the millisecond
    got = [parse_window(f"{a},{b}") for a, b in spans[:2]]
    assert [(w.start, w.end) for w in got] == [(T0, T0 + 16), (T0 + 97, T0 + 104)]
    assert spans[2] == spans[1]  # the example is the latest one


def test_export_refuses_every_form_of_the_round_and_keeps_the_rest(tmp_path: Path, fake: FakeProm,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    d = _announced_twice(tmp_path)
    args = ["export", "--prometheus", fake.url, "--records", str(d), "--boards", "comparison"]
    for window in ("scenario:short-c32#1", "scenario:short-c32#1:steady", "scenario:short-c32#1:steady:vllm"):
        for run in ([], ["--run", RUN_1]):
            out = tmp_path / "x"
            assert evidence_main([*args, *run, "--window", window, "--out", str(out)]) == 2, window
            err = capsys.readouterr().err
            assert err.startswith("evidence: ") and err.count("\n") == 1, err
            assert "announced more than once" in err and "vllm 2 times" in err and "Traceback" not in err
            assert not out.exists()
    # sglang's own steady window: it announced the round once
    assert parse_window("scenario:short-c32#1:steady:sglang", records=d).run == RUN_1
    # every round of the scenario (no #ROUND) merges as before: the first start to the last end
    w = parse_window("scenario:short-c32", records=d)
    assert (w.start, w.end) == (T0, T0 + 104) and dict((e, (a, b)) for e, a, b in w.engines)["vllm"] == (T0, T0 + 104)


def test_announced_twice_in_a_row_is_one_span_and_a_restart_leaves_one(tmp_path: Path) -> None:
    """POST twice alike (nothing in between) goes on; a round a restart left open is one span."""
    events = [_event(RUN_1, T0, "short-c32", 1), _event(RUN_1, T0 + 5, "short-c32", 1),
              _event(RUN_1, T0 + 6, "short-c32", 1, ("vllm", "sglang")),
              _event(RUN_1, T0 + 16, None, None, ("vllm", "sglang")),
              _event(RUN_1, T0 + 20, "short-c1", 1), _event(RUN_2, T0 + 50, "short-c8", 1)]
    d = _records(tmp_path / "r", events)
    w = parse_window("scenario:short-c32#1", records=d)
    assert (w.start, w.end) == (T0, T0 + 16) and {e for e, _, _ in w.engines} == {"vllm", "sglang"}
    left_open = parse_window("scenario:short-c1#1", records=d)
    assert (left_open.start, left_open.end) == (T0 + 20, T0 + 50) and left_open.run == RUN_1
    from exporter.evidence.runs import read_announcements  # the one reader of scenarios.jsonl

    log = read_announcements(d)
    assert [(a.engine, a.scenario, a.start, a.end) for a in log.spans if a.scenario == "short-c32"] == [
        ("vllm", "short-c32", T0, T0 + 16), ("sglang", "short-c32", T0 + 6, T0 + 16)]
    assert log.runs == {RUN_1: T0, RUN_2: T0 + 50}


def test_the_same_round_in_another_run_is_not_a_repeat(tmp_path: Path) -> None:
    events = [_event(RUN_1, T0, "short-c32", 1), _event(RUN_1, T0 + 8, None, None),
              _event(RUN_2, T0 + 100, "short-c32", 1), _event(RUN_2, T0 + 121, None, None)]
    d = _records(tmp_path / "r", events)
    with pytest.raises(WindowError, match="2 runs"):  # the several-runs refusal, as before
        parse_window("scenario:short-c32#1", records=d)
    w = parse_window("scenario:short-c32#1", records=d, run=RUN_2)
    assert (w.start, w.end) == (T0 + 100, T0 + 121)


# --- evidence summarize ---------------------------------------------------------------------------

def test_summarize_splits_a_round_announced_twice_and_warns(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    d = _announced_twice(tmp_path)
    out = tmp_path / "out"
    assert evidence_main(["summarize", "--records", str(d), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if "announced 2 times" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: ")
    assert "vllm short-c32#1" in warned[0] and RUN_1 in warned[0], warned
    summary = json.loads((out / "summary.json").read_text())
    again = [r["round"] for r in summary["rounds"] if r["engine"] == "vllm" and r["scenario"] == "short-c32"]
    assert len(again) == 2 and again[0] == 1 and isinstance(again[1], str)
    assert again[1] == f"1 (again at {_hms(T0 + 97)})"
    requests = {r["round"]: r["requests"] for r in summary["rounds"]
                if r["engine"] == "vllm" and r["scenario"] == "short-c32"}
    assert requests == {1: 16, again[1]: 12}  # not one round of 28
    sglang = [r["round"] for r in summary["rounds"] if r["engine"] == "sglang"]
    assert sglang == [1]  # announced once: untouched
    assert [r["round"] for r in summary["rounds"] if r["scenario"] == "short-c1"] == [1]
    median = next(m for m in summary["medians"] if m["engine"] == "vllm" and m["scenario"] == "short-c32")
    assert median["rounds"] == 2
    (repeated,) = summary["repeated_rounds"]
    assert (repeated["engine"], repeated["scenario"], repeated["round"], repeated["announcements"]) == (
        "vllm", "short-c32", 1, 2)
    assert [(s["label"], s["start"], s["end"], s["requests"]) for s in repeated["spans"]] == [
        (1, T0, T0 + 16, 16), (again[1], T0 + 97, T0 + 104, 12)]
    with open(out / "rounds.csv", newline="") as fh:
        labels = [row["round"] for row in csv.DictReader(fh) if row["engine"] == "vllm"
                  and row["scenario"] == "short-c32"]
    assert labels == ["1", again[1]]
    md = (out / "summary.md").read_text()
    assert "Rounds announced more than once" in md and f"| vllm | short-c32 | {again[1]} |" in md


def _hms(ts: float) -> str:
    return time.strftime("%H:%M:%SZ", time.gmtime(ts))


def test_summarize_without_scenario_events_is_as_before(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _announced_twice(tmp_path, scenarios_log=False)
    out = tmp_path / "out"
    assert evidence_main(["summarize", "--records", str(d), "--out", str(out)]) == 0
    assert "announced" not in capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    vllm = [r for r in summary["rounds"] if r["engine"] == "vllm" and r["scenario"] == "short-c32"]
    assert [(r["round"], r["requests"]) for r in vllm] == [(1, 28)] and "repeated_rounds" not in summary


def test_summarize_of_two_copies_and_one_run_picked(tmp_path: Path) -> None:
    """The same directory given twice is not two announcements; ``--run`` keeps the split."""
    d = _announced_twice(tmp_path)
    records = [json.loads(x) for x in (d / "requests.jsonl").read_text().splitlines()]
    summary = summarize(records, records_dirs=[d, d / "requests.jsonl"], run=RUN_1)
    (repeated,) = summary["repeated_rounds"]
    assert repeated["announcements"] == 2
    assert sum(1 for w in summary["warnings"] if "announced 2 times" in w) == 1
    assert records[0]["round"] == 1 and all(r["round"] == 1 for r in records if r["scenario"] == "short-c32")


# --- the proxy ------------------------------------------------------------------------------------

async def test_the_proxy_warns_of_a_round_announced_again(upstream: Any, proxy_factory: Any,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    _, server = upstream
    client = await proxy_factory(server.port, scenarios=["short-c1", "short-c32", "warmup"])

    async def post(doc: dict[str, Any]) -> dict[str, Any]:
        resp = await client.post("/-/scenario", json=doc)
        assert resp.status == 200
        body: dict[str, Any] = await resp.json()
        return body

    caplog.set_level(logging.WARNING, logger="llmbench.proxy")
    first = await post({"scenario": "short-c32", "round": 1, "engine": "vllm"})
    assert "warning" not in first
    assert "warning" not in await post({"scenario": "short-c32", "round": 1, "engine": "vllm"})  # in a row: goes on
    assert "warning" not in await post({"scenario": None, "engine": "vllm"})  # clearing never warns
    assert "warning" not in await post({"scenario": "short-c32", "round": 1, "engine": "sglang"})  # its first
    for _ in range(2):  # warm-ups are announced again and again by design
        assert "warning" not in await post({"scenario": "warmup", "round": 0, "engine": "vllm"})
        assert "warning" not in await post({"scenario": None, "engine": "vllm"})
    assert not [r for r in caplog.records if "announced before" in r.getMessage()]
    # a scenario without a round is round 0, which evidence splits like any round: it warns alike
    assert "warning" not in await post({"scenario": "short-c1", "engine": "vllm"})
    assert "warning" not in await post({"scenario": None, "engine": "vllm"})
    assert "short-c1#0 was announced before" in (await post({"scenario": "short-c1", "engine": "vllm"}))["warning"]
    caplog.clear()
    again = await post({"scenario": "short-c32", "round": 1, "engine": "vllm"})
    assert again["scenario"] == "short-c32" and again["round"] == 1 and again["engines"] == ["vllm"]  # still set
    warning = again["warning"]
    assert "short-c32#1 was announced before in this run" in warning and "vllm at 20" in warning
    assert "separate announcement" in warning and "sglang" not in warning
    logged = [r for r in caplog.records if "announced before" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelno == logging.WARNING and "\n" not in logged[0].getMessage()
    scenarios = await (await client.get("/-/scenarios")).json()
    assert scenarios["active"]["vllm"] == {"scenario": "short-c32", "round": 1}


def test_announced_again_unchanged_keeps_its_start_and_memory_is_bounded(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    board = ScenarioBoard(["s"], ["vllm"], ProxyMetrics(registry, make_config(tmp_path, 1)),
                          JsonlWriter(tmp_path / "scenarios.jsonl"), "run-x")
    board.announce("s", 1)
    start = board.rounds.previous("vllm", board.active("vllm"))  # type: ignore[arg-type]
    done = board.announce("s", 1)
    assert done.warning is None and done.changed == [] and board.rounds.previous("vllm", board.active("vllm")) == start  # type: ignore[arg-type]
    board.announce(None, 0)
    assert board.announce("s", 1).warning is not None
    for rnd in range(2, MAX_ROUNDS + 2):  # the 256 rounds kept for the gauges: round 1 is forgotten
        board.announce("s", rnd)
    assert len(board.rounds) == MAX_ROUNDS
    assert board.announce("s", 1).warning is None


async def test_workers_share_what_was_announced(tmp_path: Path, upstream: Any, aiohttp_client: Any) -> None:
    """Under ``serve --workers N`` a POST reaches any worker: the round announced through one
    and announced again through another is still known."""
    path = tmp_path / "scenarios.state"
    SharedScenarios.create(path).close()
    config = make_config(tmp_path, upstream[1].port)
    clients = [await aiohttp_client(create_app(config, CollectorRegistry(),
                                               Worker(str(i), None, SharedScenarios(path), "run-shared")))
               for i in range(2)]
    for i, doc in enumerate([{"scenario": "short-c1", "round": 3}, {"scenario": "short-c32", "round": 1},
                             {"scenario": "short-c1", "round": 3}]):
        body = await (await clients[i % 2].post("/-/scenario", json=doc)).json()
        assert ("warning" in body) == (i == 2), body
    assert "run-shared" in body["warning"] and "vllm at" in body["warning"] and "sglang at" in body["warning"]
