"""Fuzz targets for the measuring core: each raises AssertionError (or any exception) on a finding.

* :func:`check_bytes`: any bytes, as an SSE stream, a non-streaming body, a request body and a
  Content-Type: no exception, a verdict among the failure reasons, the same verdict for every
  split into reads and with or without orjson, and the four properties of issue 19:
  memory held (measured, :func:`sys.getsizeof`) within the bounds after every read, nothing after
  ``[DONE]`` changing the verdict (:func:`check_after_done`), the usage filter's output the same
  for every split and every bound (:func:`check_filter_splits`), the request scan equal to
  ``json.loads`` of the body's bytes (what the engines run).
* :func:`check_generated`: a stream drawn from :mod:`grammar`, re-spelled and re-chunked: the
  verdict, text length and tokens the grammar's oracle expects, and the usage filter's output
  equal to the stream without its usage-only events.
* :func:`check_request_generated`: a valid request body in a random spelling and encoding (BOM,
  UTF-16, UTF-32): the scan reads what ``json.loads`` reads, the spec what the body asks for.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import exporter.core.jsondepth as jsondepth
from exporter.core.analysis import REASONS, RequestSpec, Result, StreamAnalyzer
from exporter.core.content import is_event_stream
from exporter.core.request import MAX_MODEL_CHARS, WANTED, top_level_members
from exporter.core.usage import LINE_COST, UsageEventFilter, inject_usage

from . import grammar

SMALL_LINE, SMALL_EVENT = 64, 256  # tight bounds for raw bytes, so that they are reached
HEADERS = 512  # object headers held beyond the bounds: a few bytes objects, a list, bytearrays


def parser_bound(max_line: int, max_event: int) -> int:
    """Most memory an SSE parser may hold between reads (docs/robustness.md, "Limits"): the line's
    buffer and its slack, the event's data, the slack of its last block (at most 64 KiB), and a
    header per block (at most two per 64 KiB)."""
    block = 64 << 10
    return max_line + max_line // 8 + max_event + min(max_event, block) // 8 + 42 * (2 * max_event // block) + HEADERS


def filter_bound(max_event: int) -> int:
    """Most memory the usage filter may hold between reads."""
    return max_event + max_event // 8 + HEADERS


def judge(reads: list[bytes], *, streaming: bool = True, spec: RequestSpec | None = None,
          max_line: int = SMALL_LINE, max_event: int = SMALL_EVENT) -> Result:
    """Judge reads arriving 10 ms apart, checking the parser's memory after each one."""
    an = StreamAnalyzer(0.0, 200, spec or RequestSpec(), streaming=streaming,
                        max_line_bytes=max_line, max_event_bytes=max_event)
    bound = parser_bound(max_line, max_event)
    for i, read in enumerate(reads):
        an.feed(read, 0.01 * (i + 1))
        parser = an._parser
        if parser is not None:
            assert parser.pending_bytes <= max_line + max_event, parser.pending_bytes
            assert parser.held_bytes() <= bound, (parser.held_bytes(), bound)
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
    out = []
    bound = filter_bound(max_event)
    for r in reads:
        out.append(f.feed(r))
        assert f.held_bytes() <= bound, (f.held_bytes(), bound)
    return b"".join(out) + f.flush()


_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r|\r\n\r|\n\r\n?")


def _held_sizes(data: bytes) -> set[int]:
    """About what the filter holds for each event of ``data``: bounds worth trying."""
    sizes, start = set(), 0
    for m in _EVENT_END.finditer(data):
        event = data[start:m.start() + 2]
        base = len(event) + LINE_COST * (event.count(b"\n") + event.count(b"\r") - event.count(b"\r\n"))
        sizes |= {base + d for d in range(-3, 3)}
        start = m.end()
    return {s for s in sizes if s > 0}


def check_filter_splits(data: bytes, rng: random.Random | None = None) -> None:
    """The usage filter's output does not depend on the reads, at bounds around what the
    stream's events hold (so that an event is held in one split and let through in another):
    splits after every CR (one CRLF split at a time, and all at once) and at random."""
    rng = rng or random.Random(data[-8:])
    n = len(data)
    sizes = sorted(_held_sizes(data))
    bounds = {SMALL_EVENT, rng.randrange(1, n + 200), *rng.sample(sizes, min(len(sizes), 2))}
    after_cr = [i + 1 for i in range(n - 1) if data[i] == 0x0D]
    for bound in bounds:
        whole = _filtered([data], bound)
        cut_sets = [[a] for a in range(1, n)] if n <= 32 else [[a] for a in rng.sample(after_cr, min(8, len(after_cr)))]
        cut_sets += [after_cr] if after_cr else []
        cut_sets += [sorted(rng.sample(range(1, n), min(n - 1, rng.randrange(1, 6)))) for _ in range(3)] if n > 1 else []
        for cut in cut_sets:
            points = [0, *cut, n]
            reads = [data[a:b] for a, b in zip(points, points[1:])]
            assert _filtered(reads, bound) == whole, (bound, cut)


