"""Trace capture (config ``trace``): each measured request's prompt kept as keyed, chained block hashes.

For every measured request the proxy tokenizes the prompt as the engine does
(:mod:`exporter.proxy.prompttokens`), cuts the token ids into blocks of ``block_size`` and keeps,
in the record, ``prefix_hashes``: one hash per block, each of the block's ids and the previous
block's hash (vLLM's prefix-cache hashing, keyed), so that two prompts with the same first k blocks
have the same first k hashes and nothing more in common.  The last block, when it is shorter than
``block_size``, is hashed too (so that equal prompts stay equal to the end).  ``prefix_tokens`` is
the number of ids the proxy's tokenizer found (the lengths a trace gives are the engine's,
``prompt_tokens``, not this), ``trace_block_size`` the block size.

The hash is BLAKE2b-64 keyed with a key made for the run: derived from its ``run_id`` and a secret
drawn when this module is imported (``serve`` imports it before it forks its workers, so every
worker of a run hashes alike); the key lives in memory only and is never written, so the hashes
cannot be checked against a guessed prompt after the run.  No prompt or output text is kept.

Tokenizing runs in a thread of its own (:class:`Tracer`), started as soon as the body is read: the
tokenizer's ``encode_batch`` releases the GIL while it works, so the event loop is not held; the
record waits for it only if the answer came first (it rarely does: a prefill takes longer).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from array import array
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import orjson

from .config import Trace
from .prompttokens import PromptTokenizer, TokenizerError

__all__ = ["Traced", "Tracer", "block_hashes", "run_key", "check_trace", "DIGEST_BYTES", "TRACE_THREADS"]

log = logging.getLogger("llmbench.proxy")

#: bytes of each block hash (16 hex digits in the record)
DIGEST_BYTES = 8
#: threads that tokenize, per proxy process: one, so that the event loop keeps a core to itself
TRACE_THREADS = 1
#: drawn once per process, before ``serve`` forks: the workers of one run share it; never written
_SECRET = secrets.token_bytes(32)
_ITEM = array("I").itemsize  # 4 bytes per token id


def run_key(run_id: str) -> bytes:
    """The run's hashing key: random per run, the same in every worker of the run, kept in memory."""
    return hashlib.blake2b(run_id.encode(), key=_SECRET, digest_size=32, person=b"llmbench-trace").digest()


def block_hashes(ids: Sequence[int], block_size: int, key: bytes) -> list[str]:
    """Keyed, chained hashes of the blocks of ``ids`` (the last one may be short), as hex."""
    data = array("I", ids).tobytes()
    step = block_size * _ITEM
    out: list[str] = []
    prev = b""
    for start in range(0, len(data), step):
        prev = hashlib.blake2b(prev + data[start:start + step], key=key, digest_size=DIGEST_BYTES).digest()
        out.append(prev.hex())
    return out


@dataclass(frozen=True, slots=True)
class Traced:
    """What the record keeps of one prompt: its block hashes and how many ids they cover."""

    prefix_hashes: tuple[str, ...] = ()
    prefix_tokens: int | None = None  # None: the prompt could not be tokenized (not traced)
    block_size: int | None = None  # tokens per hashed block

    def fields(self) -> dict[str, Any]:
        return {"prefix_hashes": list(self.prefix_hashes), "prefix_tokens": self.prefix_tokens,
                "trace_block_size": self.block_size}


def check_trace(trace: Trace | None) -> str | None:
    """Why the ``trace`` config cannot run here (one line), or None: the tokenizer is loaded once."""
    if trace is None:
        return None
    try:
        PromptTokenizer(trace.tokenizer)
    except TokenizerError as exc:
        return f"trace.tokenizer: {exc}"
    return None


class Tracer:
    """Tokenizes and hashes the prompts of one proxy process, in a thread of its own."""

    def __init__(self, config: Trace, run_id: str, threads: int = TRACE_THREADS) -> None:
        self.tokenizer = PromptTokenizer(config.tokenizer)
        self.block_size = config.block_size
        self._key = run_key(run_id)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="llmbench-trace")

    def submit(self, body: bytes, chat: bool) -> asyncio.Future[Traced]:
        """Start tokenizing ``body``'s prompt now; the future never raises."""
        return asyncio.get_running_loop().run_in_executor(self._pool, self.trace, body, chat)

    def trace(self, body: bytes, chat: bool) -> Traced:
        """The prompt's block hashes (empty when the body holds no prompt this can tokenize)."""
        try:
            doc = orjson.loads(body)
            ids = self.tokenizer.prompt_ids(doc, chat) if isinstance(doc, dict) else None
        except Exception as exc:  # a body the engine refuses, a template that raises: not traced
            log.debug("prompt not traced: %s", type(exc).__name__)  # its message may quote the prompt
            return Traced(block_size=self.block_size)
        if ids is None:
            return Traced(block_size=self.block_size)
        return Traced(tuple(block_hashes(ids, self.block_size, self._key)), len(ids), self.block_size)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
