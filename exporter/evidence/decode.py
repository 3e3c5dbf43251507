"""``evidence decode``: re-read raw SSE captures offline and judge them again.

The same core as the proxy (:mod:`exporter.core.analysis`) replays the captured reads at their
recorded arrival offsets, so TTFT, TPOT and the verdict come out as the proxy saw them.
A corrupt or truncated capture gets a verdict of its own, never a traceback.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from exporter.core.analysis import RequestSpec, analyze_bytes
from exporter.core.tokenids import output_text, output_token_ids
from exporter.proxy.records import read_capture

from .tokens import detokenize, explain, summary_line

__all__ = ["decode_capture", "format_row"]


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
    result = analyze_bytes(
        chunks, status=status if isinstance(status, int) else None,
        spec=RequestSpec(stream=bool(meta.get("streaming", True)), expected_tokens=meta.get("expected_tokens")),
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
        "streaming": bool(meta.get("streaming", True)),
        "events": result.events, "bytes": len(body), "sha256": digest, "sha256_ok": sha_ok,
        "record_sha256_ok": record_ok, "matches_proxy": same, "problems": problems, "ok": not problems,
    }


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
