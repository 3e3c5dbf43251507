"""``load``'s prompts as long as asked, in the engine's tokens: with ``--tokenizer`` a plan cell's prompt is
exactly ``input_tokens`` tokens as the engine counts them (its BOS, its chat template); without it the prompts
are words, and a model whose tokenizer cuts words into several tokens is told apart: the engine's count
(``usage.prompt_tokens``, median) in the table and in summary.json beside the asked length, and a
``warning:`` line per cell that is more than 10 % off.  The simulated engine counts with the tokenizer it is
given (``sim --tokenizer``), in process (a server on a thread of its own for the command line)."""

from __future__ import annotations

import asyncio
import csv
import json
import statistics
import string
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from exporter.cli import main
from exporter.harness.load import Driver, load_plan
from exporter.harness.load_cli import _report
from exporter.harness.replay import PLAIN_BLOCK
from exporter.harness.sim import build_params, create_sim_app
from exporter.harness.tables import prompt_warnings, round_table
from exporter.proxy.prompttokens import PromptTokenizer

from tests.tiny_tokenizer import build_tokenizer

PLAN = """\
defaults: {output_tokens: 3, rounds: 2}
stages:
  - name: core
    cells:
      - {scenario: plain, input_tokens: 24, concurrency: 2, requests: 3, warmup: 1}
      - {scenario: chat, input_tokens: 30, concurrency: 2, requests: 3, chat: true}
  - name: agents
    cells:
      - {scenario: talk, input_tokens: 12, sessions: 2, turns: 2, rounds: 1}
"""


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every word of the driver's prompts one token; a BOS before a plain prompt; a chat template."""
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def letters_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tokenizer that cuts every word into its letters, as a real model's cuts the rarer words."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    out = tmp_path_factory.mktemp("letters")
    tok = Tokenizer(models.BPE({"<unk>": 0, **{c: i + 1 for i, c in enumerate(string.ascii_lowercase)}}, [],
                               unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(out / "tokenizer.json"))
    return out


def _plan(tmp_path: Path) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN, encoding="utf-8")
    return path


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]


async def test_with_the_tokenizer_a_plan_cells_prompts_are_input_tokens_as_the_engine_counts(
        aiohttp_server: Any, tokenizer_dir: Path, tmp_path: Path) -> None:
    tok = PromptTokenizer(tokenizer_dir)
    sim = await aiohttp_server(create_sim_app(build_params("vllm", speed=50.0), tok))
    async with Driver(f"http://127.0.0.1:{sim.port}", tmp_path / "out", model="m", tokenizer=tok) as driver:
        summary = await driver.run_plan(load_plan(_plan(tmp_path)))
        chat = driver.replays.framing(True, PLAIN_BLOCK)
    records = _records(tmp_path / "out")
    assert all(r["outcome"] == "success" for r in records)
    by_cell = {s: [r["prompt_tokens"] for r in records if r["scenario"] == s] for s in ("plain", "chat", "warmup")}
    assert by_cell == {"plain": [24] * 6, "chat": [30] * 6, "warmup": [24]}  # the BOS, the chat template included
    # a session's turn adds input_tokens tokens of user text; its first turn adds the chat template's around it
    assert (chat.lead, chat.trail) == (2, 2)
    assert [r["prompt_tokens"] for r in records if r["scenario"] == "talk" and r["turn"] == 1] == [12 + 4] * 2
    cells = {c["cell"]["scenario"]: c["prompt_tokens"] for c in summary["cells"]}
    assert cells["plain"] == {"asked": 24, "counted_p50": 24, "counted_min": 24, "counted_max": 24, "requests": 6,
                              "tokenizer": True}
    assert cells["chat"]["counted_p50"] == 30 and cells["talk"]["counted_p50"] == 16
    assert prompt_warnings([summary]) == []  # the session cell's template is not a mismatch
    table = round_table([summary])
    assert "in tok" in table and "prompt tok" in table
    line = next(x for x in table.splitlines() if x.split()[1:2] == ["plain"])
    assert line.split()[2:5] == ["6/6", "24", "24"]


