"""Fuzz targets for the measuring core: each raises AssertionError (or any exception) on a finding.

* :func:`check_bytes`: any bytes, as an SSE stream, a non-streaming body, a request body and a
  Content-Type: no exception, a verdict from SPEC section 4, the same verdict for every split
  into reads and with or without orjson, memory held within the bounds, the usage filter's
  output the same for every split, the request scan equal to a full parse.
* :func:`check_generated`: a stream drawn from :mod:`grammar`, re-spelled and re-chunked: the
  verdict, text length and tokens the grammar's oracle expects, and the usage filter's output
  equal to the stream without its usage-only events.
"""

from __future__ import annotations

import json
import random
from typing import Any

import exporter.core.jsondepth as jsondepth
from exporter.core.analysis import REASONS, RequestSpec, Result, StreamAnalyzer
from exporter.core.content import is_event_stream
from exporter.core.request import top_level_members, WANTED
from exporter.core.usage import UsageEventFilter, inject_usage

from . import grammar

SMALL_LINE, SMALL_EVENT = 64, 256  # tight bounds for raw bytes, so that they are reached


def judge(reads: list[bytes], *, streaming: bool = True, spec: RequestSpec | None = None,
          max_line: int = SMALL_LINE, max_event: int = SMALL_EVENT) -> Result:
    """Judge reads arriving 10 ms apart, checking the parser's memory after each one."""
    an = StreamAnalyzer(0.0, 200, spec or RequestSpec(), streaming=streaming,
                        max_line_bytes=max_line, max_event_bytes=max_event)
    for i, read in enumerate(reads):
        an.feed(read, 0.01 * (i + 1))
        parser = an._parser
        if parser is not None:
            assert parser.pending_bytes <= max_line + max_event + 1, parser.pending_bytes
    return an.finish(0.01 * (len(reads) + 1))


def signature(r: Result) -> tuple[Any, ...]:
    return (r.reason, r.visible_chars, r.prompt_tokens, r.completion_tokens, r.done)


def split(data: bytes, seed: bytes) -> list[bytes]:
    rng = random.Random(seed)
    points = sorted({rng.randrange(1, len(data)) for _ in range(rng.randrange(1, 9))}) if len(data) > 1 else []
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)]) if b > a]


def without_orjson(fn: Any, *args: Any, **kw: Any) -> Any:
    saved = jsondepth._orjson
    jsondepth._orjson = None
    try:
        return fn(*args, **kw)
    finally:
        jsondepth._orjson = saved


def _filtered(reads: list[bytes], max_event: int = 16 << 20) -> bytes:
    f = UsageEventFilter(max_event)
    return b"".join(f.feed(r) for r in reads) + f.flush()


def _check_request(data: bytes) -> None:
    spec = RequestSpec.from_body(data)
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        doc = None
    if isinstance(doc, dict):  # valid JSON: the scan must equal a full parse
        assert top_level_members(data) == {k: v for k, v in doc.items() if k in WANTED}, data[:200]
    assert without_orjson(RequestSpec.from_body, data) == spec
    injected = inject_usage(data, spec)
    if injected is not None and isinstance(doc, dict):
        new = json.loads(injected)
        assert new["stream_options"]["include_usage"] is True
        assert {k: v for k, v in new.items() if k != "stream_options"} == {
            k: v for k, v in doc.items() if k != "stream_options"}


def check_bytes(data: bytes) -> None:
    """Coverage target: any bytes at all."""
    whole = judge([data])
    assert whole.reason is None or whole.reason in REASONS
    assert whole.outcome == ("success" if whole.reason is None else "failure")
    reads = split(data, data[:8])
    assert signature(judge(reads)) == signature(whole)
    assert signature(without_orjson(judge, [data])) == signature(whole)
    body = judge([data], streaming=False)
    assert signature(without_orjson(judge, [data], streaming=False)) == signature(body)
    assert _filtered(reads) == _filtered([data])
    assert _filtered(reads, SMALL_EVENT) == _filtered([data], SMALL_EVENT)
    _check_request(data)
    text = data[:64].decode("latin-1")
    if text.strip():  # a Content-Type decides alone, whatever its case
        assert is_event_stream(text, True) == is_event_stream(text.swapcase(), False)


def check_generated(rng: random.Random) -> None:
    """Structure-aware differential: one grammar stream, two spellings, random reads."""
    stream = grammar.generate(rng)
    reason, visible, usage, done = stream.verdict()
    spec = RequestSpec(stream=True, expected_tokens=stream.expected_tokens)
    results = []
    for _ in range(2):
        body, kept = grammar.render(rng, stream)
        reads = grammar.cuts(rng, body)
        judged = judge if rng.random() < 0.5 else (lambda *a, **k: without_orjson(judge, *a, **k))
        r = judged(reads, spec=spec, max_line=grammar.MAX_LINE, max_event=grammar.MAX_EVENT)
        got = (r.reason, r.visible_chars, (r.prompt_tokens, r.completion_tokens) if r.usage else None, r.done)
        assert got == (reason, visible, usage, done), (got, (reason, visible, usage, done), body[:3000])
        assert _filtered(reads) == kept, body[:3000]
        results.append(r)
    if results[0].ttft_s is not None:
        assert results[0].ttfe_s is not None and results[0].ttfe_s <= results[0].ttft_s
