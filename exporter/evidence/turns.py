"""Per-turn and per-session truth of ``evidence summarize``, from the records of session requests.

A session is the records of one run and engine that carry one ``session_id``.  Its turns are
numbered here in the order the requests left the proxy (``start_unix``), 1, 2, ..., over every
records directory merged: the record's own ``turn`` is one proxy process's count (a worker of
``serve --workers N`` or one of several proxies sees only the turns that reached it), the
order of arrival is the session's.  Warm-ups are left out.

Per turn (run × engine × scenario × turn): requests, the strict success rate (successes over
every request), TTFT P50/P95 of the successes, the mean prompt tokens and the cached share
(``cached_tokens`` over ``prompt_tokens`` of the requests whose engine reported cached tokens;
none where none did).  Per session: the total time (first request sent to last answer's end),
the time spent waiting on the engine (the turns' E2E added up) and between turns (the rest: the
client's think time and its own work), and per cell the P50/P95 of those over its sessions.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from exporter.core.stats import percentile

from .runs import SKIP_SCENARIOS, run_of

__all__ = ["sessions_of", "turn_table", "session_table", "session_cells"]

Record = Mapping[str, Any]
SessionKey = tuple[str, str, str]  # run, engine, session_id


def sessions_of(records: Sequence[Record]) -> dict[SessionKey, list[Record]]:
    """Each session's records in the order they left the proxy, sessions in the order they began."""
    out: dict[SessionKey, list[Record]] = defaultdict(list)
    timed = [r for r in records if r.get("session_id") and r.get("start_unix") is not None
             and r.get("scenario") not in SKIP_SCENARIOS]
    for r in sorted(timed, key=lambda r: float(r["start_unix"])):
        out[(run_of(r), str(r.get("engine")), str(r["session_id"]))].append(r)
    return dict(out)


def _cached_share(recs: Sequence[Record]) -> float | None:
    told = [r for r in recs if isinstance(r.get("cached_tokens"), int) and isinstance(r.get("prompt_tokens"), int)]
    prompt = sum(r["prompt_tokens"] for r in told)
    return sum(r["cached_tokens"] for r in told) / prompt if told and prompt else None


def turn_table(records: Sequence[Record]) -> list[dict[str, Any]]:
    """One row per run × engine × scenario × turn (the scenario of the session's first turn), cells in
    the order they began."""
    by_turn: dict[tuple[str, str, str, int], list[Record]] = defaultdict(list)
    cells: dict[tuple[str, str, str], int] = {}
    for (run, engine, _), recs in sessions_of(records).items():
        cell = (run, engine, str(recs[0].get("scenario")))
        cells.setdefault(cell, len(cells))
        for turn, r in enumerate(recs, 1):
            by_turn[(*cell, turn)].append(r)
    rows = []
    for (run, engine, scenario, turn), recs in sorted(by_turn.items(), key=lambda kv: (cells[kv[0][:3]], kv[0][3])):
        ok = [r for r in recs if r.get("outcome") == "success"]
        ttft = [float(r["ttft_s"]) for r in ok if r.get("ttft_s") is not None]
        prompts = [r["prompt_tokens"] for r in recs if isinstance(r.get("prompt_tokens"), int)]
        rows.append({"run": run, "engine": engine, "scenario": scenario, "turn": turn, "requests": len(recs),
                     "success": len(ok), "success_ratio": len(ok) / len(recs), "ttft_p50_s": percentile(ttft, 50),
                     "ttft_p95_s": percentile(ttft, 95),
                     "prompt_tokens_mean": sum(prompts) / len(prompts) if prompts else None,
                     "cached_share": _cached_share(recs)})
    return rows


def session_table(records: Sequence[Record]) -> list[dict[str, Any]]:
    """One row per session: its turns, successes, total time, time on the engine and between turns."""
    rows = []
    for (run, engine, session), recs in sessions_of(records).items():
        start = float(recs[0]["start_unix"])
        ends = [float(r["start_unix"]) + float(r.get("e2e_s") or 0.0) for r in recs]
        engine_s = sum(float(r.get("e2e_s") or 0.0) for r in recs)
        gaps = [max(0.0, float(b["start_unix"]) - end) for b, end in zip(recs[1:], ends)]
        rows.append({"run": run, "engine": engine, "scenario": str(recs[0].get("scenario")), "session_id": session,
                     "turns": len(recs), "success": sum(1 for r in recs if r.get("outcome") == "success"),
                     "total_s": max(ends) - start, "engine_s": engine_s, "between_turns_s": sum(gaps),
                     "between_turns_max_s": max(gaps) if gaps else None,
                     "cached_share": _cached_share(recs)})
    return rows


_SESSION_FIGURES = ("total_s", "engine_s", "between_turns_s")


def session_cells(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per run × engine × scenario: the sessions, their turns, and P50/P95 of each session figure."""
    cells: dict[tuple[str, str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        cells[(row["run"], row["engine"], row["scenario"])].append(row)
    out = []
    for (run, engine, scenario), sessions in cells.items():
        cell: dict[str, Any] = {"run": run, "engine": engine, "scenario": scenario, "sessions": len(sessions),
                                "turns": sum(s["turns"] for s in sessions),
                                "sessions_all_ok": sum(1 for s in sessions if s["success"] == s["turns"])}
        for key in _SESSION_FIGURES:
            values = [float(s[key]) for s in sessions]
            name = key[:-2]
            cell.update({f"{name}_p50_s": percentile(values, 50), f"{name}_p95_s": percentile(values, 95)})
        out.append(cell)
    return out


#: the human tables' columns (``summary.md``), and what they say
TURN_COLS = ["engine", "scenario", "turn", "success", "requests", "success_ratio", "ttft_p50_s", "ttft_p95_s",
             "prompt_tokens_mean", "cached_share"]
SESSION_COLS = ["engine", "scenario", "sessions", "sessions_all_ok", "turns", "total_p50_s", "total_p95_s",
                "engine_p50_s", "engine_p95_s", "between_turns_p50_s", "between_turns_p95_s"]
TITLES = {"turn": "turn", "prompt_tokens_mean": "prompt tokens", "cached_share": "cached",
          "sessions": "sessions", "sessions_all_ok": "all turns ok", "turns": "turns", "total_p50_s": "total P50",
          "total_p95_s": "total P95", "engine_p50_s": "on engine P50", "engine_p95_s": "on engine P95",
          "between_turns_p50_s": "between turns P50", "between_turns_p95_s": "between turns P95"}
NOTE = ("Turns numbered in the order each session's requests left the proxy (over every records directory). "
        "success: strict successes over every request of that turn; TTFT of the successes; prompt tokens: the "
        "mean of the engine's usage; cached: the share of those prompt tokens the engine took from its prefix "
        "cache (usage.prompt_tokens_details.cached_tokens; - where the engine does not report it: vLLM needs "
        "--enable-prompt-tokens-details, SGLang --enable-cache-report).")
SESSION_NOTE = ("Per session: total = first request sent to the last answer's end; on engine = its turns' E2E "
                "added up; between turns = the rest (the client's think time and its own work); P50/P95 over "
                "the sessions of each scenario.")
