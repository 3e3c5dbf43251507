"""Why the text was empty: the engine's output token ids (engine option ``token_ids: true`` asks
vLLM for ``return_token_ids``), kept in the raw capture, named by ``evidence decode --tokenizer``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from exporter.core.tokenids import output_token_ids
from exporter.core.usage import ask_token_ids
from exporter.evidence.cli import main as evidence_main

from tests.helpers import stream_events, wait_for_records
from tests.transcripts import sse

EOS = 2  # "</s>" in the tokenizer below, as in exporter/harness/tiny_model.py's tiny model
# the seed's empty 200: 16 tokens, every one of them </s>, which detokenizing skips
EMPTY_200 = [
    '{"id":"cmpl-e","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"",'
    '"token_ids":[' + ",".join([str(EOS)] * 8) + '],"finish_reason":null}]}',
    '{"id":"cmpl-e","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"",'
    '"token_ids":[' + ",".join([str(EOS)] * 8) + '],"finish_reason":"length"}]}',
    '{"id":"cmpl-e","object":"text_completion","created":1,"model":"m","choices":[],'
    '"usage":{"prompt_tokens":4,"total_tokens":20,"completion_tokens":16}}',
    "[DONE]",
]


def test_ask_token_ids_appends_the_member_once() -> None:
    assert json.loads(ask_token_ids(b'{"prompt": "x"}') or b"") == {"prompt": "x", "return_token_ids": True}
    assert ask_token_ids(b'{"prompt":"x","return_token_ids":true}') is None
    assert ask_token_ids(b"[1]") is None and ask_token_ids(b"{}") == b'{"return_token_ids":true}'


def test_output_token_ids_from_a_stream_and_a_document() -> None:
    assert output_token_ids(sse(*EMPTY_200), True) == [EOS] * 16
    assert output_token_ids(b'{"choices":[{"index":0,"text":"a","token_ids":[5,6]}]}', False) == [5, 6]
    assert output_token_ids(sse(*EMPTY_200[2:]), True) is None  # none asked for, none sent


def _tokenizer(path: Path) -> Path:
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["hello world, the engine said hello"] * 20, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    return path


async def test_an_empty_200_says_what_the_engine_generated(aiohttp_server: Any, proxy_factory: Any, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        seen.append(await request.json())
        return await stream_events(request, [sse(e) for e in EMPTY_200])

    app = web.Application()
    app.router.add_post("/v1/completions", handle)
    server = await aiohttp_server(app)
    client = await proxy_factory(server.port, capture_raw_sse="all", engines=[
        {"name": "vllm", "upstream": f"http://127.0.0.1:{server.port}", "token_ids": True}])
    body = {"prompt": "p", "stream": True, "max_tokens": 16, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    assert (await client.post("/vllm/v1/completions", json=body)).status == 200
    (record,) = await wait_for_records(tmp_path, 1)
    assert seen[0]["return_token_ids"] is True  # asked of the engine
    assert (record["outcome"], record["reason"], record["completion_tokens"]) == ("failure", "empty_text", 16)
    capture = tmp_path / "run" / record["capture"]
    vocab = _tokenizer(tmp_path / "tok")
    assert evidence_main(["decode", str(capture), "--tokenizer", str(vocab), "--json"]) == 0  # re-judged as recorded
    (decoded,) = json.loads(capsys.readouterr().out)
    assert [(t["id"], t["token"], t["special"]) for t in decoded["tokens"]] == [(EOS, "</s>", True)] * 16
    assert evidence_main(["decode", str(capture), "--tokenizer", str(vocab)]) == 0
    assert "16 token ids (0 with visible text): 16 x 2 '</s>' (special)" in capsys.readouterr().out


def test_a_bad_tokenizer_path_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tokenizers")
    assert evidence_main(["decode", str(tmp_path / "x.sse"), "--tokenizer", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no tokenizer.json" in err


async def test_decode_shows_the_engines_visible_text(aiohttp_server: Any, proxy_factory: Any, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A plain request whose text has a leading space and a character split across byte-level tokens: the ids'
    text equals the engine's visible text, and the per-id pieces join to it (no U+FFFD halves)."""
    from tokenizers import Tokenizer

    vocab = _tokenizer(tmp_path / "tok")
    tok = Tokenizer.from_file(str(vocab / "tokenizer.json"))
    visible = " hello world, the engine said h\u00e9llo \U0001F642!"
    ids = tok.encode(visible).ids
    assert tok.decode(ids[-3:-1]) != "\U0001F642"  # the emoji is several tokens: decoded one by one it is lost
    chunks = []
    for k, i in enumerate(ids):  # as vLLM streams it: a partial character's bytes wait for the rest
        text = tok.decode(ids[:k + 1])
        before = tok.decode(ids[:k]) if k else ""
        piece = "" if text.endswith("\ufffd") else text[len(before.rstrip("\ufffd")):]
        chunks.append(json.dumps({"id": "c", "object": "text_completion", "created": 1, "model": "m",
                                  "choices": [{"index": 0, "text": piece, "token_ids": [i], "finish_reason": None}]}))
    assert "".join(json.loads(c)["choices"][0]["text"] for c in chunks) == visible
    usage = {"prompt_tokens": 2, "completion_tokens": len(ids), "total_tokens": 2 + len(ids)}
    events = [*chunks, json.dumps({"id": "c", "object": "text_completion", "model": "m", "choices": [],
                                   "usage": usage}), "[DONE]"]

    async def handle(request: web.Request) -> web.StreamResponse:
        return await stream_events(request, [sse(e) for e in events])

    app = web.Application()
    app.router.add_post("/v1/completions", handle)
    server = await aiohttp_server(app)
    client = await proxy_factory(server.port, capture_raw_sse="all", engines=[
        {"name": "vllm", "upstream": f"http://127.0.0.1:{server.port}", "token_ids": True}])
    body = {"prompt": "p", "stream": True, "max_tokens": len(ids), "stream_options": {"include_usage": True}}
    assert (await client.post("/vllm/v1/completions", json=body)).status == 200
    (record,) = await wait_for_records(tmp_path, 1)
    assert record["outcome"] == "success"
    capture = tmp_path / "run" / record["capture"]
    assert evidence_main(["decode", str(capture), "--tokenizer", str(vocab), "--json"]) == 0
    (decoded,) = json.loads(capsys.readouterr().out)
    assert (decoded["text"], decoded["visible_text"], decoded["text_matches"]) == (visible, visible, True)
    assert [t["id"] for t in decoded["tokens"]] == ids and "".join(t["text"] for t in decoded["tokens"]) == visible
    assert evidence_main(["decode", str(capture), "--tokenizer", str(vocab)]) == 0
    assert f"text of the ids: {visible!r} (equal to the engine's visible text)" in capsys.readouterr().out
