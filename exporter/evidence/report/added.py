"""The report's timing caveat beside TTFT: per engine and scenario, what the proxy added to the
client's TTFT (``proxy_added_s``) and how ``t0`` was taken, from ``evidence summarize``'s
``proxy_added`` rows (per round), each the median of rounds with the rounds' [min–max]."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from exporter.core.stats import median

from ..proxyadded import UNKNOWN, t0_text
from .doc import Table
from .model import Report
from .sections import fmt_median

__all__ = ["added_table", "ADDED_KEYS"]

#: (row key, column title): each the median of rounds
ADDED_KEYS = (("ttft_p95_s", "TTFT P95 (ms)"), ("proxy_added_p50_s", "proxy added P50 (ms)"),
              ("proxy_added_p95_s", "proxy added P95 (ms)"), ("client_ttft_p95_s", "client TTFT P95 (ms)"))


def _median_text(key: str, rows: Sequence[Mapping[str, Any]]) -> str:
    xs = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return fmt_median(key, median(xs), [min(xs), max(xs)] if len(xs) > 1 else None) if xs else "-"


def added_table(report: Report) -> Table | None:
    """Per engine × scenario of the report's rounds; None where no record carries ``proxy_added_s``
    or a ``t0_source`` (an older proxy's)."""
    rows = [r for r in report.summary.get("proxy_added") or [] if r["scenario"] not in set(report.calibration)]
    if not any(r.get("proxy_added_n") or set(r.get("t0_sources") or {}) - {UNKNOWN} for r in rows):
        return None
    cells: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        cells[(r["engine"], r["scenario"])].append(r)
    order = {e: i for i, e in enumerate(report.engines)}
    out = []
    for (engine, scenario), rounds in sorted(cells.items(), key=lambda kv: order.get(kv[0][0], len(order))):
        sources: Counter[str] = Counter()
        for r in rounds:
            sources.update(r.get("t0_sources") or {})
        out.append((engine, scenario, str(len(rounds)), t0_text(dict(sources)),
                    *(_median_text(key, rounds) for key, _ in ADDED_KEYS)))
    return Table(("engine", "scenario", "rounds", "t0 (requests)", *(title for _, title in ADDED_KEYS)), tuple(out),
                 merge=(0,), caption="What the proxy added to the client's TTFT: proxy_added_s, the request's hold "
                 "before t0 plus the first text's hold before it left toward the client; a client's TTFT is "
                 "ttft_s + proxy_added_s. Each figure is the median over the cell's rounds of each round's "
                 "percentile, with the rounds' [min–max]. t0: kernel where it is the kernel's transmit stamp of the "
                 "request, loop where it is the proxy's loop clock before the send, unknown for an older proxy's "
                 "records.")