async def test_without_the_tokenizer_a_model_that_cuts_words_is_warned_about(
        aiohttp_server: Any, letters_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sim = await aiohttp_server(create_sim_app(build_params("vllm", speed=50.0), PromptTokenizer(letters_dir)))
    plan = load_plan(_plan(tmp_path))
    async with Driver(f"http://127.0.0.1:{sim.port}", tmp_path / "out", model="m") as driver:
        summary = await driver.run_plan(plan)
    records = [r for r in _records(tmp_path / "out") if r["scenario"] == "plain"]
    counted = statistics.median(r["prompt_tokens"] for r in records)
    assert counted > 2 * 24  # letters, not words
    on_disk = json.loads((tmp_path / "out" / "summary.json").read_text())
    plain = next(c for c in on_disk["cells"] if c["cell"]["scenario"] == "plain")
    assert plain["prompt_tokens"]["asked"] == 24 and plain["prompt_tokens"]["counted_p50"] == counted
    assert plain["prompt_tokens"]["tokenizer"] is False
    with open(tmp_path / "out" / "rounds.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["scenario"] == "plain"]
    assert [float(r["prompt_tokens_p50"]) for r in rows] == [
        statistics.median(r["prompt_tokens"] for r in records if r["round"] == n) for n in (1, 2)]

    assert _report(summary, tmp_path / "out") == 0
    out, err = capsys.readouterr()
    # one line for the plain cell; the chat cells are counted as words (this tokenizer has no chat template)
    shown = f"{counted:.0f}" if float(counted).is_integer() else f"{counted:.1f}"
    assert [x for x in err.splitlines() if x.startswith("warning:")] == [
        f"warning: cell 127.0.0.1:{sim.port} plain: asked input_tokens 24, the engine counted {shown} prompt tokens "
        "(median): the prompts are words, not the model's tokens; give --tokenizer MODEL_DIR (the engine's model "
        "directory or tokenizer.json) to make them equal"], err
    assert next(x for x in out.splitlines() if x.split()[1:2] == ["plain"]).split()[2:5] == ["6/6", "24", shown]
    chat = next(c for c in on_disk["cells"] if c["cell"]["scenario"] == "chat")["prompt_tokens"]
    assert (chat["asked"], chat["counted_p50"]) == (30, 30)


class _SimThread:
    """A simulated engine on a thread and loop of its own, for the command line's own asyncio.run."""

    def __init__(self, tokenizer: PromptTokenizer) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.runner = web.AppRunner(create_sim_app(build_params("vllm", speed=50.0), tokenizer))

    async def _start(self) -> int:
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        return int(self.runner.addresses[0][1])

    def __enter__(self) -> int:
        self.thread.start()
        return asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(60)

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(60)
        self.loop.close()


@pytest.fixture
def sim_port(tokenizer_dir: Path) -> Iterator[int]:
    with _SimThread(PromptTokenizer(tokenizer_dir)) as port:
        yield port


def test_load_tokenizer_applies_to_plan_cells_and_ad_hoc_runs(sim_port: int, tokenizer_dir: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    base = ["load", "--no-proxy", "--base-url", f"http://127.0.0.1:{sim_port}", "--tokenizer", str(tokenizer_dir)]
    assert main([*base, "--plan", str(_plan(tmp_path)), "--out", str(tmp_path / "plan")]) == 0
    out, err = capsys.readouterr()
    assert "warning:" not in err and "prompt tok" in out
    records = [r for r in _records(tmp_path / "plan") if r.get("turn") in (None, 1)]
    assert {(r["scenario"], r["prompt_tokens"]) for r in records} == {("warmup", 24), ("plain", 24), ("chat", 30),
                                                                      ("talk", 16)}
    for chat in ([], ["--chat"]):
        out_dir = tmp_path / f"adhoc{len(chat)}"
        assert main([*base, "--concurrency", "2", "--requests", "3", "--input-tokens", "40", "--output-tokens", "2",
                     *chat, "--out", str(out_dir)]) == 0
        assert [r["prompt_tokens"] for r in _records(out_dir)] == [40] * 3
    assert "warning:" not in capsys.readouterr().err
    # the same run without the tokenizer: the BOS and the chat template come on top of the words
    assert main([*base[:-2], "--concurrency", "1", "--requests", "2", "--input-tokens", "8", "--output-tokens", "2",
                 "--chat", "--out", str(tmp_path / "words")]) == 0
    assert [r["prompt_tokens"] for r in _records(tmp_path / "words")] == [8 + 4] * 2
    err = capsys.readouterr().err
    assert "warning: cell" in err and "asked input_tokens 8, the engine counted 12 prompt tokens" in err


def test_load_refuses_a_tokenizer_it_cannot_use_in_one_line(tmp_path: Path, letters_dir: Path,
                                                            capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Before any request (nothing listens at the base URL): exit 2, one line, no traceback."""
    base = ["load", "--no-proxy", "--base-url", "http://127.0.0.1:9/x", "--concurrency", "1", "--requests", "1",
            "--input-tokens", "8", "--output-tokens", "2"]
    cases = [(tmp_path / "nowhere", "no tokenizer.json at"),
             (letters_dir, "keeps only 0 of the driver's words as one token each")]
    for path, said in cases:
        assert main([*base, "--tokenizer", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"llm-bench-exporter load: --tokenizer {path}: ") and said in err
        assert "Traceback" not in err
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # the trace extra not installed
    assert main([*base, "--tokenizer", str(letters_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs the tokenizers package: pip install 'llm-bench-exporter[trace]'" in err


def test_a_warning_names_the_cell_the_asked_and_the_counted_length() -> None:
    def cell(name: str, asked: float, got: float | None, tokenizer: bool, **extra: Any) -> dict[str, Any]:
        return {"cell": {"scenario": name, "input_tokens": 100, **extra},
                "prompt_tokens": {"asked": asked, "counted_p50": got, "tokenizer": tokenizer}}

    summary = {"engine": "vllm", "cells": [
        cell("near", 100, 110, False), cell("none", 100, None, False),  # within 10 %; no usage at all
        cell("far", 1024, 1942, False), cell("talk", 100, 130, False, sessions=2),
        cell("framed-talk", 100, 130, True, sessions=2), cell("other-model", 100, 89.5, True),
        cell("replay", 512, 700, False, trace="t.jsonl")]}
    assert prompt_warnings([summary]) == [
        "warning: cell vllm far: asked input_tokens 1024, the engine counted 1942 prompt tokens (median): the prompts "
        "are words, not the model's tokens; give --tokenizer MODEL_DIR (the engine's model directory or "
        "tokenizer.json) to make them equal",
        "warning: cell vllm talk: asked input_tokens 100, the engine counted 130 prompt tokens (median, first turns): "
        "each turn's new text is words, not the model's tokens; --tokenizer MODEL_DIR makes it that many tokens (the "
        "chat template comes on top)",
        "warning: cell vllm other-model: asked input_tokens 100, the engine counted 89.5 prompt tokens (median) "
        "although --tokenizer was given: is it the tokenizer of the engine's model, or is input_tokens shorter than "
        "what it adds itself (its BOS, its chat template)?",
        "warning: cell vllm replay: asked the trace's median input_length 512, the engine counted 700 prompt tokens "
        "(median): the prompts are words, not the model's tokens; give --tokenizer MODEL_DIR (the engine's model "
        "directory or tokenizer.json) to make them equal"]
    table = round_table([{"engine": "vllm", "cells": [{"cell": {"scenario": "old"}, "rounds": [],
                                                      "median": {"success": 1, "requests": 1}}]}])
    assert table.splitlines()[3].split()[:5] == ["vllm", "old", "1/1", "-", "-"]  # a summary from before


async def test_a_trace_cell_is_compared_with_its_median_input_length(aiohttp_server: Any, tokenizer_dir: Path,
                                                                     tmp_path: Path) -> None:
    from exporter.harness.load import Plan, Stage
    from exporter.harness.plan import cell_from_options

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": i, "input_length": n, "output_length": 2, "hash_ids": [i]}) + "\n"
                             for i, n in enumerate((20, 31, 26))))
    tok = PromptTokenizer(tokenizer_dir)
    sim = await aiohttp_server(create_sim_app(build_params("vllm", speed=50.0), tok))
    cell = cell_from_options(scenario="replay", input_tokens=None, output_tokens=None, requests=None, trace=str(trace),
                             block_size=16)
    for framed in (tok, None):
        async with Driver(f"http://127.0.0.1:{sim.port}", model="m", tokenizer=framed) as driver:
            summary = await driver.run_plan(Plan([Stage("s", [cell])]))
        got = summary["cells"][0]["prompt_tokens"]
        assert (got["asked"], got["counted_min"], got["counted_max"]) == ((26, 20, 31) if framed else (26, 21, 32))
        assert prompt_warnings([summary]) == []  # one BOS in 26 tokens: within 10 %


async def test_two_alike_cells_of_two_stages_count_their_own_prompts(aiohttp_server: Any, tmp_path: Path) -> None:
    """Each cell's counted prompt length comes from its own rounds' records: a cell repeated alike in a
    later stage does not pool its requests with the first one's."""
    sim = await aiohttp_server(create_sim_app(build_params("vllm", speed=50.0)))
    plan = tmp_path / "twice.yaml"
    cell = "{scenario: plain, input_tokens: 24, output_tokens: 3, concurrency: 1, requests: 3, rounds: 1}"
    plan.write_text(f"stages:\n  - name: one\n    cells: [{cell}]\n  - name: two\n    cells: [{cell}]\n")
    async with Driver(f"http://127.0.0.1:{sim.port}", model="m") as driver:
        summary = await driver.run_plan(load_plan(plan))
    assert [(c["stage"], c["prompt_tokens"]["requests"], c["prompt_tokens"]["counted_p50"]) for c in summary["cells"]] \
        == [("one", 3, 24), ("two", 3, 24)]
    assert [row["prompt_tokens_p50"] for c in summary["cells"] for row in c["rounds"]] == [24, 24]
