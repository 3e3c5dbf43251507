"""The simulated engines send their output token ids when asked (``return_token_ids``), and their
vocabulary (exporter/harness/sim_vocab.py) names them: the demo's empty 200s diagnosed end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from exporter.evidence.decode import decode_capture
from exporter.evidence.tokens import load_vocabulary, summary_line
from exporter.harness.sim import build_params, create_sim_app
from exporter.harness.sim_vocab import EOS_ID, token_id, write_tokenizer

from tests.helpers import wait_for_records

pytest.importorskip("tokenizers")


@pytest.mark.parametrize("stream", [True, False])
async def test_the_simulated_empty_200_generates_end_of_sequence(aiohttp_server: Any, proxy_factory: Any,
                                                                  tmp_path: Path, stream: bool) -> None:
    sim = await aiohttp_server(create_sim_app(build_params("vllm", speed=50.0)))
    proxy = await proxy_factory(sim.port, capture_raw_sse="all", engines=[
        {"name": "vllm", "upstream": f"http://127.0.0.1:{sim.port}", "token_ids": True}])
    body = {"prompt": "p", "stream": stream, "max_tokens": 5, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    for fault in ("empty_text", None):
        resp = await proxy.post("/vllm/v1/completions", json=body, headers={"X-Sim-Fault": fault} if fault else {})
        assert resp.status == 200
        await resp.read()
    empty, fine = await wait_for_records(tmp_path, 2)
    assert (empty["reason"], fine["outcome"]) == ("empty_text", "success")
    vocabulary = load_vocabulary(write_tokenizer(tmp_path / "vocab"))
    decoded = decode_capture(tmp_path / "run" / empty["capture"], vocabulary)
    assert [(t["id"], t["token"], t["special"]) for t in decoded["tokens"]] == [(EOS_ID, "</s>", True)] * 5
    assert summary_line(decoded["tokens"]) == "5 token ids (0 with visible text): 5 x 2 '</s>' (special)"
    ok = decode_capture(tmp_path / "run" / fine["capture"], vocabulary)
    assert [t["id"] for t in ok["tokens"]] == [token_id(i) for i in range(5)]
    assert [t["text"] for t in ok["tokens"]] == [f" tok{i}" for i in range(5)]  # each id's piece of the text
    assert (ok["text"], ok["text_matches"]) == ("".join(f" tok{i}" for i in range(5)), True)  # the engine's text


def test_the_vocabulary_is_a_tokenizer_json(tmp_path: Path) -> None:
    path = write_tokenizer(tmp_path)
    doc = json.loads(path.read_text())
    tok, special = load_vocabulary(path)
    assert special == {0, 1, 2, 3} and tok.id_to_token(EOS_ID) == "</s>"
    assert tok.encode("tok0 tok7").ids == [token_id(0), token_id(7)]
    assert doc["model"]["type"] == "WordLevel"


def test_the_model_tokenizer_names_the_prompts_and_frames_them(tmp_path: Path) -> None:
    """The demo's model tokenizer: the answers' ids unchanged, the driver's words one token each, a BOS
    before a plain prompt and a chat template, so that a replay's lengths come back exact."""
    from exporter.harness.load import PROMPT_WORDS
    from exporter.harness.replay import framing
    from exporter.harness.sim_vocab import write_model_tokenizer
    from exporter.proxy.prompttokens import PromptTokenizer

    tok = PromptTokenizer(write_model_tokenizer(tmp_path / "model", PROMPT_WORDS))
    ids = tok.encode("tok0 tok7 time person", True)
    assert ids[:3] == [1, token_id(0), token_id(7)] and len(ids) == 5 and 0 not in ids  # <s>, no <unk>
    chat = tok.prompt_ids({"messages": [{"role": "user", "content": "time person"}]}, True)
    assert chat is not None and len(chat) == 1 + 1 + 2 + 1 + 1 and 0 not in chat  # <s> <|user|> .. </s> <|assistant|>
    vocabulary, _ = load_vocabulary(tmp_path / "model")
    assert vocabulary.id_to_token(EOS_ID) == "</s>" and vocabulary.id_to_token(token_id(3)) == "tok3"
    assert (framing(tok, False, 64, PROMPT_WORDS).lead, framing(tok, True, 64, PROMPT_WORDS).trail) == (1, 2)
