"""Sessions against a real vLLM (the CPU build, the tiny random-weight llama built here) with its
prefix cache and prompt-token details on: a 3-session, 4-turn run of the load driver through the
real proxy.  Cached tokens appear on the later turns, in the records, the per-turn summary and the
counter, and the proxy numbers the turns right.

The tiny model rarely calls a tool, so the runs here are plain turns; the tool turns are tested
end to end on the simulated engines (tests/unit/test_sessions_load.py).  Needs
``.ci/install-vllm.sh`` (skipped without it, failed without it when LLMBENCH_REQUIRE_VLLM=1).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import requests

from exporter.evidence.summarize import summarize
from exporter.harness.load import Driver
from exporter.harness.plan import Plan, Stage, cell_from_options

from tests.helpers import metric_value, read_records
from tests.vllm_engine import VllmServer, build_model, require_vllm, start_proxy

SCENARIO = "chat-s3"
SESSIONS, TURNS = 3, 4
#: words of new user text per turn: more tokens than one of vLLM's CPU KV blocks (128), so the second
#: turn already finds the first one's whole blocks cached; 4 turns stay well inside MAX_MODEL_LEN
INPUT_WORDS, OUTPUT_TOKENS = 140, 8


def _records(out: Path, n: int, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        recs = [r for r in read_records(out) if r["scenario"] == SCENARIO]
        if len(recs) >= n or time.monotonic() > deadline:
            return recs
        time.sleep(0.1)


def test_sessions_on_real_vllm_cache_later_turns(tmp_path: Path) -> None:
    require_vllm()
    with contextlib.ExitStack() as stack:
        server = VllmServer(build_model(tmp_path / "model"), tmp_path / "logs",
                            extra=["--enable-prefix-caching", "--enable-prompt-tokens-details"])
        stack.callback(server.stop)
        server.start()
        proxy, proxy_url = start_proxy(tmp_path, [{"name": "vllm", "upstream": server.url}], scenarios=[SCENARIO])
        stack.callback(proxy.stop)
        cell = cell_from_options(scenario=SCENARIO, input_tokens=INPUT_WORDS, output_tokens=OUTPUT_TOKENS,
                                 sessions=SESSIONS, turns=TURNS, think_time_s=0.1)

        async def drive() -> dict[str, Any]:
            async with Driver(f"{proxy_url}/vllm", tmp_path / "load", seed=5, timeout_s=300) as driver:
                await driver.check_scenarios([SCENARIO])
                return await driver.run_plan(Plan([Stage("sessions", [cell])]))

        summary = asyncio.run(drive())
        assert summary["cells"][0]["median"]["success"] == SESSIONS * TURNS, summary["first_error"]
        recs = _records(tmp_path, SESSIONS * TURNS)
        metrics = requests.get(f"{proxy_url}/metrics", timeout=10).text
    assert len(recs) == SESSIONS * TURNS and all(r["outcome"] == "success" for r in recs), recs
    by_session: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in sorted(recs, key=lambda r: r["start_unix"]):
        by_session[r["session_id"]].append(r)
    assert len(by_session) == SESSIONS
    for turns in by_session.values():
        assert [r["turn"] for r in turns] == list(range(1, TURNS + 1))  # numbered by the proxy, in order
        prompts = [r["prompt_tokens"] for r in turns]
        assert prompts == sorted(prompts) and len(set(prompts)) == TURNS, prompts  # the history grows
        assert all(isinstance(r["cached_tokens"], int) and 0 <= r["cached_tokens"] < r["prompt_tokens"]
                   for r in turns), turns
        # each later turn finds at least the whole blocks of the turn before it cached
        assert all(r["cached_tokens"] > 0 for r in turns[1:]), [r["cached_tokens"] for r in turns]
        assert all(b["cached_tokens"] >= a["cached_tokens"] for a, b in zip(turns[1:], turns[2:]))
    table = summarize(recs)["turns"]
    assert [t["turn"] for t in table] == list(range(1, TURNS + 1))
    assert all(t["success_ratio"] == 1.0 and t["cached_share"] > 0 for t in table[1:]), table
    cached = sum(r["cached_tokens"] for r in recs)
    assert metric_value(metrics, "llmbench_prompt_tokens_cached_total", engine="vllm", scenario=SCENARIO) == cached
