"""What the proxy added to the client's TTFT, per round, and whether the rounds' ``t0`` agree.

Each record since the fifth wave carries ``t0_source`` (``kernel``: ``t0`` is the kernel's transmit
stamp of the request leaving for the engine; ``loop``: the proxy's loop clock just before its
send) and ``proxy_added_s`` (the request's hold in the proxy before ``t0`` plus the first visible
text's hold before it left toward the client): a client's TTFT is ``ttft_s + proxy_added_s``.
Records written before carry neither: their ``t0_source`` counts as :data:`UNKNOWN`.

:func:`added_rows` gives per round the P50/P95 of ``proxy_added_s`` (every record that has one)
and of the client's TTFT (successful records with both); :func:`t0_mix_warning` is the
``warning:`` line of rounds whose ``t0`` was taken in different ways: their TTFTs are not
measured from the same instant.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from exporter.core.stats import percentile

from .experiment import round_name

__all__ = ["UNKNOWN", "t0_source", "t0_text", "added_rows", "t0_mix_warning", "sides_t0_warning", "sources_of",
           "ADDED_COLS", "ADDED_NOTE"]

#: the ``t0_source`` of a record written before records had one
UNKNOWN = "unknown"
#: the columns of the summary's table, after the round's run/engine/scenario/round
ADDED_COLS = ["t0_source", "proxy_added_n", "proxy_added_p50_s", "proxy_added_p95_s", "ttft_p95_s",
              "client_ttft_p95_s"]
ADDED_NOTE = ("proxy added: what the proxy added to the client's TTFT (`proxy_added_s`: the request's hold "
              "before t0, plus the first text's hold before it left toward the client), P50/P95 over the "
              "round's records that carry it; client TTFT = ttft_s + proxy_added_s, over successful requests. "
              "t0: `kernel` where t0 is the kernel's transmit stamp of the request, `loop` where it is the "
              "proxy's loop clock before the send, `unknown` for records written before either was recorded.")

Record = Mapping[str, Any]


def t0_source(record: Record) -> str:
    """The record's ``t0_source``, :data:`UNKNOWN` where it has none (an older proxy)."""
    value = record.get("t0_source")
    return value if isinstance(value, str) and value else UNKNOWN


def t0_text(sources: Mapping[str, int]) -> str:
    """``kernel``, or ``kernel 12, loop 3`` where a round's records differ."""
    if len(sources) == 1:
        return next(iter(sources))
    return ", ".join(f"{k} {n}" for k, n in sorted(sources.items(), key=lambda kv: (-kv[1], kv[0])))


def _numbers(records: Sequence[Record], key: str) -> list[float]:
    return [float(r[key]) for r in records if isinstance(r.get(key), (int, float)) and not isinstance(r[key], bool)]


def _figures(records: Sequence[Record]) -> dict[str, Any]:
    added = _numbers(records, "proxy_added_s")
    ok = [r for r in records if r.get("outcome") == "success"]
    client = [float(r["ttft_s"]) + float(r["proxy_added_s"]) for r in ok
              if isinstance(r.get("ttft_s"), (int, float)) and isinstance(r.get("proxy_added_s"), (int, float))]
    return {"t0_sources": dict(Counter(t0_source(r) for r in records)), "proxy_added_n": len(added),
            "proxy_added_p50_s": percentile(added, 50), "proxy_added_p95_s": percentile(added, 95),
            "ttft_p95_s": percentile(_numbers(ok, "ttft_s"), 95), "client_ttft_p95_s": percentile(client, 95)}


def added_rows(groups: Mapping[tuple[str, str, str, Any], Sequence[Record]]) -> list[dict[str, Any]]:
    """One row per round (run, engine, scenario, round): its ``t0_sources`` (value -> records),
    ``t0_source`` (one value, or ``mixed``), and the P50/P95 of ``proxy_added_s``, with the
    round's TTFT P95 and the client's (``ttft_s + proxy_added_s``) beside them."""
    rows = []
    for (run, engine, scenario, rnd), recs in groups.items():
        figures = _figures(recs)
        sources = figures["t0_sources"]
        rows.append({"run": run, "engine": engine, "scenario": scenario, "round": rnd,
                     "t0_source": next(iter(sources)) if len(sources) == 1 else "mixed", **figures})
    return rows


def sources_of(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Per ``t0_source`` value, the number of rounds (of :func:`added_rows`) that hold it."""
    count: Counter[str] = Counter()
    for row in rows:
        count.update(set(row.get("t0_sources") or {}))
    return dict(count)


def t0_mix_warning(rows: Sequence[Mapping[str, Any]], where: str = "the rounds") -> str | None:
    """The ``warning:`` line when ``rows`` (of :func:`added_rows`) hold more than one ``t0_source``
    value; None when they agree."""
    sources = sources_of(rows)
    if len(sources) < 2:
        return None
    rare = min(sources, key=lambda k: (sources[k], k))
    example = next(r for r in rows if rare in (r.get("t0_sources") or {}))
    counts = ", ".join(f"{k} in {n} round{'s' if n != 1 else ''}" for k, n in sorted(sources.items()))
    return (f"warning: {where} mix t0_source values ({counts}; {rare} e.g. {example['engine']} "
            f"{round_name(example['scenario'], example['round'])}): their TTFTs are not measured from the same "
            "instant (kernel: the kernel's transmit stamp of the request; loop: the proxy's loop clock before the "
            "send; unknown: records of an older proxy), so compare TTFTs only between rounds of one t0_source; "
            "proxy_added_s says what the proxy added")


def sides_t0_warning(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], label_a: str,
                     label_b: str) -> str | None:
    """The ``warning:`` line of a comparison whose two sides' rounds (rows of :func:`added_rows`)
    hold more than one ``t0_source`` value between them; None when all agree."""
    sa, sb = sources_of(a), sources_of(b)
    if len(set(sa) | set(sb)) < 2:
        return None

    def side(name: str, sources: Mapping[str, int]) -> str:
        return f"{name}: " + (", ".join(f"{k} in {n} round{'s' if n != 1 else ''}" for k, n in sorted(sources.items()))
                              or "no round")

    return (f"warning: the rounds compared mix t0_source values (A {side(label_a, sa)}; B {side(label_b, sb)}): "
            "their TTFTs are not measured from the same instant (kernel: the kernel's transmit stamp of the "
            "request; loop: the proxy's loop clock before the send; unknown: records of an older proxy), so a TTFT "
            "delta between them is partly the proxy's; proxy_added_s says what the proxy added")
