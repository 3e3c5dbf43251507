"""The failures section: per reason and engine (the medians' ``failure_reasons`` added up), each
empty 200 as the seed's redacted field summary with its output token ids where captured, and each
disconnect with its detail.  No prompt or output text is ever shown: fields and ids only."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .doc import Items, Para, Section, Table
from .model import Report

__all__ = ["failures", "empty_200_fields", "MAX_SHOWN"]

#: empty 200s and disconnects shown one by one (the rest counted)
MAX_SHOWN = 20
_DISCONNECTS = ("upstream_disconnect", "connect_error", "timeout")


def empty_200_fields(rec: Mapping[str, Any]) -> dict[str, Any]:
    """The seed's redacted field summary of one empty 200 (no text: lengths and flags only)."""
    return {"http_status": rec.get("status"), "done": rec.get("done"), "completion_tokens": rec.get("completion_tokens"),
            "visible_text_length": rec.get("visible_chars"), "accepted_as_success": rec.get("outcome") == "success"}


def _token_ids(records_dirs: Sequence[Path], rec: Mapping[str, Any], vocabulary: Any) -> str:
    if not rec.get("capture"):
        return "not captured"
    from ..decode import decode_capture
    from ..tokens import summary_line

    found = [d / str(rec["capture"]) for d in records_dirs if (d / str(rec["capture"])).is_file()]
    if not found:
        return f"capture {rec['capture']} not found beside the records"
    path = found[0]
    if vocabulary is None:
        from exporter.core.tokenids import output_token_ids
        from exporter.proxy.records import read_capture

        try:
            meta, body = read_capture(path)
        except ValueError as exc:
            return f"capture unreadable: {exc}"
        ids = output_token_ids(body, bool(meta.get("streaming", True)))
        return "no token ids in the capture" if ids is None else f"{len(ids)} token ids: {ids[:16]}" + (
            " ..." if len(ids) > 16 else "") + " (give --tokenizer to mark the special ones)"
    tokens = decode_capture(path, vocabulary).get("tokens")
    return "no token ids in the capture" if tokens is None else summary_line(tokens, limit=4)


def _reason_table(report: Report) -> Table | None:
    counts: dict[str, dict[str, int]] = defaultdict(dict)
    for m in report.summary.get("medians") or []:
        if m["scenario"] in report.calibration:
            continue
        for reason, n in (m.get("failure_reasons") or {}).items():
            counts[reason][m["engine"]] = counts[reason].get(m["engine"], 0) + int(n)
    if not counts:
        return None
    rows = tuple((reason, *(str(counts[reason].get(e, 0)) for e in report.engines), str(sum(counts[reason].values())))
                 for reason in sorted(counts))
    return Table(("reason", *(f"{e} (requests)" for e in report.engines), "all (requests)"), rows)


def failures(report: Report, records: Sequence[Mapping[str, Any]], records_dirs: Sequence[Path],
             vocabulary: Any = None) -> Section:
    s = Section("Failures")
    table = _reason_table(report)
    if table is None:
        s.blocks.append(Para("No request failed (warm-ups and calibration apart)."))
        return s
    s.blocks.append(table)
    empty = [r for r in records if r.get("reason") == "empty_text" and r.get("scenario") != "warmup"]
    if empty:
        s.blocks.append(Para(f"Empty 200s: {len(empty)} (HTTP 200 with [DONE] and usage, no visible text); "
                             f"{'each' if len(empty) <= MAX_SHOWN else f'the first {MAX_SHOWN}'} as a redacted "
                             "field summary, with the output token ids the engine sent where its capture holds them:"))
        s.blocks.append(Table(("engine", "scenario#round", "request id", "fields", "output token ids"), tuple(
            (str(r.get("engine")), f"{r.get('scenario')}#{r.get('round')}", str(r.get("id"))[:12],
             ", ".join(f"{k}={v}" for k, v in empty_200_fields(r).items()),
             _token_ids(records_dirs, r, vocabulary)) for r in empty[:MAX_SHOWN])))
    cut = [r for r in records if r.get("reason") in _DISCONNECTS and r.get("scenario") != "warmup"]
    if cut:
        s.blocks.append(Para(f"Disconnects, timeouts and connect errors: {len(cut)}"))
        s.blocks.append(Items(tuple(f"{r.get('engine')} {r.get('scenario')}#{r.get('round')} {str(r.get('id'))[:12]}: "
                                    f"{r.get('reason')}: {r.get('detail') or 'no detail'}" for r in cut[:MAX_SHOWN])))
    return s
