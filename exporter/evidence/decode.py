"""``evidence decode``: re-read raw SSE captures offline and judge them again.

The same core as the proxy (:mod:`exporter.core.analysis`) replays the captured reads at their
recorded arrival offsets, so TTFT, TPOT and the verdict come out as the proxy saw them.
A corrupt or truncated capture gets a verdict of its own, never a traceback.

Below that, the decode tables of ``evidence summarize`` and the report: per round, the
distribution of the gaps between visible-text arrivals, TTFT beside TTFO, and speculative
decoding's acceptance; and the pooling table: embeddings and rerank rounds apart from the
generations.  Every figure is over a round's successful requests, and each is named for what it
is: the ITL columns are medians over requests of each request's own percentile
(``itl_p95_med_s``: the median request's P95 gap), not a pooled percentile of every gap;
``itl_max_s`` is the largest gap of any request; ``tokens_per_event_mean`` the mean over requests;
``decode_stalls`` the sum.  TTFT and TTFO are percentiles over requests, TTFO over those that carry
answer text.  The spec acceptance is pooled: the round's accepted draft tokens over its drafted ones.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from exporter.core.analysis import RequestSpec, analyze_bytes
from exporter.core.endpoints import POOLING, endpoint_of
from exporter.core.stats import median, percentile
from exporter.core.tokenids import output_text, output_token_ids
from exporter.proxy.records import read_capture

from .tokens import detokenize, explain, summary_line

__all__ = ["decode_capture", "format_row", "DECODE_KEYS", "DECODE_NOTE", "POOLING_NOTE", "is_pooling", "route_of",
           "decode_row", "decode_rounds", "decode_cells", "pooling_rounds", "split_routes"]


def _record_sha(capture_json: Path, capture_id: str) -> str | None:
    """The SHA-256 the proxy wrote in requests.jsonl for this capture, when that file is beside it."""
    records = capture_json.parent.parent / "requests.jsonl"
    if not records.exists():
        return None
    with open(records, encoding="utf-8") as fh:
        for line in fh:
            if capture_id in line:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("id") == capture_id:
                    return rec.get("capture_sha256")
    return None


def decode_capture(path: Path, vocabulary: tuple[Any, set[int]] | None = None) -> dict[str, Any]:
    """Judge one capture; the result always has ``verdict`` and ``ok`` keys.  With the model's
    ``vocabulary`` (:func:`exporter.evidence.tokens.load_vocabulary`), also ``tokens``: the
    output token ids the engine sent, named (None when the capture holds none)."""
    result = _decode(path)
    if vocabulary is not None and result["verdict"] != "unreadable":
        _, body = read_capture(path)
        streaming = bool(result.get("streaming", True))
        ids = output_token_ids(body, streaming)
        result["tokens"] = None if ids is None else explain(ids, *vocabulary)
        if ids is not None:
            text, visible = detokenize(ids, *vocabulary)[0], output_text(body, streaming)
            result.update(text=text, visible_text=visible, text_matches=text == visible)
    return result


def _decode(path: Path) -> dict[str, Any]:
    try:
        meta, body = read_capture(path)
    except ValueError as exc:
        return {"capture": str(path), "verdict": "unreadable", "reason": str(exc), "ok": False}
    problems = []
    digest = hashlib.sha256(body).hexdigest()
    sha_ok = digest == meta.get("sha256")
    if not sha_ok:
        problems.append("SHA-256 differs from the capture metadata")
    record_sha = _record_sha(path.with_suffix(".json"), str(meta.get("id")))
    record_ok = None if record_sha is None else record_sha == digest
    if record_ok is False:
        problems.append("SHA-256 differs from requests.jsonl")
    chunks: list[tuple[float, bytes]] = []
    try:
        for pos, length, offset in meta["reads"]:
            chunks.append((float(offset), body[int(pos):int(pos) + int(length)]))
        expected_len = sum(int(r[1]) for r in meta["reads"])
    except (KeyError, TypeError, ValueError):
        return {"capture": str(path), "verdict": "unreadable", "reason": "capture metadata has no valid reads", "ok": False}
    if len(body) != expected_len:
        problems.append(f"truncated: body has {len(body)} bytes, reads add up to {expected_len}")
    if meta.get("truncated"):
        problems.append("capture was cut at the proxy's max_capture_bytes")
    status = meta.get("status")
    endpoint = _endpoint(meta)
    result = analyze_bytes(
        chunks, status=status if isinstance(status, int) else None,
        spec=RequestSpec(stream=bool(meta.get("streaming", True)) and endpoint not in POOLING,
                         expected_tokens=meta.get("expected_tokens"), endpoint=endpoint,
                         inputs=_count(meta.get("inputs")), top_n=_count(meta.get("top_n"))),
        streaming=bool(meta.get("streaming", True)), end=meta.get("end_offset"),
        transport_error=meta.get("transport_error"),
    )
    recorded = meta.get("verdict") or {}
    same = recorded.get("outcome") == result.outcome and recorded.get("reason") == result.reason
    if not same:
        problems.append(f"re-judged {result.outcome}/{result.reason}, proxy recorded "
                        f"{recorded.get('outcome')}/{recorded.get('reason')}")
    return {
        "capture": str(path), "id": meta.get("id"), "verdict": result.outcome, "reason": result.reason,
        "detail": result.detail, "status": result.status, "visible_chars": result.visible_chars,
        "completion_tokens": result.completion_tokens, "prompt_tokens": result.prompt_tokens,
        "done": result.done, "usage": result.usage, "ttft_s": result.ttft_s, "e2e_s": result.e2e_s,
        "streaming": bool(meta.get("streaming", True)), "endpoint": endpoint,
        "events": result.events, "bytes": len(body), "sha256": digest, "sha256_ok": sha_ok,
        "record_sha256_ok": record_ok, "matches_proxy": same, "problems": problems, "ok": not problems,
    }


def _count(value: object) -> int | None:
    """A count the capture's metadata holds (an embeddings' inputs, a rerank's top_n), or None."""
    return value if type(value) is int and value >= 0 else None


