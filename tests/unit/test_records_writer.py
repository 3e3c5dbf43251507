"""``requests.jsonl`` lines: whole JSON documents, NaN refused, whatever the encoder."""

from __future__ import annotations

import collections
import datetime
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.proxy.records import JsonlWriter

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(1 << 80), max_value=1 << 80),
                     st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                       max_leaves=10)


@settings(max_examples=100, deadline=None)
@given(record=st.dictionaries(st.text(max_size=12), _VALUES, max_size=12))
def test_a_line_reads_back_as_the_record(tmp_path_factory: pytest.TempPathFactory, record: dict) -> None:
    path = tmp_path_factory.mktemp("rec") / "requests.jsonl"
    writer = JsonlWriter(path)
    writer.write(record)
    writer.close()
    data = path.read_bytes()
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    assert json.loads(data) == record  # integers over 64 bits exact, text as UTF-8


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", ["top", "nested dict", "nested list"])
def test_nan_and_infinities_are_refused_and_nothing_is_written(tmp_path: Path, bad: float, where: str) -> None:
    record = {"top": {"ttft_s": bad}, "nested dict": {"a": {"b": bad}}, "nested list": {"a": [1, [2.0, bad]]}}[where]
    writer = JsonlWriter(tmp_path / "requests.jsonl")
    with pytest.raises(ValueError):
        writer.write({"id": "x", **record})
    writer.write({"id": "y"})
    writer.close()
    assert (tmp_path / "requests.jsonl").read_text() == '{"id":"y"}\n'


def test_what_the_standard_library_refuses_is_refused_whatever_the_encoder(tmp_path: Path) -> None:
    """A NaN inside a dict subclass, a datetime: refused as the standard library's encoder refuses
    them (ValueError, TypeError), never written as null or a string."""
    writer = JsonlWriter(tmp_path / "requests.jsonl")
    with pytest.raises(ValueError):
        writer.write({"id": "x", "parts": collections.OrderedDict(ttft_s=math.nan)})
    with pytest.raises(TypeError):
        writer.write({"id": "x", "at": datetime.datetime(2026, 12, 7)})
    writer.close()
    assert (tmp_path / "requests.jsonl").read_text() == ""
