"""The fuzz campaign of tests/fuzz/, bounded to a few seconds for CI.

The long campaign: ``python tests/fuzz/run.py --seconds 3600`` (see tests/fuzz/README.md).
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz import grammar, targets
from tests.transcripts import CASES, FINDINGS

_SEEDS = [c.body for c in CASES] + [f.body[:4096] for f in FINDINGS]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_grammar_streams_get_the_oracles_verdict(seed: int) -> None:
    """Both engines' formats, re-spelled and re-chunked: verdict, text length, tokens invariant."""
    targets.check_generated(random.Random(seed))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(_SEEDS), edits=st.lists(
    st.tuples(st.integers(min_value=0, max_value=1 << 16), st.sampled_from([b"", b"\n", b"\r", b"\r\n", b":",
                                                                             b"data:", b"[DONE]", b"{", b"\xff"])),
    max_size=6))
def test_mutated_transcripts_keep_every_invariant(base: bytes, edits: list[tuple[int, bytes]]) -> None:
    data = bytearray(base)
    for pos, token in edits:
        pos %= len(data) + 1
        data[pos:pos + (1 if not token else 0)] = token
    targets.check_bytes(bytes(data))


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=600))
def test_any_bytes_keep_every_invariant(data: bytes) -> None:
    targets.check_bytes(data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_generated_request_bodies_read_as_json_loads_reads_them(seed: int) -> None:
    """Valid bodies in random spellings and encodings (BOM, UTF-16, UTF-32): scan == json.loads."""
    targets.check_request_generated(random.Random(seed))


def test_the_oracle_is_not_trivial() -> None:
    """The grammar yields every verdict, so the differential can tell them apart."""
    rng = random.Random(7)
    reasons = {grammar.generate(rng).verdict()[0] for _ in range(400)}
    assert reasons == {None, "sse_error", "malformed", "missing_done", "empty_text", "missing_usage",
                       "length_mismatch"}
