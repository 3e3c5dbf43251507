"""Per-turn truth: ``evidence summarize`` per turn and per session, from the proxy's records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from exporter.evidence.summarize import summarize, write_summary
from exporter.evidence.summary_md import headline_markdown
from exporter.evidence.turns import session_cells, session_table, turn_table
from exporter.harness.load import Driver
from exporter.harness.plan import Plan, Stage, cell_from_options
from exporter.harness.sim import build_params, create_sim_app

from tests.helpers import read_records

SLO = {"ttft_s": 3.0, "tpot_s": 0.05}


def _rec(session: str | None, start: float, e2e: float, ttft: float, prompt: int, cached: int | None,
         outcome: str = "success", turn: int | None = None, scenario: str = "chat", engine: str = "vllm") -> dict[str, Any]:
    return {"id": f"{session}-{start}", "run_id": "r1", "engine": engine, "scenario": scenario, "round": 1,
            "session_id": session, "turn": turn, "start_unix": start, "e2e_s": e2e, "ttft_s": ttft,
            "tpot_s": 0.01, "outcome": outcome, "reason": None if outcome == "success" else "http_status",
            "prompt_tokens": prompt, "completion_tokens": 4, "cached_tokens": cached, "slo": SLO}


RECORDS = [
    # session a: three turns, 1 s on the engine each, 2 s between them
    _rec("a", 100.0, 1.0, 0.5, 100, 0, turn=1), _rec("a", 103.0, 1.0, 0.2, 200, 96, turn=2),
    _rec("a", 106.0, 1.0, 0.3, 300, 192, turn=1),  # a second worker counted it as its first
    # session b: its second turn failed
    _rec("b", 100.5, 2.0, 0.7, 100, 0), _rec("b", 103.0, 0.1, 0.0, 200, None, outcome="failure"),
    _rec("b", 104.0, 1.0, 0.4, 300, 160),
    _rec(None, 100.0, 1.0, 0.1, 10, None),  # no session: not in these tables
    _rec("w", 90.0, 1.0, 0.1, 10, 0, scenario="warmup"),  # warm-ups left out
]


def test_turns_are_numbered_in_arrival_order_with_their_figures() -> None:
    rows = turn_table(RECORDS)
    assert [(r["turn"], r["requests"], r["success"]) for r in rows] == [(1, 2, 2), (2, 2, 1), (3, 2, 2)]
    one, two, three = rows
    assert one["ttft_p50_s"] == pytest.approx(0.6) and one["ttft_p95_s"] == pytest.approx(0.69)
    assert one["cached_share"] == 0 and one["prompt_tokens_mean"] == 100
    assert two["success_ratio"] == 0.5 and two["ttft_p50_s"] == 0.2  # the failure's TTFT is not a success's
    assert two["cached_share"] == pytest.approx(96 / 200)  # only where the engine said
    assert three["cached_share"] == pytest.approx((192 + 160) / 600)


def test_sessions_total_engine_and_between_turns() -> None:
    rows = {r["session_id"]: r for r in session_table(RECORDS)}
    assert set(rows) == {"a", "b"}
    a, b = rows["a"], rows["b"]
    assert (a["turns"], a["success"], a["total_s"], a["engine_s"], a["between_turns_s"]) == (3, 3, 7.0, 3.0, 4.0)
    assert a["between_turns_max_s"] == 2.0
    assert b["total_s"] == pytest.approx(4.5) and b["engine_s"] == pytest.approx(3.1)
    assert b["between_turns_s"] == pytest.approx(1.4)  # 102.5 -> 103.0, 103.1 -> 104.0
    (cell,) = session_cells(list(rows.values()))
    assert (cell["sessions"], cell["turns"], cell["sessions_all_ok"]) == (2, 6, 1)
    assert cell["total_p50_s"] == pytest.approx(5.75) and cell["engine_p95_s"] == pytest.approx(3.095)


def test_summary_shows_the_per_turn_table(tmp_path: Path) -> None:
    summary = summarize(RECORDS)
    assert [r["turn"] for r in summary["turns"]] == [1, 2, 3] and len(summary["sessions"]) == 2
    paths = write_summary(summary, tmp_path / "s")
    assert {"turns.csv", "sessions.csv", "session_cells.csv"} <= {p.name for p in paths}
    md = (tmp_path / "s" / "summary.md").read_text()
    assert "## Per turn" in md and "## Per session" in md and "cached %" in md and "between turns P95 ms" in md
    assert "| vllm | chat | 2 | 1 | 2 | 50.0 | 200 | 200 | 200 | 48.0 |" in md, md
    assert "## Per turn" in headline_markdown(summary)
    plain = summarize([r for r in RECORDS if r["session_id"] is None])
    assert "turns" not in plain and "## Per turn" not in headline_markdown(plain)


async def test_summarize_a_session_run_through_the_proxy(aiohttp_server: Any, proxy_factory: Any,
                                                         tmp_path: Path) -> None:
    sim = await aiohttp_server(create_sim_app(build_params("sglang", speed=50.0)))
    proxy = await proxy_factory(sim.port)
    cell = cell_from_options(scenario="short-c1", input_tokens=48, output_tokens=4, sessions=2, turns=3)
    async with Driver(str(proxy.make_url("/sglang")), None, seed=1) as driver:
        await driver.run_plan(Plan([Stage("s", [cell])]))
    summary = summarize(read_records(tmp_path))
    turns = summary["turns"]
    assert [(t["engine"], t["scenario"], t["turn"], t["requests"], t["success_ratio"]) for t in turns] == [
        ("sglang", "short-c1", n, 2, 1.0) for n in (1, 2, 3)]
    assert turns[0]["cached_share"] == 0 and turns[1]["cached_share"] > 0.4 and turns[2]["cached_share"] > 0.6
    assert [t["prompt_tokens_mean"] for t in turns] == [48, 100, 152]
    (cells,) = summary["session_cells"]
    assert cells["sessions"] == 2 and cells["sessions_all_ok"] == 2 and cells["engine_p50_s"] > 0
    assert json.dumps(summary)  # every figure serializes
