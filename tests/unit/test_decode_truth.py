"""SPEC 30: every gap, every channel, fed to the analyzer as stamped reads with exact values."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from exporter.core.analysis import RequestSpec, Result, StreamAnalyzer
from exporter.core.decode import DECODE_FIELDS, Gaps, channel_mask, spec_counts
from exporter.core.stats import percentile, weighted_percentile


def _ev(doc: dict[str, Any] | str) -> bytes:
    data = doc if isinstance(doc, str) else json.dumps(doc, separators=(",", ":"))
    return b"data: " + data.encode() + b"\n\n"


def _text(t: str, ids: list[int] | None = None, usage: tuple[int, int] | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "text": t, "finish_reason": None}
    if ids is not None:
        choice["token_ids"] = ids
    doc: dict[str, Any] = {"id": "cmpl-1", "choices": [choice]}
    if usage is not None:
        doc["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1]}
    return doc


def _delta(**delta: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


def _usage(p: int, c: int, **extra: Any) -> dict[str, Any]:
    return {"id": "cmpl-1", "choices": [], "usage": {"prompt_tokens": p, "completion_tokens": c}, **extra}


def _run(reads: list[tuple[float, list[dict[str, Any] | str]]], *, t0: float = 100.0, stall_s: float = 0.5,
         expected: int | None = None) -> Result:
    """Each read: (seconds after t0, the events it held), fed as one ``feed`` call."""
    an = StreamAnalyzer(t0, 200, RequestSpec(expected_tokens=expected), streaming=True, stall_s=stall_s)
    end = t0
    for at, events in reads:
        end = t0 + at
        an.feed(b"".join(_ev(e) for e in events), end)
    return an.finish(end)


def _per_token(r: Result) -> list[float]:
    """Every token's gap, ascending (from the result's sorted gaps and their token counts)."""
    return [] if r.itl_gaps is None else [g for g, n in r.itl_gaps.pairs() for _ in range(n)]


def _worked_example(tokens: list[dict[str, Any]]) -> list[tuple[float, list[dict[str, Any] | str]]]:
    """SPEC 30's arrivals: 0 ms, 20 ms (1 token), 40 ms (3 tokens, here in 2 events), 740 ms (1 token)."""
    a, b, c1, c2, d = tokens
    return [(0.000, [a]), (0.020, [b]), (0.040, [c1, c2]), (0.740, [d]), (0.741, [_usage(7, 6), "[DONE]"])]


def test_worked_example_with_token_ids() -> None:
    r = _run(_worked_example([_text("a", [1]), _text("b", [2]), _text("c", [3, 4]), _text("d", [5]),
                              _text("e", [6])]))
    assert r.ok
    gaps = _per_token(r)
    assert gaps == pytest.approx([0.02 / 3] * 3 + [0.02, 0.7])
    assert r.itl_p50_s == pytest.approx(0.02 / 3)
    assert r.itl_max_s == pytest.approx(0.7)
    assert r.itl_p95_s == pytest.approx(percentile(gaps, 95))
    assert r.itl_p99_s == pytest.approx(percentile(gaps, 99))
    assert r.decode_stalls == 1
    assert r.text_events == 5 and r.merged_reads == 1
    assert r.tokens_per_event == pytest.approx(6 / 5)
    assert r.ttst_s == pytest.approx(0.020)


def test_worked_example_from_usage_per_chunk() -> None:
    r = _run(_worked_example([_text("a", usage=(7, 1)), _text("b", usage=(7, 2)), _text("c", usage=(7, 4)),
                              _text("c", usage=(7, 5)), _text("d", usage=(7, 6))]))
    assert _per_token(r) == pytest.approx([0.02 / 3] * 3 + [0.02, 0.7])


def test_spread_evenly_when_only_the_final_usage_counts() -> None:
    # 4 text events, completion_tokens 8: two tokens each; arrivals 0, 0.1, 0.3 (two events)
    reads: list[tuple[float, list[dict[str, Any] | str]]] = [
        (0.0, [_text("a")]), (0.1, [_text("b")]), (0.3, [_text("c"), _text("d")]),
        (0.31, [_usage(3, 8), "[DONE]"])]
    r = _run(reads)
    assert _per_token(r) == pytest.approx([0.05] * 6)  # 0.1 s over 2 tokens, 0.2 s over 4
    assert r.itl_max_s == pytest.approx(0.05) and r.decode_stalls == 0
    assert r.tokens_per_event == 2.0


def test_stall_threshold_is_the_raw_gap_and_configurable() -> None:
    reads: list[tuple[float, list[dict[str, Any] | str]]] = [
        (0.0, [_text("a")]), (0.3, [_text("b")]), (1.0, [_text("c")]), (1.1, [_usage(3, 3), "[DONE]"])]
    assert _run(reads).decode_stalls == 1  # 0.7 s > 0.5 s; 0.3 s is not
    assert _run(reads, stall_s=0.2).decode_stalls == 2
    assert _run(reads, stall_s=1.0).decode_stalls == 0


