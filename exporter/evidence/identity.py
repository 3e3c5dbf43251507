"""What was measured: the engines' identity and the proxy's, for every evidence output.

The proxy writes ``engines.jsonl`` beside ``scenarios.jsonl`` (:mod:`exporter.proxy.engines`):
per run a ``start`` line (the proxy's version and its config file's SHA-256), then a line per
identity an engine reported (kind, version, model, root, max_model_len, server_args) and per
down and up the proxy saw.  From those, for the runs an output covers:

* ``engines``: one entry per run, engine and identity (an identity that changed inside a run
  gives two), with the downs and ups and the time to ready of each start the proxy saw;
* ``proxy``: ``{"version", "config_sha256", "run_ids"}`` (a value that differs between the runs
  is the list of the values);
* ``warnings``: a ``warning:`` line for each engine whose version changed inside a run.

Without ``engines.jsonl`` (an older proxy, or an export without ``--records``), the engines come
from ``llmbench_engine_info`` in Prometheus where it is at hand, and the proxy from
``llmbench_proxy_info``.  Every argument whose name says
it is a secret is redacted again on the way out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from exporter.core.timefmt import iso
from exporter.proxy.engines import IDENTITY_KEYS, LOG_NAME, redact

__all__ = ["read_log", "identity", "run_parts", "engines_from_prometheus", "proxy_from_prometheus", "for_window",
           "Identity"]

Identity = dict[str, Any]  # {"engines": [...], "proxy": {...}, "warnings": [...]}


def _log_path(path: Path) -> Path:
    return (path if path.is_dir() else path.parent) / LOG_NAME


def read_log(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The ``engines.jsonl`` lines beside each records directory (or requests.jsonl), in time
    order; a missing file is none, a line that is not a JSON object is skipped."""
    lines: list[dict[str, Any]] = []
    for path in dict.fromkeys(_log_path(Path(p)) for p in paths):
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        for raw in text.splitlines():
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if isinstance(line, dict) and line.get("event"):
                lines.append(line)
    return sorted(lines, key=lambda x: float(x.get("unix") or 0.0))


def run_parts(run_ids: Iterable[str]) -> set[str]:
    """Every proxy run named by ``run_ids`` (merged runs are joined with ``+``)."""
    return {part for run in run_ids for part in str(run).split("+")}


def _one(values: Sequence[Any]) -> Any:
    distinct = list(dict.fromkeys(v for v in values if v is not None))
    return distinct[0] if len(distinct) == 1 else (distinct or None)


def _proxy(lines: Sequence[Mapping[str, Any]], run_ids: Sequence[str]) -> dict[str, Any]:
    starts = [x for x in lines if x["event"] == "start"]
    proxies = [x.get("proxy") or {} for x in starts]
    return {"version": _one([p.get("version") for p in proxies]),
            "config_sha256": _one([p.get("config_sha256") for p in proxies]),
            "run_ids": list(run_ids)}


def _entry(line: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"run_id": line.get("run_id"), "name": line.get("engine"), "upstream": line.get("upstream"),
                           **{k: line.get(k) for k in IDENTITY_KEYS}, "since": line.get("unix"), "downs": 0,
                           "ups": 0, "time_to_ready_s": []}
    out["server_args"], out["model_info"] = redact(out["server_args"]), redact(out["model_info"])
    return out


