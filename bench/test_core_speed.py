"""Micro-benchmarks of the measuring core (pytest-benchmark; not part of the test suite).

    python -m pytest bench/test_core_speed.py --benchmark-only

Each round judges one 512-token vLLM completions stream read by read (one event per read),
as the proxy does; compare with re-chunked reads and with a plain json.loads of every event.
"""

from __future__ import annotations

import json
from typing import Any

from exporter.core.analysis import RequestSpec, StreamAnalyzer


def _stream(tokens: int = 512) -> list[bytes]:
    events = []
    for i in range(tokens):
        doc = {"id": "cmpl-abc", "object": "text_completion", "created": 1700000000, "model": "m",
               "choices": [{"index": 0, "text": f" tok{i}", "logprobs": None,
                            "finish_reason": "length" if i == tokens - 1 else None, "stop_reason": None}]}
        events.append(b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n")
    usage = {"id": "cmpl-abc", "object": "text_completion", "created": 1700000000, "model": "m", "choices": [],
             "usage": {"prompt_tokens": 1024, "total_tokens": 1024 + tokens, "completion_tokens": tokens}}
    events.append(b"data: " + json.dumps(usage, separators=(",", ":")).encode() + b"\n\ndata: [DONE]\n\n")
    return events


READS = _stream()
BODY = b"".join(READS)
SPEC = RequestSpec(stream=True, expected_tokens=512)


def _judge(reads: list[bytes]) -> Any:
    an = StreamAnalyzer(0.0, 200, SPEC, streaming=True)
    for i, r in enumerate(reads):
        an.feed(r, i * 0.01)
    return an.finish(10.0)


def test_one_event_per_read(benchmark: Any) -> None:
    result = benchmark(_judge, READS)
    assert result.ok and result.completion_tokens == 512


def test_4k_reads(benchmark: Any) -> None:
    reads = [BODY[i:i + 4096] for i in range(0, len(BODY), 4096)]
    result = benchmark(_judge, reads)
    assert result.ok


def test_json_loads_only(benchmark: Any) -> None:
    payloads = [r[6:].split(b"\n\n")[0] for r in READS[:-1]]
    benchmark(lambda: [json.loads(p) for p in payloads])