def test_token_ids_beat_usage_and_an_event_without_ids_falls_back() -> None:
    # ids say 1+3 tokens; usage per chunk would say 1+1: ids win
    reads: list[tuple[float, list[dict[str, Any] | str]]] = [
        (0.0, [_text("a", [1], (2, 1))]), (0.3, [_text("b", [2, 3, 4], (2, 2))]), (0.4, ["[DONE]"])]
    assert _per_token(_run(reads)) == pytest.approx([0.1] * 3)
    # one event without ids: usage per chunk covers every event
    reads[1] = (0.3, [_text("b", None, (2, 2))])
    assert _per_token(_run(reads)) == pytest.approx([0.3])


def test_one_arrival_gives_no_gap_fields_but_channels() -> None:
    r = _run([(0.05, [_delta(reasoning="think"), _delta(content="hi")]), (0.06, [_usage(1, 2), "[DONE]"])])
    assert r.ok
    for name in ("itl_p50_s", "itl_p95_s", "itl_p99_s", "itl_max_s", "text_events", "tokens_per_event",
                 "decode_stalls", "merged_reads"):
        assert getattr(r, name) is None, name
    assert r.itl_gaps is None
    assert r.ttst_s == pytest.approx(0.05)  # the second text event came in the same read
    assert r.ttfo_s == pytest.approx(0.05) and r.reasoning_s == 0.0


def test_channels_of_a_reasoning_tool_calling_chat() -> None:
    reads: list[tuple[float, list[dict[str, Any] | str]]] = [
        (0.01, [_delta(role="assistant", content="")]),
        (0.10, [_delta(reasoning_content="Let", content=None)]),
        (0.20, [_delta(reasoning_content=" me", content=None)]),
        (0.45, [_delta(reasoning="think")]),
        (0.60, [_delta(content="Answer")]),
        (0.70, [_delta(tool_calls=[{"index": 0, "function": {"name": "f", "arguments": ""}}])]),
        (0.80, [_delta(tool_calls=[{"index": 0, "function": {"arguments": "{}"}}])]),
        (0.90, [_usage(4, 6, reasoning_tokens=3), "[DONE]"]),
    ]
    r = _run(reads)
    assert r.ok
    assert r.ttft_s == pytest.approx(0.10)  # section 3: reasoning is visible text
    assert r.ttfo_s == pytest.approx(0.60)
    assert r.reasoning_s == pytest.approx(0.35)
    assert r.reasoning_tokens == 3  # SGLang's, beside the usage
    assert r.ttftc_s == pytest.approx(0.70)
    assert r.ttst_s == pytest.approx(0.20)


def test_reasoning_tokens_from_completion_tokens_details() -> None:
    usage = {"id": "x", "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2,
                                                 "completion_tokens_details": {"reasoning_tokens": 1}}}
    r = _run([(0.1, [_delta(reasoning="a")]), (0.2, [_delta(content="b")]), (0.3, [usage, "[DONE]"])])
    assert (r.reasoning_tokens, r.ttfo_s) == (1, pytest.approx(0.2))


def test_completions_and_answerless_chat_have_no_ttfo() -> None:
    r = _run([(0.1, [_text("a")]), (0.2, [_text("b")]), (0.3, [_usage(1, 2), "[DONE]"])])
    assert r.ok and r.ttfo_s is None and r.reasoning_s is None and r.ttftc_s is None and r.reasoning_tokens is None
    r = _run([(0.1, [_delta(reasoning="a")]), (0.2, [_delta(reasoning="b")]), (0.3, [_usage(1, 2), "[DONE]"])])
    assert r.ok and r.ttfo_s is None and r.reasoning_s == pytest.approx(0.1)


def test_ttft_and_tpot_unchanged_by_decode_fields() -> None:
    r = _run(_worked_example([_text("a", [1]), _text("b", [2]), _text("c", [3, 4]), _text("d", [5]),
                              _text("e", [6])]))
    assert r.ttft_s == pytest.approx(0.0)
    assert r.tpot_s == pytest.approx(0.740 / (6 - 1))
    assert r.e2e_s == pytest.approx(0.741)


def test_vllm_spec_decode_counts_on_the_final_usage_chunk() -> None:
    metrics = {"queue_time_ms": 1.0, "speculative_decoding": {"num_spec_steps": 4, "num_draft_tokens": 12,
                                                              "num_accepted_draft_tokens": 9}}
    r = _run([(0.1, [_text("a")]), (0.2, [_text("b")]), (0.3, [_usage(1, 2, metrics=metrics), "[DONE]"])])
    assert (r.spec_draft_tokens, r.spec_accepted_tokens) == (12, 9)


def test_sglang_spec_tokens_details_chunk() -> None:
    ext = {"id": "a", "choices": [], "usage": None,
           "sglext": {"spec_tokens_details": {"spec_num_proposed_drafts": 10, "spec_num_correct_drafts": 4,
                                              "spec_verify_ct": 3}}}
    r = _run([(0.1, [_text("a")]), (0.2, [_text("b")]), (0.3, [ext, _usage(1, 2), "[DONE]"])])
    assert (r.spec_draft_tokens, r.spec_accepted_tokens) == (10, 4)