def _engines(lines: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    entries: list[dict[str, Any]] = []
    current: dict[tuple[Any, Any], dict[str, Any]] = {}
    warnings: list[str] = []
    for line in lines:
        key = (line.get("run_id"), line.get("engine"))
        if line["event"] == "identity":
            entry = _entry(line)
            before = current.get(key)
            if before is not None and before["version"] != entry["version"]:
                warnings.append(f"warning: engine {key[1]} changed version inside run {key[0]}: "
                                f"{before['version']} -> {entry['version']} at {iso(float(line['unix']))}; "
                                "the rounds before and after measured different builds")
            current[key] = entry
            entries.append(entry)
        elif line["event"] in ("down", "up", "ready") and key in current:
            _note(current[key], line)
    return entries, warnings


def _note(entry: dict[str, Any], line: Mapping[str, Any]) -> None:
    if line["event"] == "down":
        entry["downs"] += 1
    elif line["event"] == "up" and line.get("seen_down"):
        entry["ups"] += 1
        entry["time_to_ready_s"].append(line.get("time_to_ready_s"))
    elif line["event"] == "ready" and entry["time_to_ready_s"]:  # refined from the process start
        entry["time_to_ready_s"][-1] = line.get("time_to_ready_s")


def identity(paths: Iterable[Path], run_ids: Sequence[str]) -> Identity:
    """``engines``, ``proxy`` and ``warnings`` of the runs ``run_ids`` (of the records at
    ``paths``)."""
    parts = run_parts(run_ids)
    lines = [x for x in read_log(paths) if x.get("run_id") in parts]
    engines, warnings = _engines(lines)
    return {"engines": engines, "proxy": _proxy(lines, run_ids), "warnings": warnings}


def engines_from_prometheus(prom: Any, at: float, range_s: float, job: str) -> list[dict[str, Any]]:
    """The identities ``llmbench_engine_info`` held in the ``range_s`` before ``at`` (kind, version,
    model: the proxy's metrics carry no arguments)."""
    expr = (f'group by (engine, kind, version, model) (max_over_time(llmbench_engine_info{{job="{job}"}}'
            f"[{max(1, int(range_s))}s]))")
    out = []
    for s in prom.query(expr, at):
        m = s["metric"]
        out.append({"name": m.get("engine"), "kind": m.get("kind"), "version": m.get("version") or None,
                    "model": m.get("model") or None, "source": "prometheus"})
    return sorted(out, key=lambda e: (str(e["name"]), str(e["version"])))


def proxy_from_prometheus(prom: Any, at: float, range_s: float, job: str) -> dict[str, Any]:
    """The proxy block from ``llmbench_proxy_info`` in the ``range_s`` before ``at``: its version and
    config SHA-256 (a list where the proxies differ) and the run ids (each starts with its UTC start)."""
    expr = (f'group by (version, config_sha256, run_id) (max_over_time(llmbench_proxy_info{{job="{job}"}}'
            f"[{max(1, int(range_s))}s]))")
    seen = [s["metric"] for s in prom.query(expr, at)]
    return {"version": _one(sorted({m.get("version") or None for m in seen} - {None})),
            "config_sha256": _one(sorted({m.get("config_sha256") or None for m in seen} - {None})),
            "run_ids": sorted({m["run_id"] for m in seen if m.get("run_id")})}


def _window_runs(records: Sequence[Mapping[str, Any]], lines: Sequence[Mapping[str, Any]], start: float,
                 end: float) -> list[str]:
    """The runs with a request, or an engine event, inside ``start``..``end``, in time order."""
    runs: dict[str, float] = {}
    for r in records:
        if r.get("start_unix") is None or not r.get("run_id"):
            continue
        begin = float(r["start_unix"])
        if begin <= end and begin + float(r.get("e2e_s") or 0.0) >= start:
            runs[str(r["run_id"])] = min(runs.get(str(r["run_id"]), begin), begin)
    for x in lines:
        if x.get("run_id") and start <= float(x.get("unix") or 0.0) <= end:
            runs.setdefault(str(x["run_id"]), float(x["unix"]))
    return sorted(runs, key=lambda run: (runs[run], run))


def for_window(records_dir: Path | None, start: float, end: float, prom: Any = None, job: str = "") -> Identity:
    """``engines``, ``proxy`` and ``warnings`` of an evidence window: from the records directory's
    ``engines.jsonl`` (the runs with a request or an engine event inside the window), else from
    Prometheus's ``llmbench_engine_info`` over the window."""
    if records_dir is not None:
        from .merge import MergeError, load_records

        lines = read_log([records_dir])
        try:
            records = load_records(records_dir)
        except MergeError:
            records = []
        runs = _window_runs(records, lines, start, end)
        found = identity([records_dir], runs)
        if found["engines"]:
            return found
    else:
        found = {"engines": [], "proxy": {"version": None, "config_sha256": None, "run_ids": []}, "warnings": []}
    if prom is not None:
        found["engines"] = engines_from_prometheus(prom, end, end - start, job)
        if not found["proxy"].get("version"):  # no start line at hand: what the proxies said to Prometheus
            found["proxy"] = proxy_from_prometheus(prom, end, end - start, job)
    return found
