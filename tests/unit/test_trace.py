"""The real workload, captured and replayed: keyed chained block hashes of each prompt in the proxy's
records (config ``trace``), ``evidence trace`` (a Mooncake trace), ``load --trace`` and ``sim --tokenizer``."""

from __future__ import annotations

import base64
import json
import random
import threading
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from exporter.evidence.cli import main as evidence_main
from exporter.evidence.mooncake import TraceError, hash_id_count, mooncake_lines
from exporter.harness.load import Driver, Plan, Stage, make_prompt
from exporter.harness.plan import PlanError, cell_from_options
from exporter.harness.replay import Prompts, TraceLine, read_trace
from exporter.harness.sim import build_params, create_sim_app
from exporter.proxy.app import create_app
from exporter.proxy.config import ConfigError, validate
from exporter.proxy.prompttokens import PromptTokenizer
from exporter.proxy.state import STATE
from exporter.proxy.trace import block_hashes, run_key

from tests.helpers import make_config, read_records, stream_events
from tests.tiny_tokenizer import build_tokenizer

SECRET = "violet harbour secret"  # a phrase of the prompts that must reach no file


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def test_block_hashes_are_chained_keyed_and_shared_for_a_shared_prefix() -> None:
    key, other = b"k" * 32, b"o" * 32
    a = list(range(1000))
    b = list(range(512)) + [7] * 488  # the same first two blocks of 256
    c = [9] * 256 + a[256:512]  # a's second block behind another first one
    ha, hb, hc = (block_hashes(x, 256, key) for x in (a, b, c))
    assert len(ha) == hash_id_count(1000, 256) == 4 and len(set(ha)) == 4  # the short last block too
    assert ha[:2] == hb[:2] and ha[2] != hb[2] and ha[3] != hb[3]
    assert hc[1] != ha[1]  # equal tokens behind another prefix: another hash (chained)
    assert block_hashes(a, 256, key) == ha and block_hashes(a, 256, other)[0] != ha[0]  # keyed
    assert block_hashes(a[:255], 256, key) != ha[:1]  # a short block is not the full one
    assert block_hashes([], 256, key) == [] and all(len(h) == 16 for h in ha)
    assert run_key("run-a") != run_key("run-b") and run_key("run-a") == run_key("run-a")


def test_prompts_tokenized_as_the_engine_does(tokenizer_dir: Path) -> None:
    tok = PromptTokenizer(tokenizer_dir)
    words = make_prompt(random.Random(1), 30)
    ids = tok.prompt_ids({"prompt": words}, chat=False)
    assert ids is not None and len(ids) == 31 and ids[0] == tok.encode("", True)[0]  # BOS + one per word
    assert tok.prompt_ids({"prompt": [words]}, chat=False) == ids  # a batch of one
    assert tok.prompt_ids({"prompt": [5, 6, 7]}, chat=False) == [5, 6, 7]  # token ids as they are
    assert tok.prompt_ids({"prompt": [words, words]}, chat=False) is None  # a batch: not traced
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"},
                                                                                    {"type": "text", "text": "you"}]}]
    assert tok.chat_text({"messages": msgs}) == "<s><|system|>\nbe brief</s>\n<|user|>\nhi\nyou</s>\n<|assistant|>\n"
    assert tok.chat_text({"messages": msgs, "add_generation_prompt": False}).endswith("you</s>\n")
    chat = tok.prompt_ids({"messages": [{"role": "user", "content": words}]}, chat=True)
    assert chat is not None and len(chat) == 1 + 1 + 30 + 1 + 1  # <s> <|user|> words </s> <|assistant|>
    assert chat.count(ids[0]) == 1  # the template's BOS only: chat is encoded without special tokens


