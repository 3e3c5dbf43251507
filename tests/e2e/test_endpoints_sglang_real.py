"""A real SGLang (0.5.23 on the CPU, the tiny random-weight llama) behind the real proxy, on the endpoints
beside completions and chat: Responses and Messages from a generating server, embeddings and rerank from one
started ``--is-embedding``.  Each request gets one record with its route and a strict verdict, and the client
gets the engine's bytes.  Needs ``.ci/install-sglang.sh``; each server takes minutes to start on a small
machine.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.harness.real_engine import start_proxy

from tests import endpoint_checks as check
from tests.sglang_engine import SglangServer, build_model, require_sglang

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def _served(out: Path, extra: list[str]) -> Iterator[str]:
    require_sglang()
    with contextlib.ExitStack() as stack:
        server = SglangServer(build_model(out / "model"), out / "logs", extra=extra)
        stack.callback(server.stop)
        t0 = time.monotonic()
        server.start()
        print(f"\nSGLang {' '.join(extra) or '(generate)'}: ready in {time.monotonic() - t0:.0f} s")
        proxy, proxy_url = start_proxy(out, [{"name": "sglang", "upstream": server.url}], capture_raw_sse="all")
        stack.callback(proxy.stop)
        yield proxy_url


@pytest.fixture(scope="module")
def generating(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    out = tmp_path_factory.mktemp("sglang-gen")
    with _served(out, []) as url:
        yield url, out


@pytest.fixture(scope="module")
def pooling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    out = tmp_path_factory.mktemp("sglang-pool")
    with _served(out, ["--is-embedding"]) as url:
        yield url, out


@pytest.mark.parametrize("stream", [True, False])
def test_responses(generating: tuple[str, Path], stream: bool) -> None:
    resp, record = check.responses(*generating, "sglang", stream, {})  # SGLang's takes no ignore_eos
    if stream and record["completion_tokens"] == check.MAX_TOKENS:  # SGLang ends an answer capped so
        assert b"event: response.incomplete" in resp.content


def test_messages(generating: tuple[str, Path]) -> None:
    check.messages(*generating, "sglang")


def test_embeddings(pooling: tuple[str, Path]) -> None:
    check.embeddings(*pooling, "sglang")


def test_rerank(pooling: tuple[str, Path]) -> None:
    check.rerank(*pooling, "sglang", lambda doc: doc, (2, 3))  # SGLang answers a bare list


def test_decode_fields_agree_with_what_the_client_received(generating: tuple[str, Path]) -> None:
    """The record's decode fields agree with the capture and with the client's stream
    (:func:`tests.endpoint_checks.decode_fields`); SGLang sends no token ids, so its completion tokens
    are spread over the events."""
    record = check.decode_fields(*generating, "sglang", token_ids=False)
    if record["text_events"] is not None:
        assert record["tokens_per_event"] == pytest.approx(record["completion_tokens"] / len(record["text"]))
