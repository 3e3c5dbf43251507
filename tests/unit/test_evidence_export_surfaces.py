"""Issue 27 / SPEC 22: ``evidence export`` never mixes runs, says so when the proxies' boards are
empty (exit 3, files written), and gives a one-round window's exact totals from the counters.

Prometheus is a stand-in object here (no process): it answers each query from a table, and keeps
the queries it was asked."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from dashboards.catalogue import BOARDS, PANELS
from exporter.evidence import cli as evidence_cli
from exporter.evidence import export as export_module
from exporter.evidence import export_files, render
from exporter.evidence import totals as totals_module
from exporter.evidence.cli import main as evidence_main
from exporter.evidence.counts import covering
from exporter.evidence.evidence_md import panel_kind
from exporter.evidence.windows import Window, WindowError, parse_window

RUN_1, RUN_2 = "20261201T090000Z-aaaaaa", "20261201T100000Z-bbbbbb"
NOW = time.time()
T0 = float(int(NOW) - 3600)  # an hour ago: every window lies in the past


class FakeProm:
    """A Prometheus query API from a table: ``ranges`` (substring of a panel query -> a value for
    each of its points), ``counts`` (substring of a counter query -> {engine: value}) and ``jobs``
    (the jobs with llmbench_ series)."""

    url = "http://prometheus.test"
    header_names: list[str] = []

    def __init__(self, ranges: dict[str, float] | None = None, counts: dict[str, dict[str, float]] | None = None,
                 jobs: list[str] | None = None) -> None:
        self.ranges = ranges or {}
        self.counts = counts or {}
        self.jobs = jobs or []
        self.extra_params: dict[str, str] = {}
        self.asked: list[tuple[str, float | None]] = []
        self.ranged: list[str] = []  # the range queries asked

    def backend(self) -> dict[str, Any]:
        return {"name": "Prometheus", "version": "3.1.0", "revision": "test", "how": "status/buildinfo"}

    def buildinfo(self) -> dict[str, Any]:
        return {"version": "3.1.0"}

    def scrape_intervals(self) -> dict[str, float]:
        return {"llmbench-exporter": 5.0}

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        self.asked.append((expr, at))
        if '__name__=~"llmbench_.+"' in expr:
            return [{"metric": {"job": j}, "value": [at, "1"]} for j in self.jobs]
        for key, per_engine in self.counts.items():
            if key in expr:
                return [{"metric": {"engine": e}, "value": [at, str(v)]} for e, v in per_engine.items()]
        return []

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        self.ranged.append(expr)
        for key, value in self.ranges.items():
            if key in expr:
                return [{"metric": {"engine": "vllm"}, "values": [[start, str(value)], [end, str(value)]]}]
        return []


def _records(path: Path, events: list[dict[str, Any]], records: list[dict[str, Any]] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "scenarios.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records or []))
    return path


def _event(run: str | None, t: float, scenario: str | None, rnd: int | None, engines: tuple[str, ...] = ("vllm",)
           ) -> dict[str, Any]:
    ev = {"unix": t, "engines": list(engines), "scenario": scenario, "round": rnd}
    if run is not None:
        ev["run_id"] = run
    return ev


def _closed(run: str, t0: float, n: int = 16) -> list[dict[str, Any]]:
    """A closed loop of 4 clients, batches of 1 s back to back."""
    return [{"id": f"{run}-{i}", "run_id": run, "engine": "vllm", "scenario": "short-c4", "round": 1,
             "start_unix": t0 + (i // 4) * 1.0, "e2e_s": 1.0, "ttft_s": 0.1, "tpot_s": 0.01,
             "completion_tokens": 128, "outcome": "success", "reason": None} for i in range(n)]


def _two_runs(tmp: Path) -> Path:
    """The quick start after a proxy restart: round 1 of short-c4 in run 1 and again in run 2."""
    events = [_event(RUN_1, T0, "short-c4", 1), _event(RUN_1, T0 + 8, None, None),
              _event(RUN_2, T0 + 100, "short-c4", 1), _event(RUN_2, T0 + 121, None, None)]
    return _records(tmp / "run", events, _closed(RUN_1, T0) + _closed(RUN_2, T0 + 100))


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeProm:
    prom = FakeProm()
    monkeypatch.setattr(evidence_cli, "_prom", lambda args: prom)
    return prom


def test_a_round_held_by_two_runs_is_refused_unless_run_picks_one(tmp_path: Path, fake: FakeProm,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """issue 27: after a proxy restart, `scenario:short-c4#1` spanned run 1's start to run 2's end."""
    d = _two_runs(tmp_path)
    args = ["export", "--prometheus", fake.url, "--records", str(d), "--boards", "comparison", "--no-png"]
    for window in ("scenario:short-c4#1", "scenario:short-c4", "scenario:short-c4#1:steady"):
        assert evidence_main([*args, "--window", window, "--out", str(tmp_path / "x")]) == 2, window
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and RUN_1 in err and RUN_2 in err and "--run" in err, err
        assert not (tmp_path / "x").exists()
    w = parse_window("scenario:short-c4#1", records=d, run=RUN_2)
    assert (w.start, w.end) == (T0 + 100, T0 + 121) and w.run == RUN_2 and RUN_2 in w.source
    w1 = parse_window("scenario:short-c4#1", records=d, run=RUN_1)
    assert (w1.start, w1.end) == (T0, T0 + 8)
    steady = parse_window("scenario:short-c4#1:steady", records=d, run=RUN_2)
    assert T0 + 100 <= steady.start < steady.end <= T0 + 104
    out = tmp_path / "ok"
    assert evidence_main([*args, "--window", "scenario:short-c4#1", "--run", RUN_2, "--out", str(out)]) in (0, 3)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["window"]["run"] == RUN_2 and manifest["window"]["start"] == T0 + 100


def test_run_is_checked_and_only_where_records_are_read(tmp_path: Path, fake: FakeProm,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    d = _two_runs(tmp_path)
    base = ["export", "--prometheus", fake.url, "--out", str(tmp_path / "x")]
    cases = [(["--records", str(d), "--window", "scenario:short-c4#1", "--run", "nope"], "runs there"),
             (["--records", str(d), "--window", "scenario:short-c4#1:steady", "--run", "nope"], "runs there"),
             (["--records", str(d), "--window", "last:5m", "--run", RUN_1], "reads no records"),
             (["--window", "scenario:short-c4#1", "--run", RUN_1], "add --records")]
    for extra, message in cases:
        assert evidence_main([*base, *extra]) == 2, extra
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_a_restart_that_left_a_round_announced_ends_it_at_the_next_run(tmp_path: Path) -> None:
    events = [_event(RUN_1, T0, "short-c4", 1), _event(RUN_2, T0 + 100, "short-c8", 1)]
    d = _records(tmp_path / "r", events)
    w = parse_window("scenario:short-c4#1", records=d)
    assert (w.start, w.end) == (T0, T0 + 100) and w.run == RUN_1
    old = _records(tmp_path / "old", [_event(None, T0, "short-c4", 1), _event(None, T0 + 5, None, None)])
    assert parse_window("scenario:short-c4#1", records=old).run == "unknown"
    with pytest.raises(WindowError, match="unknown scenario"):
        parse_window("scenario:short-c8#1", records=d, run=RUN_1)


def test_an_export_whose_proxy_panels_are_all_empty_exits_3_with_its_files(tmp_path: Path, fake: FakeProm,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """issue 27: `--job WRONG` exited 0 with 58 files, the engines' own panels having data."""
    fake.ranges = {'job="vllm"': 1.0}  # the engine-internals board finds the engine's series
    fake.jobs = ["llmbench-exporter", "vllm"]
    out = tmp_path / "wrong"
    window = f"{T0:.0f},{T0 + 600:.0f}"
    rc = evidence_main(["export", "--prometheus", fake.url, "--window", window, "--out", str(out), "--job", "WRONG",
                        "--boards", "comparison", "internals"])
    captured = capsys.readouterr()
    assert rc == 3
    assert captured.err.count("\n") == 1 and captured.err.startswith("evidence: ")
    assert '{job="WRONG"}' in captured.err and "'llmbench-exporter'" in captured.err
    assert "pass --job llmbench-exporter" in captured.err and "Traceback" not in captured.err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["no_series"] and (out / "EVIDENCE.md").exists() and len(manifest["files"]) > 10
    assert "**No series:" in (out / "EVIDENCE.md").read_text() and "![" in (out / "EVIDENCE.md").read_text()
    assert manifest["pngs"] is True and {"comparison.png", "internals.png"} <= {f["path"] for f in manifest["files"]}
    # the proxies' series under the job asked for: exit 0
    fake.ranges = {'job="vllm"': 1.0, 'job="llmbench-exporter"': 2.0}
    assert evidence_main(["export", "--prometheus", fake.url, "--window", window, "--out", str(tmp_path / "ok"),
                          "--boards", "comparison", "--no-png"]) == 0
    assert json.loads((tmp_path / "ok" / "manifest.json").read_text())["no_series"] is None
    # nothing anywhere: exit 3 too, and the line says no job has them
    fake.ranges, fake.jobs = {}, []
    assert evidence_main(["export", "--prometheus", fake.url, "--window", window, "--out", str(tmp_path / "none"),
                          "--boards", "gpu", "--no-png"]) == 3
    err = capsys.readouterr().err
    assert "no llmbench_ series under any job" in err and err.count("\n") == 1


