"""Fidelity, proved in process: traffic captured by the proxy (config ``trace``) in front of a simulated engine
that counts with the model's tokenizer (``sim --tokenizer``), exported (``evidence trace``), replayed
(``load --trace --tokenizer``) through a second proxy and captured again gives the trace it replayed: the
same lengths, the same hash ids (both numbered in first-seen order), arrivals within the schedule lag.
Without the engine's tokenizer the driver sends one word per token, and the BOS (the chat template) the
engine adds makes every replayed prompt longer than its line."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest

from exporter.evidence.mooncake import mooncake_lines, write_trace
from exporter.harness.cliutil import UserError
from exporter.harness.load import Driver, Plan, Stage, make_prompt
from exporter.harness.load_cli import _check_framing
from exporter.harness.plan import cell_from_options
from exporter.harness.replay import Framing, Prompts, TraceLine, framing
from exporter.harness.sim import build_params, create_sim_app
from exporter.proxy.app import create_app
from exporter.proxy.prompttokens import PromptTokenizer, TokenizerError

from tests.helpers import make_config, wait_for_records
from tests.tiny_tokenizer import build_tokenizer

BLOCK = 16


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


async def _proxy(aiohttp_client: Any, root: Path, port: int, tokenizer: Path) -> Any:
    return await aiohttp_client(create_app(make_config(
        root, port, scenarios=["replay", "live"], trace={"tokenizer": str(tokenizer), "block_size": BLOCK})))


def _traffic() -> list[tuple[float, bool, str, int]]:
    """A morning's traffic, scaled down: (offset s, chat, prompt, max_tokens).  A shared system prompt
    of 40 words behind most requests, one prompt sent twice, lengths across block boundaries."""
    rng = random.Random(7)
    system = make_prompt(rng, 40)
    own = [make_prompt(rng, k) for k in (5, 31, 16, 60, 2, 23)]
    return [(0.00, False, f"{system} {own[0]}", 4), (0.07, False, f"{system} {own[1]}", 6),
            (0.15, True, f"{system} {own[2]}", 3), (0.22, False, own[3], 5),
            (0.30, False, f"{system} {own[0]}", 4),  # the first prompt again: all its blocks shared
            (0.36, True, own[4], 2), (0.45, False, f"{system} {own[5]}", 7)]


async def _send_live(client: Any) -> None:
    async def one(at: float, chat: bool, prompt: str, max_tokens: int) -> None:
        await asyncio.sleep(at)
        body: dict[str, Any] = {"max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                                "stream_options": {"include_usage": True}}
        body.update({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
        path = "/vllm/v1/chat/completions" if chat else "/vllm/v1/completions"
        resp = await client.post(path, json=body, headers={"X-Bench-Scenario": "live"})
        await resp.read()

    await asyncio.gather(*(one(*t) for t in _traffic()))


async def _replay(proxy: Any, trace: Path, out: Path, tokenizer: PromptTokenizer | None, chat: bool) -> list[dict[str, Any]]:
    cell = cell_from_options(scenario="replay", input_tokens=None, output_tokens=None, requests=None,
                             trace=str(trace), block_size=BLOCK, chat=chat)
    async with Driver(str(proxy.make_url("/vllm")), out, seed=5, tokenizer=tokenizer) as driver:
        summary = await driver.run_plan(Plan([Stage("s", [cell])]))
    assert summary["cells"][0]["median"]["success"] == len(_traffic())
    return [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]


def _export(root: Path, n: int, records: list[dict[str, Any]], out: Path) -> list[dict[str, Any]]:
    lines, facts = mooncake_lines(records)
    assert len(lines) == n and facts["untraced"] == 0 and facts["unhashed_blocks"] == 0, facts
    write_trace(out, lines, facts, str(root))
    return lines


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_a_replay_captured_again_is_the_trace_it_replayed(aiohttp_server: Any, aiohttp_client: Any,
                                                               tokenizer_dir: Path, tmp_path: Path, chat: bool) -> None:
    tok = PromptTokenizer(tokenizer_dir)
    sim = await aiohttp_server(create_sim_app(build_params("vllm", speed=50.0), tok))
    n = len(_traffic())
    live = await _proxy(aiohttp_client, tmp_path / "live", sim.port, tokenizer_dir)
    await _send_live(live)
    first = _export(tmp_path, n, await wait_for_records(tmp_path / "live", n), tmp_path / "live.jsonl")
    ids = [line["hash_ids"] for line in first]
    assert ids[4] == ids[0] and ids[1][:2] == ids[0][:2] and ids[1][2] != ids[0][2]  # the shape is worth keeping
    assert not set(ids[3]) & set(ids[0])

    again = await _proxy(aiohttp_client, tmp_path / "again", sim.port, tokenizer_dir)
    sent = await _replay(again, tmp_path / "live.jsonl", tmp_path / "load", tok, chat)
    second = _export(tmp_path, n, await wait_for_records(tmp_path / "again", n), tmp_path / "again.jsonl")
    assert [(x["input_length"], x["output_length"]) for x in second] == \
        [(x["input_length"], x["output_length"]) for x in first]
    assert [x["hash_ids"] for x in second] == ids  # the same prefix sharing, block for block
    lag = {round(r["intended_start_unix"] - sent[0]["intended_start_unix"], 3): r["schedule_lag_s"] for r in sent}
    for a, b in zip(first, second):
        late = lag[a["timestamp"] / 1000]
        assert abs(b["timestamp"] - a["timestamp"]) <= (late + sent[0]["schedule_lag_s"]) * 1000 + 30, (a, b, lag)

    # without the engine's tokenizer: one word per token, and the BOS or the chat template comes on top
    plain = await _proxy(aiohttp_client, tmp_path / "plain", sim.port, tokenizer_dir)
    await _replay(plain, tmp_path / "live.jsonl", tmp_path / "load-plain", None, chat)
    third, _ = mooncake_lines(await wait_for_records(tmp_path / "plain", n))
    assert [x["input_length"] - y["input_length"] for x, y in zip(third, first)] == [4 if chat else 1] * n


def test_framing_measures_what_the_engine_adds(tokenizer_dir: Path) -> None:
    tok = PromptTokenizer(tokenizer_dir)
    words = "time person year way day thing man world life hand part child eye".split()
    plain, chat = framing(tok, False, 8, words), framing(tok, True, 8, words)
    assert (plain.lead, plain.trail) == (1, 0)  # <s>
    assert (chat.lead, chat.trail) == (2, 2)  # <s> <|user|> ... </s> <|assistant|>
    line = TraceLine(0.0, 21, 1, (3, 4, 5))
    for frame, is_chat in ((plain, False), (chat, True)):
        text = Prompts(8, "s", make_prompt, frame).text(line, 0)
        body = {"messages": [{"role": "user", "content": text}]} if is_chat else {"prompt": text}
        assert len(tok.prompt_ids(body, is_chat) or []) == 21
    # without a framing the words are the tokens, block for block, as before
    assert len(Prompts(8, "s", make_prompt, Framing()).text(line, 0).split()) == 21
    # a block of id 3 is the same words at the same token positions behind the BOS
    a = Prompts(8, "s", make_prompt, plain).text(TraceLine(0.0, 8, 1, (3,)), 0).split()
    b = Prompts(8, "s", make_prompt, plain).text(TraceLine(0.0, 12, 1, (3, 9)), 1).split()
    assert len(a) == 7 and b[:7] == a
    with pytest.raises(TokenizerError, match="one token"):
        framing(tok, False, 8, ["zyzzyva-quux", "qwertyuiopasdf"])


def test_load_refuses_a_tokenizer_that_cannot_frame_the_replay(tmp_path: Path, tokenizer_dir: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 9, "output_length": 2, "hash_ids": [0]}\n')
    no_template = tmp_path / "tok"
    no_template.mkdir()
    (no_template / "tokenizer.json").write_bytes((tokenizer_dir / "tokenizer.json").read_bytes())
    cell = cell_from_options(scenario="x", input_tokens=None, output_tokens=None, requests=None, trace=str(trace),
                             chat=True, block_size=4)
    driver = Driver("http://127.0.0.1:9/vllm", tokenizer=PromptTokenizer(no_template))
    with pytest.raises(UserError, match="no chat template"):
        _check_framing(driver, Plan([Stage("s", [cell])]), str(no_template))
