"""Where TTFT goes, per round: the proxy's TTFT P50/P95 split into the engine's queue, its
prefill, and everything outside the engine, from the records that carry the engine's own clock.

A request's parts add up to its TTFT: ``queue`` (vLLM ``queue_time_ms``, SGLang ``queue_time``),
``prefill`` (the engine scheduling it to its first output token), ``outside`` = TTFT − queue −
prefill (the HTTP server, tokenizing, the hand-offs, detokenizing, the network).  A percentile
is split as the requests at it are: the TTFT P95 lies between two requests of the sorted TTFTs
(:func:`exporter.core.stats.percentile` interpolates between them), and each part is
interpolated between those two requests' parts in the same proportion, so the parts of the P95
add up to the P95 exactly.  Beside them the means of the parts, which add up to the mean TTFT.
Only successful requests with a TTFT, a queue and a prefill count (``timed``); a round without
any has ``engine_timing`` None ("no engine timing").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["ttft_parts", "PARTS", "QUANTILES", "part_key", "md_rows", "MD_COLS", "NOTE"]

PARTS = ("queue", "prefill", "outside")
QUANTILES = (50, 95)
#: (run, engine, scenario, round) -> that round's records
Groups = Mapping[tuple[str, str, str, Any], Sequence[Mapping[str, Any]]]


def part_key(part: str, q: int | None) -> str:
    """``queue_at_p95_s``; ``queue_mean_s`` for q None."""
    return f"{part}_mean_s" if q is None else f"{part}_at_p{q}_s"


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _timed(records: Sequence[Mapping[str, Any]]) -> list[tuple[float, float, float, float]]:
    """(ttft, queue, prefill, outside) of each successful request with the engine's clock, by TTFT."""
    out = []
    for r in records:
        if r.get("outcome") != "success":
            continue
        ttft, queue, prefill = (_num(r.get(k)) for k in ("ttft_s", "engine_queue_s", "engine_prefill_s"))
        if ttft is not None and queue is not None and prefill is not None:
            out.append((ttft, queue, prefill, ttft - queue - prefill))
    return sorted(out)


def _at(rows: list[tuple[float, float, float, float]], q: int) -> tuple[float, ...]:
    """TTFT and its parts at percentile ``q``: interpolated between the two requests around it."""
    pos = (len(rows) - 1) * q / 100
    lo, hi = rows[math.floor(pos)], rows[math.ceil(pos)]
    frac = pos - math.floor(pos)
    return tuple(a + (b - a) * frac for a, b in zip(lo, hi))


def _split(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    rows = _timed(records)
    sources = sorted({str(r["engine_timing"]) for r in records if r.get("engine_timing")})
    out: dict[str, Any] = {"timed": len(rows), "engine_timing": ", ".join(sources) if rows else None}
    for q in QUANTILES:
        values = _at(rows, q) if rows else (None,) * 4
        out[f"ttft_p{q}_s"] = values[0]
        out.update({part_key(part, q): v for part, v in zip(PARTS, values[1:])})
    n = len(rows)
    means = [sum(col) / n for col in zip(*rows)] if rows else [None] * 4
    out["ttft_mean_s"] = means[0]
    out.update({part_key(part, None): v for part, v in zip(PARTS, means[1:])})
    return out


def ttft_parts(groups: Groups) -> list[dict[str, Any]]:
    """One row per round: its successes, how many carry the engine's clock, and the split."""
    rows = []
    for (run, engine, scenario, rnd), recs in groups.items():
        success = sum(1 for r in recs if r.get("outcome") == "success")
        rows.append({"run": run, "engine": engine, "scenario": scenario, "round": rnd, "success": success,
                     **_split(recs)})
    return rows


#: What the parts are, for a report (summary.md, and the board's description says the same).
NOTE = ("Successful requests whose engine gave its own clock (vLLM's per-request `metrics` object on the "
        "stream: `--enable-per-request-metrics`; SGLang's request log joined by `--engine-log DIR`). "
        "queue: the engine held the request before scheduling it; prefill: from scheduling to its first "
        "output token, by the engine's clock; outside engine = TTFT − queue − prefill: the HTTP server, "
        "tokenizing, the hand-offs between the engine's processes, detokenizing and the network. At P50 and "
        "P95 the parts are those of the requests at that percentile (interpolated as the percentile is), so "
        "they add up to it; the means add up to the mean TTFT. timed: requests with the engine's clock of "
        "the round's successes; the TTFT here is theirs.")
#: the rows' columns in summary.md, after run, engine, scenario, round
MD_COLS = ["timed", "engine_timing", "at", "ttft_s", "queue_s", "prefill_s", "outside_s", "mostly"]


def md_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Three rows per timed round for a human table: at P50, at P95 and the means."""
    out = []
    for row in rows:
        if not row.get("engine_timing"):
            continue
        for q, at in ((50, "P50"), (95, "P95"), (None, "mean")):
            ttft = row["ttft_mean_s"] if q is None else row[f"ttft_p{q}_s"]
            parts = {f"{p}_s": row[part_key(p, q)] for p in PARTS}
            mostly = max(PARTS, key=lambda p: parts[f"{p}_s"])
            out.append({**{k: row[k] for k in ("run", "engine", "scenario", "round", "engine_timing")},
                        "timed": f"{row['timed']}/{row['success']}", "at": at, "ttft_s": ttft, **parts,
                        "mostly": "outside engine" if mostly == "outside" else mostly})
    return out
