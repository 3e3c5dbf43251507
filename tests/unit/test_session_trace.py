"""Traces with sessions (issue 31, item 4): ``evidence trace`` writes a session's turns as AIPerf's multi-turn
Mooncake lines (``session_id`` on every turn; a later turn ``delay`` in ms and no ``timestamp``, its
``input_length`` what it added to the history), and ``load --trace`` replays them as sessions."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from exporter.evidence.cli import main as evidence_main
from exporter.harness.load import Driver, Plan, Stage
from exporter.harness.plan import cell_from_options
from exporter.harness.replay import read_trace, sessions_of
from exporter.harness.sim import build_params, create_sim_app


def _rec(t: float, sid: str | None, n_in: int, n_out: int, e2e: float, hashes: list[str]) -> dict[str, Any]:
    return {"id": f"r{t}", "run_id": "run1", "engine": "vllm", "scenario": "chat", "start_unix": 1000.0 + t,
            "e2e_s": e2e, "outcome": "success", "prompt_tokens": n_in, "completion_tokens": n_out,
            "prefix_hashes": hashes, "prefix_tokens": n_in, "trace_block_size": 4, "session_id": sid,
            "turn": None}


def test_evidence_trace_writes_sessions_as_aiperf_multi_turn_lines(tmp_path: Path) -> None:
    records = [
        _rec(0.0, "agent-a", 10, 5, 0.5, ["a", "b", "c"]),
        _rec(0.2, "agent-b", 9, 4, 0.3, ["a", "b", "d"]),
        _rec(0.3, None, 6, 2, 0.1, ["e", "f"]),  # no session: a line as ever
        _rec(1.25, "agent-a", 22, 3, 0.4, ["a", "b", "c", "g", "h", "i"]),  # 10 + 5 before: added 7, 750 ms after
        _rec(2.0, "agent-b", 14, 4, 0.2, ["a", "b", "d", "j"]),  # 9 + 4 before: added 1
        _rec(3.0, "agent-a", 30, 2, 0.1, ["a"] * 8),  # 22 + 3 before: added 5, 1350 ms after
    ]
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "trace.jsonl"
    assert evidence_main(["trace", "--records", str(tmp_path / "rec"), "--out", str(out)]) == 0
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert got[:3] == [
        {"session_id": "session-0", "timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0, 1, 2]},
        {"session_id": "session-1", "timestamp": 200, "input_length": 9, "output_length": 4, "hash_ids": [0, 1, 3]},
        {"timestamp": 300, "input_length": 6, "output_length": 2, "hash_ids": [4, 5]},
    ]
    later = got[3:]
    assert [(g["session_id"], g["delay"], g["input_length"], g["output_length"]) for g in later] == [
        ("session-0", 750, 7, 3), ("session-1", 1500, 1, 4), ("session-0", 1350, 5, 2)]
    assert all("timestamp" not in g for g in later)  # AIPerf would send a timestamped turn at that time
    for g in got:  # what AIPerf's loader checks: the last block holds 1..block_size tokens
        assert 0 < g["input_length"] - (len(g["hash_ids"]) - 1) * 4 <= 4
    assert len({h for g in later for h in g["hash_ids"]}) == sum(len(g["hash_ids"]) for g in later)
    note = (tmp_path / "trace.jsonl.md").read_text()
    assert "Sessions: 2" in note and "delay" in note
    flat = tmp_path / "flat.jsonl"
    assert evidence_main(["trace", "--records", str(tmp_path / "rec"), "--out", str(flat), "--no-sessions"]) == 0
    assert all(list(json.loads(x)) == ["timestamp", "input_length", "output_length", "hash_ids"]
               for x in flat.read_text().splitlines())
    back = read_trace(out)  # and the driver reads it back as sessions
    assert [[(t.input_length, t.delay_s) for t in s] for s in sessions_of(back)] == [
        [(10, None), (7, 0.75), (5, 1.35)], [(9, None), (1, 1.5)], [(6, None)]]


async def test_replay_sends_sessions_turn_by_turn(aiohttp_server: Any, tmp_path: Path) -> None:
    """Each session's turns in order, each after the previous answer plus the delay (over the speedup),
    with one X-Session-ID per session, the history growing with the engine's answers."""
    seen: list[tuple[float, str | None, dict[str, Any]]] = []
    sim_app = create_sim_app(build_params("vllm", speed=200.0))

    @web.middleware
    async def keep(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method != "POST":
            return await handler(request)
        sid = request.headers.get("X-Session-ID")
        seen.append((time.monotonic(), sid, await request.json()))
        return await handler(request)

    sim_app.middlewares.append(keep)
    sim = await aiohttp_server(sim_app)
    trace = tmp_path / "t.jsonl"
    rows = [{"session_id": "A", "timestamp": 0, "input_length": 12, "output_length": 3, "hash_ids": [0, 1]},
            {"session_id": "B", "timestamp": 100, "input_length": 9, "output_length": 2, "hash_ids": [0, 2]},
            {"session_id": "A", "delay": 400, "input_length": 5, "output_length": 4, "hash_ids": [3]},
            {"session_id": "B", "delay": 200, "input_length": 6, "output_length": 2, "hash_ids": [4]},
            {"session_id": "A", "delay": 200, "input_length": 7, "output_length": 2, "hash_ids": [5]}]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cell = cell_from_options(scenario="replay", input_tokens=None, output_tokens=None, requests=None,
                             trace=str(trace), speedup=2.0, block_size=8)
    async with Driver(f"http://127.0.0.1:{sim.port}", tmp_path / "load") as driver:
        driver.direct()
        await driver.run_plan(Plan([Stage("s", [cell])]))
    recs = [json.loads(x) for x in (tmp_path / "load" / "requests.jsonl").read_text().splitlines()]
    assert len(recs) == 5 and all(r["outcome"] == "success" for r in recs)
    ids = {sid for _, sid, _ in seen}
    assert len(ids) == 2 and None not in ids
    by: dict[str | None, list[tuple[float, dict[str, Any]]]] = {}
    for at, sid, body in seen:
        by.setdefault(sid, []).append((at, body))
    a, b = sorted(by.values(), key=len, reverse=True)
    for turns, want in ((a, [(12, 3), (5, 4), (7, 2)]), (b, [(9, 2), (6, 2)])):
        msgs = [body["messages"] for _, body in turns]
        assert [len(m) for m in msgs] == [1, 3, 5][:len(turns)]  # the history grows: user, answer, user, ...
        assert [(len(m[-1]["content"].split()), body["max_tokens"]) for m, (_, body) in zip(msgs, turns)] == want
        assert all(m[i]["role"] == "assistant" and m[i]["content"] for m in msgs[1:] for i in range(1, len(m), 2))
        assert msgs[-1][:len(msgs[-2])] == msgs[-2]  # each turn resends the one before
        assert all(turns[k + 1][0] > turns[k][0] for k in range(len(turns) - 1))  # in order
    gaps = [a[1][0] - a[0][0], a[2][0] - a[1][0]]
    assert gaps[0] >= 0.2 and gaps[1] >= 0.1  # at least the delay over the speedup after the turn before
    per: dict[str, list[int]] = {}
    for r in recs:
        per.setdefault(r["session_id"], []).append(r["turn"])
    assert sorted(per.values(), key=len) == [[1, 2], [1, 2, 3]]
