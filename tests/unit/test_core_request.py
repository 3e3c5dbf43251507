"""RequestSpec.from_body: a top-level scan that must read what a full parse reads.

Every path of the scan (strings read in chunks, containers summed and halved, jumps between
possible wanted keys) is also run with its thresholds made tiny (``TUNINGS``), so that small
documents take the paths large bodies take.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import accumulate
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.core import jsondepth, members, request
from exporter.core.jsondepth import low_point, nesting_depth_exceeds
from exporter.core.request import MAX_MODEL_CHARS, WANTED, RequestSpec, scanned_members, top_level_members

TUNINGS: dict[str, dict[str, int]] = {
    "default": {},
    "tiny": {"_BATCH": 1, "_MIN_TOKEN_BYTES": 1 << 40, "_CHUNK": 37, "_EXACT": 5, "_QUOTE_SCANS": 0, "_PIECE": 3,
             "MAX_MEMBERS": 1, "_JUMP_MEMBERS": 1, "_JUMP_BACK": 130, "_NEAR": 2},
    "one byte": {"_BATCH": 3, "_MIN_TOKEN_BYTES": 1 << 40, "_CHUNK": 1, "_EXACT": 1, "_QUOTE_SCANS": 1,
                 "_PIECE": 1, "MAX_MEMBERS": 2, "_JUMP_MEMBERS": 2, "_JUMPS": 1, "_NEAR": 1},
}


@contextmanager
def tuned(name: str) -> Iterator[None]:
    saved = {k: getattr(members, k) for k in TUNINGS[name]}
    for k, v in TUNINGS[name].items():
        setattr(members, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(members, k, v)


_RUNS = st.builds(lambda k, tail: "\\" * k + tail, st.integers(0, 80), st.sampled_from(['"', "", "a", "[", "}"]))
_TRICKY = st.one_of(st.text(alphabet=st.sampled_from(list('ab"\\{}[]:, \n\t\u00e9\U0001f600/')), max_size=30),
                    st.lists(_RUNS, max_size=4).map("".join))
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(1 << 80), max_value=1 << 80),
                     st.floats(allow_nan=False, allow_infinity=False), _TRICKY)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(_TRICKY, inner, max_size=4)), max_leaves=12)
_KEYS = st.one_of(st.sampled_from(sorted(WANTED)), _TRICKY)


def _spelled(doc: dict, style: int) -> bytes:
    if style == 0:
        return json.dumps(doc, separators=(",", ":")).encode()
    if style == 1:
        return json.dumps(doc, ensure_ascii=False).encode()
    return (" \n" + json.dumps(doc, indent=style - 1) + "\r\n").encode()


@pytest.mark.parametrize("tuning", TUNINGS)
@settings(max_examples=50, deadline=None)
@given(doc=st.dictionaries(_KEYS, _VALUES, max_size=8), style=st.integers(0, 3))
def test_scan_equals_full_parse(tuning: str, doc: dict, style: int) -> None:
    """The scan, and the whole parse that small bodies get, both read what ``json.loads`` reads."""
    body = _spelled(doc, style)
    expected = {k: v for k, v in json.loads(body).items() if k in WANTED}
    with tuned(tuning):
        assert scanned_members(body) == expected
        assert top_level_members(body) == expected


@pytest.mark.parametrize("tuning", TUNINGS)
@settings(max_examples=30, deadline=None)
@given(doc=st.dictionaries(_KEYS, _VALUES, max_size=8), cuts=st.lists(st.integers(0, 1 << 16), max_size=3),
       bytes_in=st.lists(st.sampled_from(list(b'[]{}"\\,:a ')), min_size=3, max_size=3))
def test_broken_bodies_never_raise(tuning: str, doc: dict, cuts: list[int], bytes_in: list[int]) -> None:
    body = bytearray(_spelled(doc, 0))
    for cut, b in zip(cuts, bytes_in):
        body[cut % len(body)] = b
    with tuned(tuning):
        for broken in (bytes(body), bytes(body[:cuts[0] % len(body)] if cuts else body[:-1])):
            for got in (top_level_members(broken), scanned_members(broken)):
                assert got is None or set(got) <= WANTED
            assert isinstance(RequestSpec.from_body(broken), RequestSpec)


def test_duplicate_keys_last_wins_like_json_loads() -> None:
    body = b'{"stream":false,"stream_options":{"include_usage":true},"stream":true,"stream_options":null}'
    assert RequestSpec.from_body(body) == RequestSpec(stream=True, wants_usage=False)


def test_fields() -> None:
    body = (b'{"model":"llama","prompt":"a \\"quoted\\" \\\\ prompt","stream":true,"ignore_eos":true,'
            b'"max_tokens":64,"stream_options":{"include_usage":true,"continuous_usage_stats":false}}')
    assert RequestSpec.from_body(body) == RequestSpec(stream=True, expected_tokens=64, model="llama", wants_usage=True)
    assert RequestSpec.from_body(b'{"model":7,"stream":true}').model is None
    assert RequestSpec.from_body(json.dumps({"model": "m" * (MAX_MODEL_CHARS + 1)}).encode()).model is None
    assert RequestSpec.from_body(b'{"stream_options":{"include_usage":1}}').wants_usage is False
    assert RequestSpec.from_body(b'{"str\\u0065am":true}').stream is True  # an escaped key is the same key


@pytest.mark.parametrize("body", [b"", b"\xff", b"[1]", b"{", b'{"stream":tru', b'{"a":"\\"}', b"{}", b"null",
                                  b'{"stream":true} trailing', b'{"x":' + b"[" * 60_000])
def test_garbage_gives_a_spec(body: bytes) -> None:
    """What json.loads cannot read gives the default spec (a stream, as the engines default);
    ``{}`` is read: no ``stream``, so none."""
    assert RequestSpec.from_body(body) == (RequestSpec(stream=False) if body == b"{}" else RequestSpec())


def test_big_integers_the_same_with_and_without_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    body = b'{"ignore_eos":true,"max_tokens":18446744073709551616,"stream":true,"x":' + b"[" * 600 + b"]" * 600 + b"}"
    fast = RequestSpec.from_body(body)
    monkeypatch.setattr(jsondepth, "_orjson", None)
    assert RequestSpec.from_body(body) == fast == RequestSpec(stream=True, expected_tokens=1 << 64)


def test_small_body_is_parsed_whole_unless_orjson_could_misread_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A small valid body is one orjson parse, not a scan; a wanted integer over 64 bits (orjson
    reads a float), NaN or a lone surrogate (orjson refuses them) go to the scan, which reads
    them as json.loads does."""
    scans: list[bytes] = []
    real = request.scanned_members

    def counting(body: bytes, skip: frozenset[str] = frozenset()) -> object:
        scans.append(body)
        return real(body, skip)

    monkeypatch.setattr(request, "scanned_members", counting)
    small = b'{"model":"m","prompt":"hi","stream":true,"max_tokens":8,"temperature":0.5}'
    assert RequestSpec.from_body(small) == RequestSpec(stream=True, model="m")
    assert scans == []
    for body, spec in [
        (b'{"ignore_eos":true,"max_tokens":18446744073709551616,"stream":true}',
         RequestSpec(stream=True, expected_tokens=1 << 64)),
        (b'{"stream":true,"temperature":NaN,"model":"m"}', RequestSpec(stream=True, model="m")),
        (b'{"stream":true,"model":"\\ud800"}', RequestSpec(stream=True, model="\ud800")),
    ]:
        assert RequestSpec.from_body(body) == spec
        assert scans[-1] == body