def check_memory(data: bytes) -> None:
    """Memory held stays within the bounds when the events never end: the input's non-blank
    lines repeated to 8 KiB (short lines are what cost most per byte), in random reads."""
    lines = [line for line in data.splitlines() if line] or [b"data:"]
    body = b"\n".join(lines) + b"\n"
    body = body * (8192 // len(body) + 1)
    reads = split(body, data[:8])
    judge(reads)  # asserts the parser's held bytes after every read
    judge(reads, max_line=1 << 10, max_event=4 << 10)
    _filtered(reads, SMALL_EVENT)
    _filtered(reads, 4 << 10)


def check_after_done(data: bytes) -> None:
    """One rule after ``[DONE]``: whatever follows it (here, the same bytes again, or a part of
    them) changes nothing but ``bytes``."""
    judged = data + b"\n\ndata: [DONE]\n\n"  # the blank lines end any line and event before it
    base = judge(split(judged, data[:4]))
    assert base.done, base
    for junk in (data, data[len(data) // 2:], b"data: {broken\n\n", b"\n" * 3):
        r = judge(split(judged + junk, data[-4:]))
        assert signature(r) == signature(base) and r.events == base.events, (junk[:80], r, base)
        assert r.bytes == base.bytes + len(junk)


def _wanted(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k in WANTED}


def _check_request(data: bytes) -> None:
    spec = RequestSpec.from_body(data)
    try:
        doc = json.loads(data)  # bytes, as the engines read a body: UTF-8 (BOM), UTF-16, UTF-32
    except (ValueError, RecursionError):
        doc = None
    if isinstance(doc, dict):  # valid JSON: the scan must equal a full parse
        assert top_level_members(data) == _wanted(doc), data[:200]
        assert spec == expected_spec(doc), (spec, data[:200])
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
    check_filter_splits(data)
    check_after_done(data)
    check_memory(data)
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
    check_filter_splits(body, rng)
    if results[0].ttft_s is not None:
        assert results[0].ttfe_s is not None and results[0].ttfe_s <= results[0].ttft_s


def expected_spec(doc: dict[str, Any]) -> RequestSpec:
    """The spec a parsed request asks for, derived from the document (not from the scan)."""
    def count(key: str) -> int | None:
        value = doc.get(key)
        return value if type(value) is int and value > 0 else None

    model, options = doc.get("model"), doc.get("stream_options")
    fixed = doc.get("ignore_eos") is True
    return RequestSpec(stream=doc.get("stream") is True,
                       expected_tokens=(count("max_completion_tokens") or count("max_tokens")) if fixed else None,
                       model=model if isinstance(model, str) and len(model) <= MAX_MODEL_CHARS else None,
                       wants_usage=isinstance(options, dict) and options.get("include_usage") is True)


_VALUES: list[Any] = [True, False, None, 0, 5, -1, 1 << 64, 2.0, "m", "é\u2028\ud800", [], {}, [1, [2]],
                      {"include_usage": True}, {"include_usage": False, "x": 1}, '"\\q' * 20]
_LARGE: list[Any] = ["x" * 70_000, [{"role": "user", "content": "y" * 900}] * 300, [[[[1]]]] * 2000]
_ENCODINGS = ["utf-8", "utf-8", "utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le",
              "utf-32-be"]


def check_request_generated(rng: random.Random) -> None:
    """A valid body in a random spelling and encoding: scan == ``json.loads`` of the bytes."""
    keys = [*sorted(WANTED), "messages", "prompt", "tools", "temperature"]
    doc: dict[str, Any] = {}
    for _ in range(rng.randrange(0, 12)):
        key = rng.choice(keys)
        if key not in WANTED and rng.random() < 0.3:  # a wanted value over 64 KiB would be ignored
            doc[key] = rng.choice(_LARGE)
        else:
            doc[key] = rng.choice(_VALUES) if rng.random() < 0.8 else [rng.choice(_VALUES)] * rng.randrange(30)
    text = json.dumps(doc, ensure_ascii=rng.random() < 0.3, indent=rng.choice([None, None, 0, 2]),
                      separators=rng.choice([None, (",", ":"), (" , ", " : ")]))
    text = rng.choice(["", " ", "\n\t", "\r\n "]) + text + rng.choice(["", " ", "\n"])
    body = text.encode(rng.choice(_ENCODINGS), "surrogatepass")  # json.loads takes lone surrogates
    assert json.loads(body) == doc
    assert top_level_members(body) == _wanted(doc), body[:200]
    assert RequestSpec.from_body(body) == expected_spec(doc), body[:200]
