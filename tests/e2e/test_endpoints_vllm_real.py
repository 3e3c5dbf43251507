"""A real vLLM (the CPU build, the tiny random-weight llama) behind the real proxy, on the endpoints beside
completions and chat: Responses and Messages from a generating server, embeddings and rerank from one in
pooling mode (``--runner pooling --convert embed``).  Each request gets one record with its route and a
strict verdict, and the client gets the engine's bytes.  Needs ``.ci/install-vllm.sh``; each server takes
a minute or two to start on a small machine.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import endpoint_checks as check
from tests.vllm_engine import VllmServer, build_model, require_vllm, start_proxy

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def _served(out: Path, extra: list[str]) -> Iterator[str]:
    require_vllm()
    with contextlib.ExitStack() as stack:
        server = VllmServer(build_model(out / "model"), out / "logs", extra=extra)
        stack.callback(server.stop)
        t0 = time.monotonic()
        server.start()
        print(f"\nvLLM {' '.join(extra) or '(generate)'}: ready in {time.monotonic() - t0:.0f} s")
        proxy, proxy_url = start_proxy(out, [{"name": "vllm", "upstream": server.url}], capture_raw_sse="all")
        stack.callback(proxy.stop)
        yield proxy_url


@pytest.fixture(scope="module")
def generating(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    out = tmp_path_factory.mktemp("vllm-gen")
    with _served(out, []) as url:
        yield url, out


@pytest.fixture(scope="module")
def pooling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    out = tmp_path_factory.mktemp("vllm-pool")
    with _served(out, ["--runner", "pooling", "--convert", "embed"]) as url:
        yield url, out


@pytest.mark.parametrize("stream", [True, False])
def test_responses(generating: tuple[str, Path], stream: bool) -> None:
    _, record = check.responses(*generating, "vllm", stream, {"ignore_eos": True})
    assert record["completion_tokens"] == check.MAX_TOKENS  # vLLM's Responses takes ignore_eos


def test_messages(generating: tuple[str, Path]) -> None:
    check.messages(*generating, "vllm")


def test_embeddings(pooling: tuple[str, Path]) -> None:
    check.embeddings(*pooling, "vllm")


def test_rerank(pooling: tuple[str, Path]) -> None:
    check.rerank(*pooling, "vllm", lambda doc: doc["results"], (2,))


def test_decode_fields_agree_with_what_the_client_received(generating: tuple[str, Path]) -> None:
    """The record's decode fields agree with the capture and with the client's stream
    (:func:`tests.endpoint_checks.decode_fields`), each event's tokens from its token ids."""
    record = check.decode_fields(*generating, "vllm", token_ids=True)
    text = record["text"]
    if record["text_events"] is not None:
        tokens = sum(len(c["choices"][0]["token_ids"]) for c in text)
        assert record["tokens_per_event"] == pytest.approx(tokens / len(text))