def _endpoint(meta: dict[str, Any]) -> str:
    """The endpoint the proxy judged the capture as, from its ``record.route`` (completions for a
    capture older than the field, as the proxy then judged every route)."""
    record = meta.get("record")
    route = record.get("route") if isinstance(record, dict) else None
    return endpoint_of(route) if isinstance(route, str) else "completions"


def format_row(r: dict[str, Any]) -> str:
    if r["verdict"] == "unreadable":
        return f"{r['capture']}: UNREADABLE: {r['reason']}"
    sha = "ok" if r["sha256_ok"] and r["record_sha256_ok"] is not False else "MISMATCH"
    if r["record_sha256_ok"] is None and r["sha256_ok"]:
        sha = "ok (no record beside it)"
    line = (f"{r['capture']}: {r['verdict']}" + (f" ({r['reason']})" if r["reason"] else "")
            + f"  visible_chars={r['visible_chars']} completion_tokens={r['completion_tokens']}"
            f" done={'yes' if r['done'] else 'no'} usage={'yes' if r['usage'] else 'no'} sha256={sha}")
    if "tokens" in r:
        line += "\n    " + ("no output token ids in the capture (engine option token_ids: true asks for them)"
                            if r["tokens"] is None else summary_line(r["tokens"]))
    if "text" in r:
        line += f"\n    text of the ids: {r['text']!r} " + (
            "(equal to the engine's visible text)" if r["text_matches"]
            else f"(the engine's visible text differs: {r['visible_text']!r})")
    for p in r["problems"]:
        line += f"\n    ! {p}"
    return line

#: the medians-of-rounds columns of a decode cell, in order
DECODE_KEYS = ("itl_p50_med_s", "itl_p95_med_s", "itl_p99_med_s", "itl_max_s", "decode_stalls",
               "tokens_per_event_mean", "ttft_p50_s", "ttft_p95_s", "ttfo_p50_s", "ttfo_p95_s",
               "spec_acceptance_ratio")
DECODE_NOTE = ("ITL med P50/P95/P99: the median over requests of each request's own P50/P95/P99 per-token gap "
               "(not a pooled percentile of every gap); ITL max: the largest gap of any request; stalls: the sum "
               "of the requests' gaps over stall_s; tokens/event: the mean over requests; TTFT and TTFO: "
               "percentiles over requests (TTFO over those with answer text); spec acceptance: accepted over "
               "drafted tokens, summed over the round")
POOLING_NOTE = ("embeddings and rerank requests have no TTFT or TPOT: their latency is the whole request (E2E), "
                "apart from the generation tables")


def route_of(record: Mapping[str, Any]) -> str:
    """The record's route (``v1/chat/completions``); ``-`` for records older than the field."""
    route = record.get("route")
    return route if isinstance(route, str) and route else "-"