def test_trace_config(tokenizer_dir: Path, tmp_path: Path) -> None:
    base = {"engines": [{"name": "vllm", "upstream": "http://127.0.0.1:1"}]}
    assert validate(base).trace is None  # off by default
    cfg = validate({**base, "trace": {"tokenizer": str(tokenizer_dir)}})
    assert cfg.trace is not None and cfg.trace.block_size == 512
    for bad in ({"tokenizer": str(tmp_path / "none")}, {"tokenizer": str(tokenizer_dir), "block_size": 0}, {}):
        with pytest.raises(ConfigError, match="trace"):
            validate({**base, "trace": bad})


def _files_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


async def test_capture_through_the_proxy(aiohttp_server: Any, aiohttp_client: Any, tokenizer_dir: Path,
                                         tmp_path: Path) -> None:
    """Hashes in the records, shared as far as the prompts are; tokenized off the loop; neither the key
    nor any prompt text in any file the proxy wrote (a failed request's capture included)."""
    seen = []

    async def engine(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body)
        if body.get("max_tokens") == 3:
            return web.json_response({"object": "error", "message": "boom"}, status=500)
        usage = {"prompt_tokens": 99, "completion_tokens": 2, "total_tokens": 101}
        chunks = [{"choices": [{"index": 0, "text": "ab"}]}, {"choices": [], "usage": usage}]
        return await stream_events(request, [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"])

    app = web.Application()
    app.router.add_post("/v1/completions", engine)
    app.router.add_post("/v1/chat/completions", engine)
    upstream = await aiohttp_server(app)
    proxy_app = create_app(make_config(tmp_path, upstream.port, trace={"tokenizer": str(tokenizer_dir), "block_size": 64}))
    client = await aiohttp_client(proxy_app)
    state = proxy_app[STATE]
    threads: list[str] = []
    prompt_ids = state.tracer.tokenizer.prompt_ids
    state.tracer.tokenizer.prompt_ids = lambda *a: threads.append(threading.current_thread().name) or prompt_ids(*a)
    shared = make_prompt(random.Random(3), 600)
    prompts = [shared + " " + SECRET + " one", shared + " time " + SECRET]
    base = {"max_tokens": 2, "ignore_eos": True, "stream": True}
    for p in prompts:
        await (await client.post("/vllm/v1/completions", json={**base, "prompt": p})).read()
    await (await client.post("/vllm/v1/chat/completions", json={**base, "messages": [{"role": "user", "content": shared}]})).read()
    await (await client.post("/vllm/v1/completions", json={**base, "max_tokens": 3, "prompt": prompts[0]})).read()
    recs = read_records(tmp_path)
    assert [r["outcome"] for r in recs] == ["success", "success", "success", "failure"] and recs[3]["capture"]
    a, b, chat, failed = (r["prefix_hashes"] for r in recs)
    n = PromptTokenizer(tokenizer_dir).prompt_ids({"prompt": prompts[0]}, False)
    assert n is not None and recs[0]["prefix_tokens"] == len(n) and len(a) == hash_id_count(len(n), 64)
    assert a[:9] == b[:9] and a[9] != b[9]  # BOS + 600 shared words: 9 whole blocks of 64 in common
    assert failed == a  # the same prompt: the same hashes
    assert not set(chat) & set(a)  # the chat template comes first: nothing in common from block 0 on
    assert {r["trace_block_size"] for r in recs} == {64} and recs[0]["prompt_tokens"] == 99  # lengths: the engine's
    assert threads and "MainThread" not in threads and all(t.startswith("llmbench-trace") for t in threads)
    key = run_key(state.worker.run_id)
    assert key == state.tracer._key
    await client.close()
    written = _files_bytes(tmp_path / "run")
    for needle in (key, key.hex().encode(), base64.b64encode(key), SECRET.encode(), shared[:60].encode()):
        assert needle not in written


async def test_no_trace_config_no_trace_fields(upstream: Any, proxy_factory: Any, tmp_path: Path) -> None:
    up, server = upstream
    client = await proxy_factory(server.port)
    assert client.server.app[STATE].tracer is None
    await (await client.post("/vllm/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stream": True})).read()
    assert "prefix_hashes" not in read_records(tmp_path)[0]


def _rec(t: float, hashes: list[str] | None, n_in: int, n_out: int = 8, ok: bool = True, **kw: Any) -> dict[str, Any]:
    return {"id": f"r{t}", "run_id": "run1", "engine": "vllm", "scenario": "none", "start_unix": 1000.0 + t,
            "outcome": "success" if ok else "failure", "prompt_tokens": n_in if ok else None,
            "completion_tokens": n_out if ok else None, "expected_tokens": n_out, "prefix_hashes": hashes,
            "prefix_tokens": n_in, "trace_block_size": 4, **kw}


def test_mooncake_export_numbers_ids_in_first_seen_order() -> None:
    records = [
        _rec(2.5, ["a", "b", "x"], 12),
        _rec(0.0, ["a", "b", "c"], 10),  # the run's first arrival
        _rec(1.0, None, 9, ok=False),  # a failure: left out unless --all
        _rec(3.0, ["a"], 9),  # the engine counted more than the proxy hashed: fresh ids
        _rec(4.0, ["a", "b", "c", "d", "e"], 8),  # hashed more than the engine counted: cut
        _rec(5.0, ["a", "b", "c"], 9, scenario="warmup"),  # warm-ups: never
    ]
    lines, facts = mooncake_lines(records)
    assert lines == [
        {"timestamp": 0, "input_length": 10, "output_length": 8, "hash_ids": [0, 1, 2]},
        {"timestamp": 2500, "input_length": 12, "output_length": 8, "hash_ids": [0, 1, 3]},
        {"timestamp": 3000, "input_length": 9, "output_length": 8, "hash_ids": [0, 4, 5]},
        {"timestamp": 4000, "input_length": 8, "output_length": 8, "hash_ids": [0, 1]},
    ]
    assert facts["block_size"] == 4 and facts["unhashed_blocks"] == 2 and facts["skipped"] == 1
    every, _ = mooncake_lines(records, everything=True)
    assert every[1] == {"timestamp": 1000, "input_length": 9, "output_length": 8, "hash_ids": [3, 4, 5]}
    for line in every:  # what AIPerf's loader checks: the last block holds 1..block_size tokens
        last = line["input_length"] - (len(line["hash_ids"]) - 1) * 4
        assert 0 < last <= 4


def test_hash_id_count_is_aiperfs_rule() -> None:
    assert [hash_id_count(n, 4) for n in (1, 3, 4, 5, 8, 9)] == [1, 1, 1, 2, 2, 3]


def test_mooncake_export_keeps_runs_and_engines_apart(tmp_path: Path) -> None:
    records = [_rec(0, ["a"], 4), {**_rec(1, ["a"], 4), "run_id": "run2"}]
    with pytest.raises(TraceError, match="--run"):
        mooncake_lines(records)
    assert len(mooncake_lines(records, run="run2")[0]) == 1
    with pytest.raises(TraceError, match="--engine"):
        mooncake_lines([_rec(0, ["a"], 4), {**_rec(1, ["a"], 4), "engine": "sglang"}])
    with pytest.raises(TraceError, match="blocks of 4 tokens"):
        mooncake_lines([_rec(0, ["a"], 4)], block_size=16)
    sliced = [_rec(0, ["a"], 4), _rec(1, ["b"], 4, scenario="chat"), _rec(2.5, ["b", "c"], 6, scenario="chat")]
    lines, facts = mooncake_lines(sliced, scenario="chat")  # one scenario: timestamps from its first arrival
    assert [(x["timestamp"], x["hash_ids"]) for x in lines] == [(0, [0]), (1500, [0, 1])] and facts["scenario"] == "chat"
    with pytest.raises(TraceError, match="--scenario nope: .*scenarios there: chat, none"):
        mooncake_lines(sliced, scenario="nope")


def test_evidence_trace_writes_the_trace_and_its_note(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "rec").mkdir()
    lines = [_rec(0, ["a", "b"], 8), _rec(0.5, ["a", "c"], 7), _rec(1.0, None, 5)]
    (tmp_path / "rec" / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    out = tmp_path / "out" / "trace.jsonl"
    assert evidence_main(["trace", "--records", str(tmp_path / "rec"), "--out", str(out)]) == 0
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert [g["hash_ids"] for g in got] == [[0, 1], [0, 2], [3, 4]]
    assert list(got[0]) == ["timestamp", "input_length", "output_length", "hash_ids"]
    note = (tmp_path / "out" / "trace.jsonl.md").read_text()
    assert "Block size: 4 tokens" in note and "never written" in note and "no prompt or output text" in note
    assert "1 of 3 requests carry no prefix hashes" in capsys.readouterr().err
    assert evidence_main(["trace", "--records", str(tmp_path / "none"), "--out", str(out)]) == 2


def test_trace_files_and_cells(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 500, "input_length": 6, "output_length": 2, "hash_ids": [1, 2]}\n'
                     '{"timestamp": 100, "input_length": 9, "output_length": 3, "hash_ids": [1, 2, 3]}\n')
    lines = read_trace(trace)
    assert [(t.offset_s, t.input_length) for t in lines] == [(0.0, 9), (0.4, 6)]
    cell = cell_from_options(scenario="replay", input_tokens=None, output_tokens=None, requests=None,
                             trace=str(trace), speedup=2.0)
    assert (cell.requests, cell.input_tokens, cell.output_tokens, cell.concurrency, cell.rate) == (2, 9, 3, None, None)
    with pytest.raises(PlanError, match="trace's own arrivals"):
        cell_from_options(scenario="x", input_tokens=1, output_tokens=1, requests=1, trace=str(trace), rate=1.0)
    with pytest.raises(PlanError, match="3 requests asked"):
        cell_from_options(scenario="x", input_tokens=None, output_tokens=None, requests=3, trace=str(trace))
    trace.write_text('{"timestamp": 1, "input_length": 0, "output_length": 2}\n')
    with pytest.raises(PlanError, match="input_length"):
        cell_from_options(scenario="x", input_tokens=None, output_tokens=None, requests=None, trace=str(trace))


def test_equal_hash_ids_give_equal_prompt_blocks() -> None:
    prompts = Prompts(4, "seed", make_prompt)
    a = prompts.text(TraceLine(0, 10, 1, (1, 2, 3)), 0).split()
    b = prompts.text(TraceLine(0, 7, 1, (1, 2)), 1).split()
    c = prompts.text(TraceLine(0, 6, 1, (1,)), 2).split()  # one id for 6 tokens: 2 words of its own
    assert len(a) == 10 and len(b) == 7 and len(c) == 6
    assert a[:7] == b and a[:4] == c[:4] and c[4:] != a[4:6]
    assert Prompts(4, "round 2", make_prompt).text(TraceLine(0, 10, 1, (1, 2, 3)), 0).split() != a  # its own text


def test_hash_ids_that_diverge_late_give_prompts_that_diverge_there(tmp_path: Path) -> None:
    """Two lines of one prefix group whose ids part after block 10 (a trace written with blocks of 16 tokens):
    replayed at the block size the trace implies, their prompts share exactly the first 10 blocks; a block
    size that would leave ids out of the prompt (and send the two alike) is refused, naming the right one."""
    trace = tmp_path / "t.jsonl"
    ids = [list(range(32, 49)), [*range(32, 42), *range(63, 70)]]
    trace.write_text("".join(json.dumps({"timestamp": i, "input_length": 17 * 16 - 3, "output_length": 2,
                                         "hash_ids": h}) + "\n" for i, h in enumerate(ids)))
    cell = cell_from_options(scenario="replay", input_tokens=None, output_tokens=None, requests=None, trace=str(trace))
    assert cell.block_size == 16
    prompts = Prompts(cell.block_size, "seed", make_prompt)
    a, b = (prompts.text(line, i).split() for i, line in enumerate(read_trace(trace)))
    assert len(a) == len(b) == 17 * 16 - 3
    assert a[:160] == b[:160]
    assert all(a[k:k + 16] != b[k:k + 16] for k in range(160, len(a), 16))
    with pytest.raises(PlanError, match=r"line 1 has 17 hash ids .* blocks of 512 tokens \(--block-size\) hold: "
                                        r"its lines fit blocks of 16 tokens"):
        cell_from_options(scenario="replay", input_tokens=None, output_tokens=None, requests=None, trace=str(trace),
                          block_size=512)


async def test_replay_against_the_simulated_engine(aiohttp_server: Any, tmp_path: Path) -> None:
    """Open loop at the trace's timestamps (over the speedup), max_tokens = output_length with
    ignore_eos, prompt lengths as the trace says and shared blocks shared; rounds as for any cell."""
    seen: list[dict[str, Any]] = []
    sim_app = create_sim_app(build_params("vllm", speed=50.0))

    @web.middleware
    async def keep(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "POST":
            seen.append(await request.json())
        return await handler(request)

    sim_app.middlewares.append(keep)
    sim = await aiohttp_server(sim_app)
    trace = tmp_path / "t.jsonl"
    rows = [(0, 20, 3, [0, 1, 2]), (400, 18, 2, [0, 1, 3]), (800, 7, 4, [0]), (1000, 30, 1, [5])]
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": h}) + "\n"
                             for t, i, o, h in rows))
    cell = cell_from_options(scenario="replay", input_tokens=None, output_tokens=None, requests=None,
                             trace=str(trace), speedup=4.0, block_size=8, rounds=2)
    async with Driver(f"http://127.0.0.1:{sim.port}", tmp_path / "load") as driver:
        driver.direct()
        summary = await driver.run_plan(Plan([Stage("s", [cell])]))
    recs = [json.loads(x) for x in (tmp_path / "load" / "requests.jsonl").read_text().splitlines()]
    assert [r["outcome"] for r in recs] == ["success"] * 8 and len(summary["cells"][0]["rounds"]) == 2
    first = recs[:4]
    assert [(r["prompt_tokens"], r["completion_tokens"]) for r in first] == [(i, o) for _, i, o, _ in rows]
    due = [r["intended_start_unix"] - first[0]["intended_start_unix"] for r in first]
    assert due == pytest.approx([0.0, 0.1, 0.2, 0.25], abs=1e-3)
    assert all(r["schedule_lag_s"] is not None for r in recs) and "schedule_lag_p99_s" in summary["cells"][0]["median"]
    bodies = seen[:4]
    assert [(b["max_tokens"], b["ignore_eos"]) for b in bodies] == [(o, True) for _, _, o, _ in rows]
    words = [b["prompt"].split() for b in bodies]
    assert words[0][:16] == words[1][:16] and words[0][16:] != words[1][16:18]  # ids 0, 1 shared
    assert words[2][:7] == words[0][:7]  # id 0's block, cut to what input_length leaves
    assert seen[4]["prompt"] != bodies[0]["prompt"]  # round 2: text of its own, the same shape
    assert len(seen[4]["prompt"].split()) == 20


async def test_sim_counts_prompt_tokens_with_a_tokenizer(aiohttp_client: Any, tokenizer_dir: Path) -> None:
    tok = PromptTokenizer(tokenizer_dir)
    words = make_prompt(random.Random(5), 12)
    for app, expect in ((create_sim_app(build_params("vllm", speed=50.0)), (12, 12)),
                        (create_sim_app(build_params("vllm", speed=50.0), tok), (13, 16))):
        client = await aiohttp_client(app)
        got = []
        for path, body in (("/v1/completions", {"prompt": words}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": words}]})):
            resp = await client.post(path, json={**body, "max_tokens": 2, "stream": False})
            got.append((await resp.json())["usage"]["prompt_tokens"])
        assert tuple(got) == expect
        await client.close()