def test_one_round_window_gives_round_totals_from_the_counters(tmp_path: Path, fake: FakeProm,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """issue 27: for an 8 s round the throughput panel (a 1-minute rate) showed 40 tok/s against
    1,167 tok/s in the records, with no word why."""
    events = [_event(RUN_1, T0, "short-c4", 1, ("vllm", "sglang")), _event(RUN_1, T0 + 8, None, None, ("vllm",)),
              _event(RUN_1, T0 + 10, None, None, ("sglang",))]
    d = _records(tmp_path / "run", events)
    fake.ranges = {'job="llmbench-exporter"': 40.0}
    fake.counts = {'llmbench_output_tokens_total{job="llmbench-exporter", scenario="short-c4", engine="vllm", '
                   'outcome="success"}': {"vllm": 9336.0},
                   'llmbench_requests_total{job="llmbench-exporter", scenario="short-c4", engine="vllm", '
                   'outcome="success"}': {"vllm": 72.0},
                   'llmbench_requests_total{job="llmbench-exporter", scenario="short-c4", engine="vllm"}':
                       {"vllm": 73.0},
                   'scenario="short-c4", engine="sglang"': {"sglang": 0.0}}
    out = tmp_path / "ev"
    assert evidence_main(["export", "--prometheus", fake.url, "--records", str(d), "--window", "scenario:short-c4#1",
                          "--out", str(out), "--boards", "comparison", "--no-png"]) == 0
    printed = capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    totals = manifest["round_totals"]
    assert set(totals) == {"vllm", "sglang"}
    v = totals["vllm"]
    assert (v["requests"], v["successes"], v["output_tokens"]) == (73, 72, 9336)
    assert v["output_tokens_per_s"] == pytest.approx(9336 / 8.0) and v["announced_s"] == pytest.approx(8.0)
    assert totals["sglang"]["announced_s"] == pytest.approx(10.0) and totals["sglang"]["requests"] == 0
    # counted from the scrape before the announced start to a scrape after its end
    span = covering(T0, T0 + 8, 5.0)
    assert (v["counted_from"], v["counted_to"]) == (span.baseline, span.at)
    assert any("llmbench_requests_total" in e and at == span.at for e, at in fake.asked)
    md = (out / "EVIDENCE.md").read_text()
    assert "## Round totals" in md and "| vllm | 73 | 72 | 9336 | 1167.0 |" in md
    # --no-png: the data, EVIDENCE.md and the manifest, no PNG drawn or linked
    assert manifest["pngs"] is False and not list(out.glob("*.png")) and "![" not in md
    assert not any(f["path"].endswith(".png") for f in manifest["files"])
    throughput = md.split("### Successful output throughput")[1].split("###")[0]
    # held against the shorter engine's round (8 s), not the 10 s window the two rounds make
    assert "1m rates over a 8.0 s round" in throughput and "round totals" in throughput
    assert manifest["rate_note"] and "1167.0 tok/s" in printed
    # a window that is no one round has none
    assert evidence_main(["export", "--prometheus", fake.url, "--window", f"{T0:.0f},{T0 + 600:.0f}",
                          "--out", str(tmp_path / "long"), "--boards", "comparison", "--no-png"]) == 0
    long = json.loads((tmp_path / "long" / "manifest.json").read_text())
    assert "round_totals" not in long and long["rate_note"] is None
    assert "Drawn from" not in (tmp_path / "long" / "EVIDENCE.md").read_text()


def _timed(run: str, t0: float, n: int, gap_s: float, e2e_s: float = 2.0, tokens: int = 128,
           scenario: str = "short-c4", engine: str = "vllm", failed: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    """``n`` requests of round 1, one every ``gap_s`` from ``t0``, each ``e2e_s`` long; those at
    ``failed`` failed (no tokens)."""
    return [{"id": f"{run}-{engine}-{scenario}-{i}", "run_id": run, "engine": engine, "scenario": scenario, "round": 1,
             "start_unix": t0 + i * gap_s, "e2e_s": e2e_s, "ttft_s": 0.1, "tpot_s": 0.01,
             "completion_tokens": None if i in failed else tokens,
             "outcome": "failure" if i in failed else "success", "reason": "empty_text" if i in failed else None}
            for i in range(n)]


def _counters(tokens: float, ok: float, requests: float) -> dict[str, dict[str, float]]:
    """The stand-in's answers to round totals' counter queries for vLLM's short-c4."""
    sel = 'job="llmbench-exporter", scenario="short-c4", engine="vllm"'
    return {f'llmbench_output_tokens_total{{{sel}, outcome="success"}}': {"vllm": tokens},
            f'llmbench_requests_total{{{sel}, outcome="success"}}': {"vllm": ok},
            f"llmbench_requests_total{{{sel}}}": {"vllm": requests}}


def test_round_totals_add_the_requests_span_of_the_records(tmp_path: Path, fake: FakeProm,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The quick start's round: announced for 16 s (the bench client's start-up and exit inside), its
    requests over 5 s; `vllm bench serve` and `evidence summarize` said 1627.9 and 1636 tok/s, the
    export only 513.2 over the announced span."""
    events = [_event(RUN_1, T0, "short-c4", 1, ("vllm", "sglang")), _event(RUN_1, T0 + 16, None, None, ("vllm", "sglang"))]
    # round 1 of run 1 (one failure: it stays in the span), and round 1 of another run that must not mix
    recs = _timed(RUN_1, T0 + 9, 7, 0.5, failed=(3,)) + _timed(RUN_2, T0 + 200, 4, 1.0)
    d = _records(tmp_path / "run", events + [_event(RUN_2, T0 + 199, "short-c8", 1), _event(RUN_2, T0 + 210, None, None)],
                 recs)
    fake.ranges = {'job="llmbench-exporter"': 1.0}
    fake.counts = {**_counters(768, 6, 7), 'scenario="short-c4", engine="sglang"': {"sglang": 0.0}}
    out = tmp_path / "ev"
    assert evidence_main(["export", "--prometheus", fake.url, "--records", str(d), "--window", "scenario:short-c4#1",
                          "--out", str(out), "--boards", "comparison", "--no-png"]) == 0
    totals = json.loads((out / "manifest.json").read_text())["round_totals"]
    v = totals["vllm"]
    mine = [r for r in recs if r["run_id"] == RUN_1]
    first, last = min(r["start_unix"] for r in mine), max(r["start_unix"] + r["e2e_s"] for r in mine)
    tokens = sum(r["completion_tokens"] for r in mine if r["outcome"] == "success")
    assert (first, last, tokens) == (T0 + 9, T0 + 14, 768)
    assert v["requests_span_s"] == pytest.approx(last - first) and v["output_tokens_per_s_requests"] == pytest.approx(
        tokens / (last - first))
    assert (v["requests_first_start"], v["requests_last_end"]) == (pytest.approx(first), pytest.approx(last))
    assert (v["records_requests"], v["records_output_tokens"], v["spans_differ"]) == (7, 768, True)
    assert v["output_tokens_per_s"] == pytest.approx(768 / 16)  # the SPEC's figure is kept
    assert totals["sglang"]["requests_span_s"] is None and totals["sglang"]["spans_differ"] is None
    md = (out / "EVIDENCE.md").read_text()
    row = next(x for x in md.splitlines() if x.startswith("| vllm |"))
    assert row.startswith("| vllm | 7 | 6 | 768 | 48.0 | 16.000 s from") and "| 5.000 s | 153.6 |" in row
    assert "| sglang |" in md and "| no records | - |" in md
    assert "evidence summarize" in md and "bench client" in md
    assert "For vllm the announced span (16.0 s) is 3.2 times its requests' span (5.0 s)" in md and "start-up" in md
    line = totals_module.totals_line("vllm", v)
    assert line.startswith("round totals vllm: ") and "48.0 tok/s over the announced 16.0 s" in line
    assert "153.6 tok/s over its requests' 5.0 s (records" in line
    # without --records (the gauges give the window): no such fields, the line as before
    bare = {k: x for k, x in v.items() if k in ("requests", "successes", "output_tokens", "output_tokens_per_s",
                                              "announced_s")}
    assert totals_module.totals_line("vllm", bare).endswith("over the announced 16.0 s (exact, from the counters)")
    capsys.readouterr()


def test_spans_within_20_percent_get_no_sentence(tmp_path: Path, fake: FakeProm) -> None:
    events = [_event(RUN_1, T0, "short-c4", 1), _event(RUN_1, T0 + 5.5, None, None)]
    d = _records(tmp_path / "run", events, _timed(RUN_1, T0 + 0.2, 6, 0.6, e2e_s=2.0))  # 5.0 s of requests
    fake.ranges = {'job="llmbench-exporter"': 1.0}
    fake.counts = _counters(768, 6, 6)
    out = tmp_path / "ev"
    assert evidence_main(["export", "--prometheus", fake.url, "--records", str(d), "--window", "scenario:short-c4#1",
                          "--out", str(out), "--boards", "comparison", "--no-png"]) == 0
    v = json.loads((out / "manifest.json").read_text())["round_totals"]["vllm"]
    assert v["requests_span_s"] == pytest.approx(5.0) and v["spans_differ"] is False
    md = (out / "EVIDENCE.md").read_text()
    assert "tok/s over the requests' span" in md and "start-up (loading" not in md


def test_a_scenario_window_fills_scenario_on_every_board_query(tmp_path: Path, fake: FakeProm) -> None:
    """The user's `scenario:short-c32#1` showed the lines of the scenarios run in the minute before:
    `$scenario` was `.*`."""
    events = [_event(RUN_1, T0, "short.c4", 1), _event(RUN_1, T0 + 8, None, None)]
    d = _records(tmp_path / "run", events)
    fake.ranges = {'job="llmbench-exporter"': 1.0}
    out = tmp_path / "ev"
    assert evidence_main(["export", "--prometheus", fake.url, "--records", str(d), "--window", "scenario:short.c4#1",
                          "--out", str(out), "--boards", "comparison", "internals", "--no-png"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["scenario_filter"] == "short.c4"
    with_var = [e for e in fake.ranged if "scenario" in e]
    # every proxy query of the comparison board carries $scenario: all filtered, the dot escaped
    n = sum(len(p.queries) for p in BOARDS["comparison"].panels if "$scenario" in " ".join(p.exprs)) - sum(
        len(p.queries) for p in BOARDS["comparison"].panels if panel_kind(p) == "exact-count")
    assert len(with_var) >= n > 0 and all('scenario=~"short\\\\.c4"' in e for e in with_var), with_var[:2]
    throughput = json.loads((out / "data" / "comparison" / "throughput.json").read_text())
    assert 'scenario=~"short\\\\.c4"' in throughput["queries"][0]["expr"]
    # the exact counts are not filtered: they count every request that ended in the window (SPEC 18)
    exact = json.loads((out / "data" / "comparison" / "success_ratio.json").read_text())
    assert "short" not in exact["queries"][0]["expr"]
    md = (out / "EVIDENCE.md").read_text()
    assert "- Scenario filter: `short.c4`" in md
    # the round totals keep their own selector: the scenario exactly
    assert any('scenario="short.c4"' in e and "llmbench_requests_total" in e for e, _ in fake.asked)
    # a window of another form: every scenario
    fake.ranged.clear()
    assert evidence_main(["export", "--prometheus", fake.url, "--window", f"{T0:.0f},{T0 + 8:.0f}",
                          "--out", str(tmp_path / "plain"), "--boards", "comparison", "--no-png"]) == 0
    assert fake.ranged and not any("scenario" in e for e in fake.ranged)
    plain = json.loads((tmp_path / "plain" / "manifest.json").read_text())
    assert plain["scenario_filter"] is None
    assert "- Scenario filter: none" in (tmp_path / "plain" / "EVIDENCE.md").read_text()


@pytest.mark.parametrize("spec, name", [
    ("scenario:short-c32", "short-c32"), ("scenario:short-c32#1", "short-c32"),
    ("scenario:short-c32#1:steady", "short-c32"), ("scenario:short-c32#2:steady:vllm", "short-c32"),
    ("last:5m", None), ("1,2", None)])
def test_the_scenario_of_a_window(spec: str, name: str | None) -> None:
    assert export_module.scenario_filter(Window(0.0, 1.0, spec)) == name


def test_a_scenario_name_is_matched_literally() -> None:
    import re

    regex_literal = export_module.regex_literal
    assert regex_literal("short-c32") == "short-c32"
    for name in ("a.b", "in(24k)+c32", "x|y", 'q"uote', "br{1},ce", "back\\slash", "$dollar^", "tab\tname"):
        value = regex_literal(name)
        # nothing that ends the string or splits the selector: no quote, comma or brace but in \\x{..}
        assert not set('",{}') & set(re.sub(r"\\\\x\{[0-9a-f]+\}", "", value)), value
        # the string's value (backslashes halved), with RE2's \x{..} as Python's re spells it: the name only
        pattern = re.sub(r"\\x\{([0-9a-f]+)\}", lambda m: re.escape(chr(int(m.group(1), 16))),
                         value.replace("\\\\", "\\"))
        assert re.fullmatch(pattern, name) and not re.fullmatch(pattern, name + "x"), (name, value, pattern)


def test_png_titles_mark_rate_panels_over_a_shorter_window(tmp_path: Path, fake: FakeProm,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The boards users paste into reports: the title a rate panel is drawn with says it is a 1m rate
    over a shorter window, and where the window's figure is."""
    given: list[tuple[str, dict[str, str]]] = []
    real = export_files.render_board

    def spy(board: Any, data: Any, window: Any, out: Path, subtitle: str = "", marks: Any = None,
            rounds: Any = ()) -> Path:
        given.append((board.uid, dict(marks or {})))
        return real(board, data, window, out, subtitle=subtitle, marks=marks, rounds=rounds)

    monkeypatch.setattr(export_files, "render_board", spy)
    events = [_event(RUN_1, T0, "short-c4", 1), _event(RUN_1, T0 + 56.4, None, None)]
    d = _records(tmp_path / "run", events)
    fake.ranges = {'job="llmbench-exporter"': 1.0}
    assert evidence_main(["export", "--prometheus", fake.url, "--records", str(d), "--window", "scenario:short-c4#1",
                          "--out", str(tmp_path / "ev"), "--boards", "comparison"]) == 0
    (_, marks), = given
    panels = BOARDS["comparison"].panels
    assert set(marks) == {p.key for p in panels if panel_kind(p) == "rate"}
    assert render.panel_title(PANELS["throughput"], marks["throughput"]) == \
        "Successful output throughput (tok/s) — 1m rate, window 56 s: see round totals"
    assert render.panel_title(PANELS["ttft_p95"], marks["ttft_p95"]) == "TTFT P95 (s) — 1m rate, window 56 s: see evidence summarize"
    assert render.panel_title(PANELS["in_flight"]) == "Requests in flight"
    assert totals_module.TOTALS_PANELS <= set(PANELS)
    # no round totals (no one round): the throughput points at the records
    assert totals_module.rate_mark(PANELS["throughput"], 8.25, 60, "1m", False) == "1m rate, window 8.2 s: see evidence summarize"
    # a window as long as the rate window: no mark
    given.clear()
    assert evidence_main(["export", "--prometheus", fake.url, "--window", f"{T0:.0f},{T0 + 60:.0f}",
                          "--out", str(tmp_path / "long"), "--boards", "comparison"]) == 0
    assert given == [(BOARDS["comparison"].uid, {})]


def test_counters_that_took_in_a_neighbouring_round_say_so(tmp_path: Path, fake: FakeProm,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """`load` runs a cell's rounds back to back: the counters, known at scrapes, count round 1 up to
    the scrape after its end and so take in round 2's first answers (96 where the round had 64, seen
    on the real vLLM). The line no longer calls that exact: it gives the records' figures beside."""
    events = [_event(RUN_1, T0, "short-c4", 1), _event(RUN_1, T0 + 6, "short-c4", 2), _event(RUN_1, T0 + 12, None, None)]
    recs = _timed(RUN_1, T0 + 0.2, 6, 0.5, e2e_s=2.0)
    d = _records(tmp_path / "run", events, recs)
    span_s = max(r["start_unix"] + r["e2e_s"] for r in recs) - min(r["start_unix"] for r in recs)
    fake.ranges = {'job="llmbench-exporter"': 1.0}
    fake.counts = _counters(1152, 9, 9)  # three of round 2 ended before the scrape after round 1's end
    out = tmp_path / "ev"
    assert evidence_main(["export", "--prometheus", fake.url, "--records", str(d), "--window", "scenario:short-c4#1",
                          "--out", str(out), "--boards", "comparison", "--no-png"]) == 0
    printed = capsys.readouterr().out
    v = json.loads((out / "manifest.json").read_text())["round_totals"]["vllm"]
    assert (v["requests"], v["records_requests"], v["records_output_tokens"], v["counts_differ"]) == (9, 6, 768, True)
    line = next(x for x in printed.splitlines() if x.startswith("round totals vllm: "))
    assert "(exact, from the counters)" not in line and "(from the counters, scrape to scrape" in line
    # one thing said: the round's own figures first, each with the span it covers; the counters' only
    # as what they counted over their own span, with no rate of theirs beside the round's
    own = line.split("; the counters")[0]
    assert own.startswith("round totals vllm: the round itself (records")
    assert f"6/6 successful, 768 output tokens, {768 / span_s:.1f} tok/s over its requests' {span_s:.1f} s" in own
    counters = line.split("; the counters")[1]
    assert "counted 9 requests (9 successful, 1152 output tokens) over" in counters and "tok/s" not in counters
    assert line.count("tok/s") == 1 and "not the round's figures" in line
    md = (out / "EVIDENCE.md").read_text()
    assert "For vllm the counters count 9 requests and the records 6" in md
    assert "## Round totals (from the proxies' counters, scrape to scrape, and the records)" in md
    assert next(x for x in md.splitlines() if x.startswith("| vllm |")).split(" | ")[8] == "6"  # requests (records)
    # counts that agree: no such words
    fake.counts = _counters(768, 6, 6)
    assert evidence_main(["export", "--prometheus", fake.url, "--records", str(d), "--window", "scenario:short-c4#1",
                          "--out", str(tmp_path / "ev2"), "--boards", "comparison", "--no-png"]) == 0
    again = json.loads((tmp_path / "ev2" / "manifest.json").read_text())["round_totals"]["vllm"]
    assert again["counts_differ"] is False and "(exact, from the counters)" in capsys.readouterr().out
    # fewer in the counters than in the records: requests not yet ended at the last scrape, not a neighbour
    fake.counts = _counters(512, 4, 4)
    assert evidence_main(["export", "--prometheus", fake.url, "--records", str(d), "--window", "scenario:short-c4#1",
                          "--out", str(tmp_path / "ev3"), "--boards", "comparison", "--no-png"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("round totals vllm: "))
    assert "requests still running at the counters' last scrape" in line and "neighbouring" not in line
    md = (tmp_path / "ev3" / "EVIDENCE.md").read_text()
    assert "For vllm the counters count 4 requests and the records 6: a request is counted when it ends" in md


def test_a_short_round_in_a_long_window_is_still_marked(tmp_path: Path, fake: FakeProm) -> None:
    """Two engines one after the other make a window of 75 s, longer than the 1m rate; vLLM's round
    was 6 s, so its throughput panel still shows a tenth of its own figure: the mark and the note
    hold the rate window against the shorter round, not the window."""
    events = [_event(RUN_1, T0, "short-c4", 1, ("vllm",)), _event(RUN_1, T0 + 6, None, None, ("vllm",)),
              _event(RUN_1, T0 + 10, "short-c4", 1, ("sglang",)), _event(RUN_1, T0 + 75, None, None, ("sglang",))]
    d = _records(tmp_path / "run", events, _timed(RUN_1, T0 + 0.2, 6, 0.5, e2e_s=2.0))
    fake.ranges = {'job="llmbench-exporter"': 1.0}
    fake.counts = {**_counters(768, 6, 6), 'scenario="short-c4", engine="sglang"': {"sglang": 0.0}}
    out = tmp_path / "ev"
    assert evidence_main(["export", "--prometheus", fake.url, "--records", str(d), "--window", "scenario:short-c4#1",
                          "--out", str(out), "--boards", "comparison"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert "1m rates over a 6.0 s round" in manifest["rate_note"]
    throughput = (out / "EVIDENCE.md").read_text().split("### Successful output throughput")[1].split("###")[0]
    assert "1m rates over a 6.0 s round" in throughput
