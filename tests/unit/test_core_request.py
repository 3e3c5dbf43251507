"""RequestSpec.from_body: a top-level scan that must read what a full parse reads."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import exporter.core.jsondepth as jsondepth
from exporter.core.request import MAX_MODEL_CHARS, WANTED, RequestSpec, top_level_members

_TRICKY = st.text(alphabet=st.sampled_from(list('ab"\\{}[]:, \n\t\u00e9\U0001f600/')), max_size=30)
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


@settings(max_examples=100, deadline=None)
@given(doc=st.dictionaries(_KEYS, _VALUES, max_size=8), style=st.integers(0, 3))
def test_scan_equals_full_parse(doc: dict, style: int) -> None:
    body = _spelled(doc, style)
    assert top_level_members(body) == {k: v for k, v in json.loads(body).items() if k in WANTED}


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
    assert isinstance(RequestSpec.from_body(body), RequestSpec)


def test_big_integers_the_same_with_and_without_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    body = b'{"ignore_eos":true,"max_tokens":18446744073709551616,"stream":true,"x":' + b"[" * 600 + b"]" * 600 + b"}"
    fast = RequestSpec.from_body(body)
    monkeypatch.setattr(jsondepth, "_orjson", None)
    assert RequestSpec.from_body(body) == fast == RequestSpec(stream=True, expected_tokens=1 << 64)


def test_large_body_is_scanned_not_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long prompt is skipped by the scan: no full parse of the body happens."""
    calls: list[int] = []
    real = jsondepth.loads_exact

    def counting(data: bytes, *a: object) -> object:
        calls.append(len(data))
        return real(data, *a)

    monkeypatch.setattr("exporter.core.request.loads_exact", counting)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": 'x"\\' * 40_000}] * 20,
                       "stream": True}).encode()
    assert RequestSpec.from_body(body) == RequestSpec(stream=True, model="m")
    assert max(calls) < 100


@pytest.mark.parametrize("seed", range(6))
def test_long_strings_with_escapes_across_scan_windows(seed: int) -> None:
    """Strings full of quotes and backslashes, longer than the scan's first windows (and one
    past the point where the scan hands over to a full parse): the same fields."""
    import random

    rng = random.Random(seed)
    size = [5000, 17_000, 70_000, 300_000][seed % 4]
    text = "".join(rng.choice('ab"\\\\\n{') for _ in range(size))
    doc = {"prompt": text, "stream": True, "model": text[:10], "max_tokens": 5, "ignore_eos": True,
           "messages": [{"content": text[:3000]}, text[-4097:]]}
    body = json.dumps(doc).encode()
    assert top_level_members(body) == {k: v for k, v in doc.items() if k in WANTED}
    assert RequestSpec.from_body(body) == RequestSpec(stream=True, expected_tokens=5, model=text[:10])
