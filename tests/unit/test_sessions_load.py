"""Sessions in the load driver and the simulated engines: multi-turn chat whose history grows with
the real answers, tool calls answered with tool messages, the simulators' prefix cache, and the
proxy numbering the turns, all in process."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from exporter.core.analysis import RequestSpec, StreamAnalyzer
from exporter.harness.load import Driver
from exporter.harness.plan import Cell, Plan, PlanError, Stage, cell_from_options, load_plan
from exporter.harness.sessions import TOOL, Answer
from exporter.harness.sim import build_params, create_sim_app
from exporter.harness.sim_cache import PrefixCache, tool_call_wanted

from tests.helpers import read_records


def _seen_bodies(app: web.Application) -> list[dict[str, Any]]:
    """Every request body the app is sent, in order (a middleware added before it starts)."""
    seen: list[dict[str, Any]] = []

    @web.middleware
    async def keep(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "POST":
            seen.append(json.loads(await request.read()))
        return await handler(request)

    app.middlewares.append(keep)
    return seen


def _session_cell(**kw: Any) -> Cell:
    return cell_from_options(scenario="short-c1", input_tokens=kw.pop("input_tokens", 20),
                             output_tokens=kw.pop("output_tokens", 6), **kw)


def test_prefix_cache_shares_whole_blocks_of_a_common_prefix() -> None:
    cache = PrefixCache(block=4, capacity=100)
    words = [f"w{i}" for i in range(10)]
    assert cache.serve(words) == 0  # cold
    assert cache.serve(words) == 8  # two whole blocks; the last token is always computed
    longer = words + ["x"] * 6
    assert cache.serve(longer) == 8  # the common prefix's whole blocks ...
    assert cache.serve(longer) == 12  # ... then its own: 16 words, the last one computed
    assert cache.serve(["other"] + words) == 0  # a different first block shares nothing
    assert PrefixCache(block=0, capacity=1).serve(words) == 0
    small = PrefixCache(block=2, capacity=3)
    small.serve([f"a{i}" for i in range(9)])
    assert small.serve([f"a{i}" for i in range(9)]) == 0  # its first blocks were forgotten


def test_tool_call_on_the_first_user_turn_offering_tools() -> None:
    rng = random.Random(0)
    user = {"role": "user", "content": "hi"}
    assert tool_call_wanted({"messages": [user], "tools": [TOOL]}, rng, 0.0) == "lookup"
    assert tool_call_wanted({"messages": [user]}, rng, 1.0) is None
    assert tool_call_wanted({"messages": [user], "tools": [TOOL], "tool_choice": "none"}, rng, 1.0) is None
    later = [user, {"role": "assistant", "content": None}, {"role": "tool", "content": "x"}, user]
    assert tool_call_wanted({"messages": later, "tools": [TOOL]}, rng, 0.0) is None
    assert tool_call_wanted({"messages": later, "tools": [TOOL]}, rng, 1.0) == "lookup"
    assert tool_call_wanted({"messages": later[:3], "tools": [TOOL]}, rng, 1.0) is None  # after a tool message


def test_session_cells_from_options_and_plans(tmp_path: Path) -> None:
    cell = _session_cell(sessions=3, turns=4, think_time_s=0.5, tools=True)
    assert (cell.requests, cell.concurrency, cell.chat, cell.turns, cell.tools) == (12, 3, True, 4, True)
    for bad, why in [({"turns": 2, "requests": 2, "concurrency": 1}, "need sessions"),
                     ({"tools": True, "requests": 2, "concurrency": 1}, "need sessions"),
                     ({"sessions": 2, "rate": 1.0}, "session cell"),
                     ({"sessions": 2, "turns": 2, "requests": 5}, "sessions × turns = 4")]:
        with pytest.raises(PlanError, match=why):
            _session_cell(**bad)
    plan = tmp_path / "p.yaml"
    plan.write_text("defaults: {input_tokens: 8, output_tokens: 4}\nstages:\n  - cells:\n"
                    "      - {scenario: chat, sessions: 2, turns: 3, think_time_s: 1}\n"
                    "      - {scenario: plain, requests: 2, concurrency: 1}\n")
    chat, plain = load_plan(plan).stages[0].cells
    assert (chat.sessions, chat.turns, chat.requests, chat.concurrency, chat.chat) == (2, 3, 6, 2, True)
    assert plain.sessions is None and plain.turns == 1


@pytest.mark.parametrize("chunks", [1, 5, 1000])
def test_answer_gathers_text_and_tool_calls_however_split(chunks: int) -> None:
    from tests.transcripts import sse
    body = sse('{"choices":[{"delta":{"role":"assistant","content":""}}]}',
               '{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function",'
               '"function":{"name":"lookup","arguments":"{\\"q"}}]}}]}',
               '{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\\": 1}"}}]}}]}',
               '{"choices":[{"delta":{"content":"ok"}}]}', "[DONE]")
    answer = Answer()
    for i in range(0, len(body), chunks):
        answer.feed(body[i:i + chunks])
    assistant, tool = answer.messages(lambda: "result words")
    assert assistant == {"role": "assistant", "content": "ok", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": 1}'}}]}
    assert tool == {"role": "tool", "tool_call_id": "c1", "content": "result words"}


@pytest.mark.parametrize("profile", ["vllm", "sglang"])
async def test_sim_answers_a_tool_call_the_core_judges_a_success(aiohttp_client: Any, profile: str) -> None:
    client = await aiohttp_client(create_sim_app(build_params(profile, speed=50.0)))
    for stream in (True, False):
        body = {"model": "m", "messages": [{"role": "user", "content": "a b c"}], "tools": [TOOL],
                "max_tokens": 5, "ignore_eos": True, "stream": stream, "stream_options": {"include_usage": True}}
        resp = await client.post("/v1/chat/completions", json=body)
        raw = await resp.read()
        an = StreamAnalyzer(0.0, resp.status, RequestSpec.from_body(json.dumps(body).encode()), streaming=stream)
        an.feed(raw, 0.1)
        result = an.finish(0.2)
        assert result.ok and result.completion_tokens == 5, (result.reason, result.detail)
        assert b'"tool_calls"' in raw and b'"name":"lookup"' in raw.replace(b": ", b":")
        if stream:
            answer = Answer()
            answer.feed(raw)
            (call,) = answer.messages(lambda: "")[0]["tool_calls"]
            assert json.loads(call["function"]["arguments"]) == {"query": "tok0 tok1 tok2 tok3 tok4"}
        else:
            (call,) = json.loads(raw)["choices"][0]["message"]["tool_calls"]
            assert json.loads(call["function"]["arguments"]) == {"query": "tok0 tok1 tok2 tok3 tok4"}


@pytest.mark.parametrize("profile", ["vllm", "sglang"])
async def test_sessions_through_the_proxy_on_the_simulators(aiohttp_server: Any, proxy_factory: Any,
                                                           tmp_path: Path, profile: str) -> None:
    app = create_sim_app(build_params(profile, speed=50.0))
    bodies = _seen_bodies(app)
    sim = await aiohttp_server(app)
    proxy = await proxy_factory(sim.port)
    cell = _session_cell(sessions=3, turns=3, tools=True, think_time_s=0.01, input_tokens=40, output_tokens=6)
    async with Driver(str(proxy.make_url("/vllm")), tmp_path / "load", seed=3) as driver:
        summary = await driver.run_plan(Plan([Stage("s", [cell])]))
    assert summary["cells"][0]["median"]["success"] == 9
    mine = [json.loads(line) for line in (tmp_path / "load" / "requests.jsonl").read_text().splitlines()]
    proxied = {r["client_request_id"]: r for r in read_records(tmp_path)}
    by_session: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in sorted(mine, key=lambda r: r["start_unix"]):
        prox = proxied[rec["id"]]
        assert prox["outcome"] == "success" and prox["session_id"] == rec["session_id"]
        assert prox["turn"] == rec["turn"]  # the proxy counts what the driver sent
        by_session[rec["session_id"]].append({**prox, "tool_calls": rec["tool_calls"]})
    assert len(by_session) == 3
    for turns in by_session.values():
        assert [t["turn"] for t in turns] == [1, 2, 3]
        assert [t["tool_calls"] for t in turns] == [1, 0, 0]  # the first tool turn calls the tool
        assert turns[0]["cached_tokens"] == 0 and all(t["cached_tokens"] > 0 for t in turns[1:])
        prompts = [t["prompt_tokens"] for t in turns]
        # turn 2 carries turn 1 (40 words), the tool message (6 words) and 40 new words; turn 3 adds
        # turn 2's answer (6 words) and 40 more
        assert prompts == [40, 86, 132]
    second = [b for b in bodies if len(b["messages"]) == 4]
    assert len(second) == 3
    for body in second:
        user, call, tool, _ = body["messages"]
        assert call["role"] == "assistant" and call["tool_calls"][0]["function"]["name"] == "lookup"
        assert tool == {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "content": tool["content"]}
        assert len(tool["content"].split()) == 6 and body["tools"] == [TOOL]


async def test_a_failed_turn_leaves_the_history_and_the_session_goes_on(aiohttp_server: Any,
                                                                         tmp_path: Path) -> None:
    app = create_sim_app(build_params("vllm", speed=50.0, fault_http_500=0.5, seed=4))
    bodies = _seen_bodies(app)
    sim = await aiohttp_server(app)
    cell = _session_cell(sessions=2, turns=4)
    async with Driver(f"http://127.0.0.1:{sim.port}", tmp_path / "load", model="m") as driver:
        records, _ = await driver.run_round(cell, "short-c1", 1, cell.requests)
    assert len(records) == 8 and {r["outcome"] for r in records} == {"success", "failure"}
    for sid in {r["session_id"] for r in records}:
        mine = sorted((r for r in records if r["session_id"] == sid), key=lambda r: r["turn"])
        assert [r["turn"] for r in mine] == [1, 2, 3, 4]
    # every request's history holds only answered turns: user, assistant pairs, then the new user text
    for body in bodies:
        roles = [m["role"] for m in body["messages"]]
        assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"]


def _load_args(*argv: str) -> Any:
    from exporter.cli import build_parser

    return build_parser(["load"]).parse_args(["load", "--base-url", "http://127.0.0.1:1/vllm", *argv])


def test_load_options_make_a_session_cell() -> None:
    from exporter.harness.load_cli import _plan_from_args

    plan = _plan_from_args(_load_args("--sessions", "3", "--turns", "4", "--think-time", "0.5", "--tools",
                                      "--input-tokens", "64", "--output-tokens", "8"))
    (cell,) = plan.stages[0].cells
    assert (cell.sessions, cell.turns, cell.think_time_s, cell.tools, cell.requests, cell.concurrency, cell.chat) == (
        3, 4, 0.5, True, 12, 3, True)
    with pytest.raises(PlanError, match="--sessions N --turns T.*missing: --output-tokens"):
        _plan_from_args(_load_args("--sessions", "3", "--input-tokens", "64"))
    with pytest.raises(PlanError, match="need sessions"):
        _plan_from_args(_load_args("--turns", "3", "--concurrency", "1", "--requests", "3", "--input-tokens", "4",
                                   "--output-tokens", "2"))


def test_the_demo_runs_one_short_session_cell() -> None:
    root = Path(__file__).resolve().parents[2]
    cells = [c for st in load_plan(root / "examples" / "plans" / "demo.yaml").stages for c in st.cells]
    (chat,) = [c for c in cells if c.sessions is not None]
    assert chat.requests <= 16 and chat.rounds == 1 and chat.tools and chat.turns >= 2
    for config in (root / "examples" / "stack.yaml", root / "compose" / "exporter.yaml"):
        assert chat.scenario in config.read_text(), config  # the proxies that run the demo's plan list it


def test_the_boards_draw_the_cached_share_per_engine() -> None:
    from dashboards.catalogue import PANELS

    panel = PANELS["cached_share"]
    (query,) = panel.queries
    assert panel.unit == "percentunit" and "llmbench_prompt_tokens_cached_total" in query.expr
    assert "sum by (engine)" in query.expr and "llmbench_prompt_tokens_total" in query.expr
    board = json.loads((Path(__file__).resolve().parents[2] / "dashboards/generated/comparison.json").read_text())
    assert any("llmbench_prompt_tokens_cached_total" in t.get("expr", "")
               for p in board["panels"] for t in p.get("targets", []))