def is_pooling(record: Mapping[str, Any]) -> bool:
    route = record.get("route")
    return isinstance(route, str) and endpoint_of(route) in POOLING


def split_routes(records: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(generations, pooling): apart only where the records hold both; else all are generations."""
    pooling = [r for r in records if is_pooling(r)]
    gens = [r for r in records if not is_pooling(r)]
    return (gens, pooling) if gens and pooling else (list(records), [])


def _nums(recs: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in recs if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]


def decode_row(recs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One round's decode figures (module doc), over its successful requests."""
    ok = [r for r in recs if r.get("outcome") == "success"]
    with_itl = [r for r in ok if isinstance(r.get("itl_p50_s"), (int, float))]
    ttft, ttfo = _nums(ok, "ttft_s"), _nums(ok, "ttfo_s")
    stalls, tpe, maxes = _nums(with_itl, "decode_stalls"), _nums(with_itl, "tokens_per_event"), _nums(with_itl, "itl_max_s")
    spec = [r for r in ok if isinstance(r.get("spec_draft_tokens"), int)]
    drafted = sum(int(r["spec_draft_tokens"]) for r in spec)
    accepted = sum(int(r.get("spec_accepted_tokens") or 0) for r in spec)
    return {
        "success": len(ok), "itl_requests": len(with_itl),
        **{f"itl_{q}_med_s": median(_nums(with_itl, f"itl_{q}_s")) for q in ("p50", "p95", "p99")},
        "itl_max_s": max(maxes) if maxes else None, "decode_stalls": int(sum(stalls)) if stalls else None,
        "tokens_per_event_mean": sum(tpe) / len(tpe) if tpe else None,
        "merged_reads": int(sum(_nums(with_itl, "merged_reads"))) if with_itl else None,
        "ttft_p50_s": percentile(ttft, 50), "ttft_p95_s": percentile(ttft, 95),
        "ttfo_n": len(ttfo), "ttfo_p50_s": percentile(ttfo, 50) if ttfo else None,
        "ttfo_p95_s": percentile(ttfo, 95) if ttfo else None,
        "spec_requests": len(spec), "spec_draft_tokens": drafted if spec else None,
        "spec_accepted_tokens": accepted if spec else None,
        "spec_acceptance_ratio": accepted / drafted if spec and drafted else None,
    }


def decode_rounds(groups: Mapping[tuple[str, str, str, Any], Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """One row per round and route (generations only), in the rounds' order."""
    rows = []
    for (run, engine, scenario, rnd), recs in groups.items():
        by_route: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for r in recs:
            if not is_pooling(r):
                by_route[route_of(r)].append(r)
        for route, part in by_route.items():
            rows.append({"run": run, "engine": engine, "scenario": scenario, "round": rnd, "route": route,
                         **decode_row(part)})
    return rows


def decode_cells(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per run, engine, scenario and route: each of :data:`DECODE_KEYS` as the median of its rounds,
    with the rounds' ``[min, max]`` in ``spread`` (rounds without the figure left out)."""
    cells: dict[tuple[str, str, str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        cells[(row["run"], row["engine"], row["scenario"], row["route"])].append(row)
    out = []
    for (run, engine, scenario, route), rs in cells.items():
        cell: dict[str, Any] = {"run": run, "engine": engine, "scenario": scenario, "route": route, "rounds": len(rs)}
        spread: dict[str, list[float] | None] = {}
        for key in DECODE_KEYS:
            xs = _nums(rs, key)
            cell[key] = median(xs) if xs else None
            spread[key] = [min(xs), max(xs)] if xs else None
        out.append({**cell, "spread": spread})
    return out


def pooling_rounds(groups: Mapping[tuple[str, str, str, Any], Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Per round and pooling route: requests, successes and the E2E latency P50/P95 of the successes."""
    rows = []
    for (run, engine, scenario, rnd), recs in groups.items():
        by_route: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for r in recs:
            if is_pooling(r):
                by_route[route_of(r)].append(r)
        for route, part in by_route.items():
            ok = [r for r in part if r.get("outcome") == "success"]
            e2e = _nums(ok, "e2e_s")
            rows.append({"run": run, "engine": engine, "scenario": scenario, "round": rnd, "route": route,
                         "requests": len(part), "success": len(ok), "e2e_p50_s": percentile(e2e, 50),
                         "e2e_p95_s": percentile(e2e, 95)})
    return rows
