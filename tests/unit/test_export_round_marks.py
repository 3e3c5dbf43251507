"""``evidence export``'s PNG boards mark where each round began (a dotted line and ``scenario#round``,
drawn by the same code as the report's boards), from ``--records``' ``scenarios.jsonl``, warm-ups
apart; ``--engine NAME`` keeps one engine's series (every query's ``$engine``) and its rounds."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from dashboards.catalogue import BOARDS
from exporter.evidence import cli as evidence_cli
from exporter.evidence import export_files, render, timeaxis
from exporter.evidence.cli import main as evidence_main
from exporter.evidence.report import engine_board
from exporter.evidence.runs import Announcement

from tests.unit.test_evidence_export_surfaces import FakeProm, _event, _records

RUN = "20261201T090000Z-cccccc"
T0 = float(int(time.time()) - 3600)
#: (start offset, scenario, round, engines): a warm-up, two rounds of vLLM, one of SGLang
ROUNDS = [(0.0, "warmup", 1, ("vllm",)), (10.0, "short-c4", 1, ("vllm",)), (40.0, "short-c4", 2, ("vllm",)),
          (70.0, "short-c4", 1, ("sglang",))]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeProm:
    prom = FakeProm(ranges={'job="llmbench-exporter"': 1.0})
    monkeypatch.setattr(evidence_cli, "_prom", lambda args: prom)
    return prom


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[Announcement]]]:
    """The rounds each board's PNG was drawn with."""
    seen: list[tuple[str, list[Announcement]]] = []
    real = export_files.render_board

    def spy(board: Any, data: Any, window: Any, out: Path, subtitle: str = "", marks: Any = None,
            rounds: Any = ()) -> Path:
        seen.append((subtitle, list(rounds)))
        return real(board, data, window, out, subtitle=subtitle, marks=marks, rounds=rounds)

    monkeypatch.setattr(export_files, "render_board", spy)
    return seen


def _dir(tmp_path: Path) -> Path:
    events = []
    for offset, scenario, rnd, engines in ROUNDS:
        events += [_event(RUN, T0 + offset, scenario, rnd, engines), _event(RUN, T0 + offset + 20, None, None, engines)]
    return _records(tmp_path / "run", events)


def _export(tmp_path: Path, name: str, *extra: str) -> int:
    return evidence_main(["export", "--prometheus", FakeProm.url, "--records", str(_dir(tmp_path)),
                          "--window", f"{T0 - 5:.0f},{T0 + 100:.0f}", "--out", str(tmp_path / name),
                          "--boards", "comparison", *extra])


def test_the_pngs_mark_each_round_but_warm_ups(tmp_path: Path, fake: FakeProm,
                                               drawn: list[tuple[str, list[Announcement]]]) -> None:
    assert _export(tmp_path, "ev") == 0
    (subtitle, rounds), = drawn
    want = [(T0 + o, s, str(r), e[0]) for o, s, r, e in ROUNDS if s != "warmup"]
    assert [(a.start, a.scenario, a.round, a.engine) for a in rounds] == want
    assert f"{len(want)} rounds marked" in subtitle
    assert json.loads((tmp_path / "ev" / "manifest.json").read_text())["rounds_marked"] == len(want)


def test_without_records_nothing_is_marked(tmp_path: Path, fake: FakeProm,
                                          drawn: list[tuple[str, list[Announcement]]]) -> None:
    assert evidence_main(["export", "--prometheus", FakeProm.url, "--window", f"{T0 - 5:.0f},{T0 + 100:.0f}",
                          "--out", str(tmp_path / "ev"), "--boards", "comparison"]) == 0
    (subtitle, rounds), = drawn
    assert rounds == [] and "rounds marked" not in subtitle


def test_engine_filter_keeps_one_engines_series_and_rounds(tmp_path: Path, fake: FakeProm,
                                                          drawn: list[tuple[str, list[Announcement]]],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert _export(tmp_path, "ev", "--engine", "sglang") == 0
    (subtitle, rounds), = drawn
    assert [(a.scenario, a.round, a.engine) for a in rounds] == [("short-c4", "1", "sglang")]
    assert "engine filter: sglang" in subtitle
    asked = fake.ranged + [expr for expr, _ in fake.asked]
    with_engine = [e for e in asked if 'engine=~"' in e or 'engine="' in e]
    assert with_engine and all('engine=~"sglang"' in e or 'engine="sglang"' in e for e in with_engine)
    assert not any("$engine" in e or "vllm" in e for e in fake.ranged)
    manifest = json.loads((tmp_path / "ev" / "manifest.json").read_text())
    assert manifest["engine_filter"] == "sglang"
    # a name no proxy config could hold is the user's mistake: one line, exit 2
    with pytest.raises(SystemExit) as done:
        _export(tmp_path, "bad", "--engine", 'vllm"}')
    assert done.value.code == 2 and "--engine" in capsys.readouterr().err


def test_render_draws_a_dotted_line_per_round_and_labels_the_top_row(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, bool]] = []
    real = render.draw_marks

    def spy(ax: Any, marks: Any, label: bool) -> None:
        calls.append((len(marks), label))
        real(ax, marks, label)

    monkeypatch.setattr(render, "draw_marks", spy)
    marks = [Announcement(RUN, "vllm", "short-c4", "1", T0 + 10, T0 + 30), Announcement(RUN, "vllm", "short-c4", "2",
                                                                                     T0 + 40, T0 + 60)]
    board = BOARDS["comparison"]
    render.render_board(board, {}, (T0, T0 + 100), tmp_path / "b.png", rounds=marks)
    series_panels = [p for p in board.panels if p.kind != "stat"]
    assert len(calls) == len(series_panels) and all(n == 2 for n, _ in calls)
    assert 0 < sum(label for _, label in calls) < len(calls)  # the top row's panels only


def test_one_drawing_for_the_export_and_the_report() -> None:
    """The report's engine board and the export's PNGs draw round markers with the same function."""
    assert engine_board.draw_marks is timeaxis.draw_marks is render.draw_marks
    assert engine_board.round_marks is timeaxis.round_marks
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.xaxis_date()
    marks = [Announcement(RUN, "vllm", "short-c4", "1", T0 + 10, T0 + 30),
             Announcement(RUN, "sglang", "short-c4", "1", T0 + 40, T0 + 60)]
    timeaxis.draw_marks(ax, marks, label=True)
    lines = [ln for ln in ax.lines if ln.get_linestyle() == ":"]
    assert sorted(ln.get_xdata()[0] for ln in lines) == [timeaxis.date_num(m.start) for m in marks]
    assert sorted(t.get_text() for t in ax.texts) == ["sglang short-c4#1", "vllm short-c4#1"]  # two engines: named
    plt.close(fig)