def test_sglang_spec_details_of_several_choices_add_up() -> None:
    one = {"spec_num_proposed_drafts": 10, "spec_num_correct_drafts": 4}
    two = {"spec_num_proposed_drafts": 6, "spec_num_correct_drafts": 6}
    assert spec_counts({"sglext": {"spec_tokens_details": [one, two]}}) == (16, 10)
    assert spec_counts({"sglext": {"spec_tokens_details": [one, {"spec_num_proposed_drafts": 1}]}}) is None
    assert spec_counts({"sglext": {"spec_tokens_details": []}}) is None


@pytest.mark.parametrize("doc", [
    {"metrics": {"speculative_decoding": {"num_draft_tokens": 3, "num_accepted_draft_tokens": 4}}},
    {"metrics": {"speculative_decoding": {"num_draft_tokens": "3", "num_accepted_draft_tokens": 1}}},
    {"sglext": {"spec_tokens_details": {"spec_num_proposed_drafts": -1, "spec_num_correct_drafts": 0}}},
    {"sglext": []}, {"metrics": None}, {},
])
def test_spec_counts_refuses_what_is_not_a_count(doc: dict[str, Any]) -> None:
    assert spec_counts(doc) is None


def test_channel_mask_reads_only_chat_deltas() -> None:
    assert channel_mask([{"text": "a"}]) == 0
    assert channel_mask([{"delta": {"content": [{"type": "text", "text": "x"}]}}]) == 1
    assert channel_mask([{"delta": {"content": "", "reasoning_content": "r"}}]) == 2
    assert channel_mask([{"delta": {"tool_calls": [{"function": {"name": "f"}}]}}]) == 4
    assert channel_mask(["junk", {"delta": None}]) == 0


def test_failed_stream_keeps_its_gaps_in_the_record() -> None:
    r = _run([(0.0, [_text("a")]), (0.1, [_text("b")]), (0.2, [_usage(1, 2)])])  # no [DONE]
    assert r.reason == "missing_done"
    assert r.itl_max_s == pytest.approx(0.1) and r.text_events == 2


def test_record_dict_has_every_decode_field_and_no_gap_list() -> None:
    d = _run([(0.0, [_text("a")]), (0.1, [_text("b")]), (0.2, [_usage(1, 2), "[DONE]"])]).as_dict()
    assert set(DECODE_FIELDS) <= set(d)
    assert "itl_gaps" not in d
    json.dumps(d, allow_nan=False)


@pytest.mark.parametrize("seed", range(30))
def test_weighted_percentile_equals_the_expanded_list(seed: int) -> None:
    rng = random.Random(seed)
    pairs = [(rng.choice([0.001, 0.002, rng.random()]), rng.randint(0, 5)) for _ in range(rng.randint(1, 12))]
    expanded = [v for v, w in pairs for _ in range(w)]
    for q in (0, 1, 37.5, 50, 95, 99, 100):
        got = weighted_percentile(pairs, q)
        want = percentile(expanded, q)
        assert (got is None and want is None) or got == pytest.approx(want), (pairs, q)


def test_weighted_percentile_refuses_out_of_range() -> None:
    with pytest.raises(ValueError):
        weighted_percentile([(1.0, 1)], 101)


@pytest.mark.parametrize("seed", range(20))
def test_gaps_hold_every_token_gap_in_order(seed: int) -> None:
    rng = random.Random(seed)
    tokens = [rng.choice([0, 1, 1, 3]) if seed % 2 else 1 for _ in range(rng.randint(1, 30))]
    raw = [rng.random() for _ in tokens]
    expanded = sorted(g / n for g, n in zip(raw, tokens) for _ in range(n))
    gaps = Gaps.of(raw, tokens)
    if not expanded:
        assert gaps is None
        return
    assert gaps is not None
    assert [g for g, n in gaps.pairs() for _ in range(n)] == pytest.approx(expanded)
    assert gaps.count == len(expanded) and gaps.total == pytest.approx(sum(expanded))
    for q in (0, 50, 95, 99, 100):
        assert gaps.percentile(q) == pytest.approx(percentile(expanded, q))
    for bound in (0.0, 0.1, 0.5, 2.0):
        assert gaps.count_le(bound) == len([g for g in expanded if g <= bound])


def test_usage_counts_of_any_size_are_read_not_raised() -> None:
    huge = 1 << 100
    r = _run([(0.0, [_text("a", usage=(1, huge))]), (0.1, [_text("b", usage=(1, huge + 2))]),
              (0.2, [_usage(1, huge + 2), "[DONE]"])])
    assert r.text_events == 2 and _per_token(r) == pytest.approx([0.05, 0.05])
    json.dumps(r.as_dict(), allow_nan=False)