def test_members_nested_to_the_depth_bound_are_read_without_error() -> None:
    """A wanted member nested 500 deep (under the 512 bound): read, never a RecursionError."""
    body = b'{"stream":true,"stream_options":' + b"[" * 500 + b"]" * 500 + b"}"
    assert RequestSpec.from_body(body) == RequestSpec(stream=True)
    floats = b'{"stream":true,"stream_options":' + b"[" * 500 + b"1.5" + b"]" * 500 + b"}"
    assert RequestSpec.from_body(floats) == RequestSpec(stream=True)  # the scan's reading


def test_large_body_is_scanned_not_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long prompt is skipped by the scan: no full parse of the body happens."""
    calls: list[int] = []
    real = jsondepth.loads_exact

    def counting(data: bytes, *a: Any, **kw: Any) -> object:
        calls.append(len(data))
        return real(data, *a, **kw)

    monkeypatch.setattr("exporter.core.members.loads_exact", counting)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": 'x"\\' * 40_000}] * 20,
                       "stream": True}).encode()
    assert RequestSpec.from_body(body) == RequestSpec(stream=True, model="m")
    assert max(calls) < 100


def _both(body: bytes) -> dict[str, Any] | None:
    """The scan's reading (these bodies are for the scan, whatever their size), held equal to
    what the proxy reads (the whole parse below 64 KiB)."""
    scanned = scanned_members(body)
    assert top_level_members(body) == scanned
    return scanned


@pytest.mark.parametrize("seed", range(6))
def test_long_strings_with_escapes_across_scan_windows(seed: int) -> None:
    """Strings full of quotes and backslashes, longer than the scan's first chunks (and than
    a whole counted chunk): the same fields."""
    rng = random.Random(seed)
    size = [5000, 17_000, 70_000, 300_000][seed % 4]
    text = "".join(rng.choice('ab"\\\\\n{') for _ in range(size))
    doc = {"prompt": text, "stream": True, "model": text[:10], "max_tokens": 5, "ignore_eos": True,
           "messages": [{"content": text[:3000]}, text[-4097:]]}
    body = json.dumps(doc).encode()
    assert _both(body) == {k: v for k, v in doc.items() if k in WANTED}
    assert RequestSpec.from_body(body) == RequestSpec(stream=True, expected_tokens=5, model=text[:10])


@pytest.mark.parametrize("tuning", TUNINGS)
@pytest.mark.parametrize("run", [1, 2, 63, 64, 65, 200, 201, 5000])
def test_long_runs_of_backslashes(tuning: str, run: int) -> None:
    """A quote after a run of backslashes ends the string when the run is even, wherever the
    run starts (within the last 64 bytes, or before: then it is found with translate)."""
    text = "x" * (run % 7) + "\\" * (run // 2) + ('"' if run % 2 else "") + "y\\"
    doc = {"prompt": text, "stream": True, "x": [text, {text: text}], "max_tokens": 9}
    with tuned(tuning):
        assert _both(json.dumps(doc).encode()) == {"stream": True, "max_tokens": 9}


def _tools(count: int, rng: random.Random) -> list[object]:
    """Short tokens with brackets, quotes and escapes inside strings: a container to be summed."""
    odd = ['a"[{', "}]\\", '\\"', "[[", "\u00e9]", ""]
    return [{"type": "function", "function": {"name": rng.choice(odd) * rng.randint(0, 3),
                                              "parameters": {"properties": [rng.choice(odd), [[]], {}]}}}
            for _ in range(count)]


@pytest.mark.parametrize("seed", range(4))
def test_wide_containers_are_summed_exactly(seed: int) -> None:
    """Thousands of short tokens: the walk hands over to chunk sums and halving, and reads
    the members after the container the same way a full parse does."""
    rng = random.Random(seed)
    doc = {"model": "m", "tools": _tools(3000, rng), "stream": True, "messages": [[_tools(300, rng)]] * 3,
           "ignore_eos": True, "max_tokens": 7}
    body = json.dumps(doc, ensure_ascii=bool(seed % 2)).encode()
    assert _both(body) == {k: v for k, v in doc.items() if k in WANTED}


@pytest.mark.parametrize("tuning", ["default", "tiny"])
def test_many_top_level_members_jump_to_wanted_keys(tuning: str) -> None:
    """Past MAX_MEMBERS members the scan jumps to where a wanted key could be spelled: raw,
    escaped (\\u0073tream), as a nested key or a string value (decoys), last one winning."""
    members = [f'"k{i}":[{i},"x"]' for i in range(2500)]
    members[1500] = '"model":"first"'
    members[1700] = '"x":{"stream":false,"model":"nested"}'
    members[1800] = '"y":"model"'
    members[2000] = '"\\u0073tream":true'
    members[2100] = '"max_tokens":5'
    members[2400] = '"model":"last"'
    body = ("{" + ",".join(members) + "}").encode()
    with tuned(tuning):
        assert _both(body) == {"model": "last", "stream": True, "max_tokens": 5}
        assert _both(b"{" + b'"a":1,' * 3000 + b'"b":2}') == {}


def test_too_many_places_to_jump_parse_the_body_whole() -> None:
    body = ("{" + ",".join(f'"model{i}":"model"' for i in range(1500)) + ',"stream":true}').encode()
    assert _both(body) == {"stream": True}
    with tuned("one byte"):
        assert _both(body) == {"stream": True}


def _reference_depth(data: bytes) -> int:
    depth = deepest = 0
    inside = escaped = False
    for c in data:
        if inside:
            escaped, inside = (False, True) if escaped else (c == 0x5C, c != 0x22)
        elif c == 0x22:
            inside = True
        elif c in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in b"]}":
            depth -= 1
    return deepest


@pytest.mark.parametrize("seed", range(3))
def test_depth_check_and_low_point_match_a_byte_by_byte_walk(seed: int) -> None:
    rng = random.Random(seed)
    doc: object = _tools(50, rng)
    for _ in range(rng.randint(3, 40)):
        doc = [doc, rng.choice(['"[', "\\", "{"])] if rng.random() < 0.5 else {"[\"": doc}
    body = json.dumps(doc).encode()
    for limit in (1, 5, _reference_depth(body) - 1, _reference_depth(body)):
        assert nesting_depth_exceeds(body, limit) == (_reference_depth(body) > limit)
    for length in (0, 1, 10, 50_000):  # long enough for the block-removal rounds
        brackets = bytes(rng.choice(b"[]") for _ in range(length))
        steps = list(accumulate(1 if c == 0x5B else -1 for c in brackets))
        assert low_point(brackets) == (steps[-1] if steps else 0, min([0, *steps]))


def test_token_ids_and_long_gaps_without_marks() -> None:
    """Long stretches without quotes or brackets (token ids, whitespace) are crossed by find."""
    ids = list(range(20_000))
    doc = {"prompt": ids, "x": [ids, " " * 5000, [[ids]]], "stream": True, "max_tokens": 3}
    body = json.dumps(doc, indent=1).encode()
    assert top_level_members(body) == {"stream": True, "max_tokens": 3}
