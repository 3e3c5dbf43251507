"""Runs that never mix, and the SLO that judges each record.

A run is one ``serve`` start: every record carries its ``run_id``; records written before there
were run ids form one run, ``unknown``.  Rounds are grouped by run, engine, scenario and round, in
plan order (the order in which the rounds first appear, by start time); several proxies' records
of the same run and round form one round.

Each record is judged by its own ``slo`` (the thresholds the proxy judged it by); a record without
one by the config given (``slo_by_scenario``, else ``slo``), else by the default SLO.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from exporter.proxy.config import DEFAULT_SLO, Config

__all__ = ["UNKNOWN_RUN", "SKIP_SCENARIOS", "RunError", "run_of", "runs_in", "select_run", "group_rounds",
           "judge_by", "RoundKey"]

UNKNOWN_RUN = "unknown"
SKIP_SCENARIOS = frozenset({"warmup"})
#: (run, engine, scenario, round)
RoundKey = tuple[str, str, str, Any]


class RunError(ValueError):
    """A ``--run`` that the records do not hold; the message lists those they do."""


def run_of(record: Mapping[str, Any]) -> str:
    return str(record.get("run_id") or UNKNOWN_RUN)


def runs_in(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The runs of the records, in the order they started."""
    first: dict[str, float] = {}
    for r in records:
        if r.get("start_unix") is not None:
            run = run_of(r)
            first[run] = min(first.get(run, float("inf")), float(r["start_unix"]))
    return sorted(first, key=lambda run: (first[run], run))


def select_run(records: Sequence[Mapping[str, Any]], run: str | None) -> list[Mapping[str, Any]]:
    """The records of ``run`` (all when None; one proxy's id picks the run it is part of, see
    :func:`.merge.join_runs`); RunError when there are none."""
    if run is None:
        return list(records)
    picked = [r for r in records if run_of(r) == run or run in run_of(r).split("+")]
    if not picked:
        raise RunError(f"--run {run}: no records of that run (runs there: {', '.join(runs_in(records)) or 'none'})")
    return picked


def group_rounds(records: Sequence[Mapping[str, Any]]) -> dict[RoundKey, list[Mapping[str, Any]]]:
    """Records by (run, engine, scenario, round), warm-ups left out, in plan order."""
    groups: dict[RoundKey, list[Mapping[str, Any]]] = defaultdict(list)
    first: dict[RoundKey, float] = {}
    for r in records:
        if r.get("scenario") in SKIP_SCENARIOS or r.get("start_unix") is None:
            continue
        key = (run_of(r), str(r.get("engine")), str(r.get("scenario")), r.get("round"))
        groups[key].append(r)
        first[key] = min(first.get(key, float("inf")), float(r["start_unix"]))
    return {k: groups[k] for k in sorted(groups, key=lambda k: (first[k], str(k)))}


def _has_slo(record: Mapping[str, Any]) -> bool:
    slo = record.get("slo")
    return isinstance(slo, Mapping) and all(isinstance(slo.get(k), (int, float)) for k in ("ttft_s", "tpot_s"))


def _default_text() -> str:
    return f"the default SLO (TTFT <= {DEFAULT_SLO.ttft_s:g} s, TPOT <= {DEFAULT_SLO.tpot_s * 1000:g} ms)"


def judge_by(records: Sequence[Mapping[str, Any]], config: Config | None = None,
             config_path: Path | str | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Records that all carry the ``slo`` that judges them, and a note of where it came from:
    ``{"own": N, "fallback": M, "fallback_source": TEXT, "text": one line}``."""
    out: list[dict[str, Any]] = []
    missing = 0
    for r in records:
        if _has_slo(r):
            out.append(dict(r))
            continue
        missing += 1
        slo = config.slo_for(str(r.get("scenario"))) if config is not None else DEFAULT_SLO
        out.append({**r, "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s}})
    source = f"the config {config_path} (slo, slo_by_scenario)" if config is not None else _default_text()
    own = len(out) - missing
    text = f"SLO: each record judged by its own slo ({own} records)"
    if missing:
        text = (f"SLO: {own} records judged by their own slo; {missing} without one (an older proxy) "
                f"judged by {source}")
    return out, {"own": own, "fallback": missing, "fallback_source": source if missing else None, "text": text}
