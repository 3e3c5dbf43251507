"""``evidence report --format llm-d``: one llm-d Benchmark Report (0.2.1) per run, engine,
scenario and round, from the proxy's records.

* ``run``: the run's id as the experiment (``eid``), the round's first request to its last
  end as its time;
* ``scenario.stack``: the engine as it said it was during the round (``engines.jsonl``: kind,
  version, model, its arguments under ``native.args``, redacted), and the proxy itself;
* ``scenario.load``: the load the proxy saw arrive (the round's load verdict, offered rate and
  in-flight figures; the client tool is not known to the proxy);
* ``results.request_performance.aggregate``: from the records, with the proxy's strict verdicts:
  ``total`` every request, ``failures`` the strict failures, ``incomplete`` the client aborts;
  TTFT, TPOT, NTPOT (E2E over completion tokens) and E2E of the successful requests; throughput
  of the successful requests over the round's duration (as ``evidence summarize`` has it);
* ``results.observability``: the proxy's timing uncertainty, engine-side timing where the records
  have it, each engine start the proxy saw in the run (time to ready) and, with ``--prometheus``,
  the engine's own time series over the round under ``components`` (:mod:`.llmd_series`);
* ``results.component_health``: the engine's downs and restarts during the round.

The statistics are exact (every request, the percentiles of :func:`exporter.core.stats.percentile`),
so a report's counts and latencies equal the records' and the summary's.  The output directory holds
the reports and one ``manifest.json`` (each report's SHA-256, the engines and the proxy).
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter import __version__
from exporter.core.timefmt import iso

from .experiment import round_load
from .identity import identity, read_log, run_parts
from .llmd_models import (
    PERCENTILES,
    VERSION,
    Accelerator,
    AggregateLatency,
    AggregatePerformance,
    AggregateRequests,
    AggregateThroughput,
    BenchmarkReport,
    Component,
    ComponentHealth,
    ComponentMetadata,
    ComponentNative,
    ComponentObservability,
    EngineModel,
    Generic,
    InferenceEngine,
    Load,
    LoadMetadata,
    LoadNative,
    LoadStandardized,
    Observability,
    Parallelism,
    PodStartup,
    PodStartupTimes,
    ReplicaHealth,
    RequestPerformance,
    Results,
    Run,
    RunTime,
    Scenario,
    SequenceLength,
    Statistics,
    Units,
    statistics_of,
)
from .llmd_series import DEFAULT_SCRAPE_S, engine_series
from .promapi import Prometheus
from .runs import RoundKey, group_rounds

__all__ = ["build_report", "write_reports", "statistics_of", "PERCENTILES"]

Record = Mapping[str, Any]
_ENGINE_TIMING = {"queue": "engine_queue_s", "prefill": "engine_prefill_s", "decode": "engine_decode_s",
                  "ttft_outside_engine": "ttft_outside_engine_s"}


def _vals(recs: Sequence[Record], key: str) -> list[float]:
    return [float(r[key]) for r in recs if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]


def _span(recs: Sequence[Record]) -> tuple[float, float]:
    starts = _vals(recs, "start_unix")
    ends = [float(r["start_unix"]) + float(r.get("e2e_s") or 0.0) for r in recs if r.get("start_unix") is not None]
    return (min(starts), max(ends)) if starts else (0.0, 0.0)


def _requests(recs: Sequence[Record], ok: Sequence[Record]) -> AggregateRequests:
    return AggregateRequests(
        total=len(recs), failures=sum(1 for r in recs if r.get("outcome") == "failure"),
        incomplete=sum(1 for r in recs if r.get("outcome") == "client_abort"),
        input_length=statistics_of(_vals(recs, "prompt_tokens"), "count"),
        output_length=statistics_of(_vals(ok, "completion_tokens"), "count"))


def _latency(ok: Sequence[Record]) -> AggregateLatency:
    ntpot = [float(r["e2e_s"]) / r["completion_tokens"] for r in ok
             if isinstance(r.get("e2e_s"), (int, float)) and isinstance(r.get("completion_tokens"), int)
             and r["completion_tokens"] > 0]
    return AggregateLatency(time_to_first_token=statistics_of(_vals(ok, "ttft_s"), "s"),
                            time_per_output_token=statistics_of(_vals(ok, "tpot_s"), "s/token"),
                            normalized_time_per_output_token=statistics_of(ntpot, "s/token"),
                            request_latency=statistics_of(_vals(ok, "e2e_s"), "s"))


def _throughput(ok: Sequence[Record], duration_s: float) -> AggregateThroughput | None:
    if duration_s <= 0:
        return None
    out_tokens, in_tokens = sum(_vals(ok, "completion_tokens")), sum(_vals(ok, "prompt_tokens"))

    def rate(x: float, units: Units) -> Statistics:
        return Statistics(units=units, mean=x / duration_s)
    return AggregateThroughput(output_token_rate=rate(out_tokens, "tokens/s"),
                               input_token_rate=rate(in_tokens, "tokens/s"),
                               total_token_rate=rate(out_tokens + in_tokens, "tokens/s"),
                               request_rate=rate(len(ok), "queries/s"))


def _seq(values: Sequence[float]) -> SequenceLength | None:
    if not values:
        return None
    lo, hi = int(min(values)), int(max(values))
    fixed = lo == hi
    return SequenceLength(distribution="fixed" if fixed else "other", value=statistics.fmean(values),
                          std_dev=None if fixed else statistics.pstdev(values), min=lo, max=max(hi, 1))


def _load(recs: Sequence[Record], ok: Sequence[Record], key: RoundKey, proxy: Mapping[str, Any]) -> Load | None:
    input_len = _seq(_vals(recs, "prompt_tokens"))
    if input_len is None:
        return None
    load = round_load(recs)
    verdict = str(load.get("load_verdict"))
    closed = re.fullmatch(r"closed-loop (\d+)", verdict)
    rate = load.get("offered_rate_rps")
    expected = _vals(recs, "expected_tokens")
    standardized = LoadStandardized(
        tool="unknown", tool_version="unknown", source="unknown", input_seq_len=input_len,
        output_seq_len=_seq(expected or _vals(ok, "completion_tokens")),
        rate_qps=rate if isinstance(rate, (int, float)) and rate > 0 else None,
        concurrency=int(closed.group(1)) if closed else None)
    text = (f"{key[2]} round {key[3]}: the load the proxy saw arrive ({verdict}"
            + (f", {rate:.4g} req/s offered" if isinstance(rate, (int, float)) else "") + "); measured by "
            f"llm-bench-exporter {proxy.get('version') or __version__}, the client tool is not known to it")
    return Load(metadata=LoadMetadata(cfg_id=_hash(standardized.model_dump(mode="json")), description=text),
                standardized=standardized, native=LoadNative(config={"measured_load": load}))


def _hash(doc: Any) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _parallelism(args: Mapping[str, Any] | None) -> Parallelism:
    args = args or {}
    par = (args.get("vllm_config") or {}).get("parallel_config") if isinstance(args.get("vllm_config"), dict) else None

    def num(*names: str) -> int:
        for src in (par or {}, args):
            for name in names:
                v = src.get(name)
                if isinstance(v, int) and not isinstance(v, bool) and v >= 1:
                    return v
        return 1
    return Parallelism(tp=num("tp_size", "tensor_parallel_size"), dp=num("dp_size", "data_parallel_size"),
                       pp=num("pp_size", "pipeline_parallel_size"), ep=num("ep_size", "expert_parallel_size"))


def _engine_component(name: str, ident: Mapping[str, Any] | None) -> Component:
    ident = ident or {}
    kind, version = ident.get("kind") or "unknown", ident.get("version") or "unknown"
    args = ident.get("server_args")
    config = {k: ident.get(k) for k in ("upstream", "root", "max_model_len", "model_info") if ident.get(k) is not None}
    meta = ComponentMetadata(label=name, cfg_id=_hash({k: ident.get(k) for k in ("kind", "version", "server_args")}),
                             description=f"engine {name}: {kind} {version}" + (
                                 f" at {ident['upstream']}" if ident.get("upstream") else ""))
    native = ComponentNative(args=args if isinstance(args, dict) else None, config=config or None)
    if kind not in ("vllm", "sglang"):
        return Component(metadata=meta, standardized=Generic(tool=kind, tool_version=version), native=native)
    par = _parallelism(args)
    engine = InferenceEngine(tool=kind, tool_version=version,
                             model=EngineModel(name=ident.get("model") or ident.get("root") or "unknown"),
                             accelerator=Accelerator(model="unknown", count=par.tp * par.pp * par.dp, parallelism=par))
    return Component(metadata=meta, standardized=engine, native=native)


def _proxy_component(proxy: Mapping[str, Any], run: str) -> Component:
    sha = proxy.get("config_sha256")
    return Component(
        metadata=ComponentMetadata(label="llm-bench-exporter", cfg_id=str(sha or "unknown"),
                                   description="the measuring proxy between the client and the engine"),
        standardized=Generic.model_validate({"tool": "llm-bench-exporter", "role": "measuring-proxy",
                                             "tool_version": str(proxy.get("version") or "unknown")}),
        native=ComponentNative(config={"config_sha256": sha, "run_id": run}))


def _identity_at(engines: Sequence[Mapping[str, Any]], run: str, engine: str, at: float) -> Mapping[str, Any] | None:
    """The engine's identity in force at ``at`` (the last one before it, else its first)."""
    mine = [e for e in engines if e.get("name") == engine and e.get("run_id") in run_parts([run])]
    before = [e for e in mine if float(e.get("since") or 0.0) <= at]
    if before:
        return before[-1]
    return mine[0] if mine else None


def _events(lines: Sequence[Mapping[str, Any]], run: str, engine: str) -> list[Mapping[str, Any]]:
    return [x for x in lines if x.get("run_id") in run_parts([run]) and x.get("engine") == engine]


@dataclass(frozen=True)
class Series:
    """Where the engines' own time series come from (``--prometheus``): the query API and its
    scrape interval."""

    prom: Prometheus
    scrape_s: float


def _observability(recs: Sequence[Record], ok: Sequence[Record], events: Sequence[Mapping[str, Any]],
                   engine: str, model: str | None, components: list[ComponentObservability] | None = None,
                   series_notes: Mapping[str, Any] | None = None) -> Observability:
    extra: dict[str, Any] = {"engine_series": series_notes} if series_notes is not None else {}
    unc = statistics_of(_vals(recs, "timing_uncertainty_s"), "s")
    if unc is not None:
        extra["proxy_timing_uncertainty"] = unc.model_dump(mode="json", exclude_none=True)
    timing = {k: statistics_of(_vals(ok, f), "s") for k, f in _ENGINE_TIMING.items()}
    if any(v is not None for v in timing.values()):
        sources = sorted({str(r["engine_timing"]) for r in ok if r.get("engine_timing")})
        extra["engine_timing"] = {"source": sources, **{k: v.model_dump(mode="json", exclude_none=True)
                                                        for k, v in timing.items() if v is not None}}
    pods = [PodStartup(name=engine, model=model, ready_timestamp=iso(float(x["ready_at"]), ms=True),
                       startup_seconds=x["time_to_ready_s"])
            for x in _ready_events(events) if isinstance(x.get("time_to_ready_s"), (int, float))]
    starts = PodStartupTimes(pods=pods, aggregate=statistics_of([p.startup_seconds or 0.0 for p in pods], "s"),
                             collected_at=iso(time.time())) if pods else None
    return Observability(components=components, pod_startup_times=starts, **extra)


def _ready_events(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each start the proxy saw (an ``up`` after a ``down``), its time to ready refined by a ``ready`` line."""
    out: list[dict[str, Any]] = []
    for x in events:
        if x.get("event") == "up" and x.get("seen_down"):
            out.append({"ready_at": x.get("ready_at") or x.get("unix"), "time_to_ready_s": x.get("time_to_ready_s")})
        elif x.get("event") == "ready" and out:
            out[-1]["time_to_ready_s"] = x.get("time_to_ready_s")
    return out


def _health(events: Sequence[Mapping[str, Any]], engine: str, start: float, end: float) -> list[ComponentHealth]:
    inside = [x for x in events if start <= float(x.get("unix") or 0.0) <= end]
    downs = sum(1 for x in inside if x.get("event") == "down")
    restarts = sum(1 for x in inside if x.get("event") == "up" and x.get("seen_down"))
    states = [x.get("event") for x in events if float(x.get("unix") or 0.0) <= end and x.get("event") in ("up", "down")]
    healthy = None if not states else states[-1] == "up"
    return [ComponentHealth(component_label=engine, total_restarts=restarts, failed_replicas=1 if downs else 0,
                            replica_health=[ReplicaHealth(replica_id=engine, restarts=restarts, healthy=healthy)])]


def build_report(key: RoundKey, recs: Sequence[Record], ident: Mapping[str, Any],
                 lines: Sequence[Mapping[str, Any]], series: Series | None = None) -> BenchmarkReport:
    """The report of one round (``key``: run, engine, scenario, round) from its records, the
    identity block of its run (:func:`.identity.identity`) and the run's ``engines.jsonl`` lines;
    with ``series``, the engine's own time series over the round (:mod:`.llmd_series`)."""
    run, engine, scenario, rnd = key
    ok = [r for r in recs if r.get("outcome") == "success"]
    start, end = _span(recs)
    engine_ident = _identity_at(ident["engines"], run, engine, start)
    kind = (engine_ident or {}).get("kind") or "unknown"
    events = _events(lines, run, engine)
    report_run = Run(uid=_hash(["llm-bench-exporter", run, engine, scenario, rnd]), eid=run,
                     description=f"{engine} ({kind} {(engine_ident or {}).get('version') or ''}".rstrip()
                                 + f"), scenario {scenario}, round {rnd}, measured by llm-bench-exporter",
                     keywords=list(dict.fromkeys([engine, kind, scenario, f"round {rnd}"])),
                     time=RunTime(start=iso(start, ms=True), end=iso(end, ms=True), duration=f"PT{end - start:.6f}S"))
    stack = [_engine_component(engine, engine_ident), _proxy_component(ident["proxy"], run)]
    performance = AggregatePerformance(requests=_requests(recs, ok), latency=_latency(ok),
                                       throughput=_throughput(ok, end - start))
    component, notes = engine_series(series.prom, engine, kind, start, end, series.scrape_s) \
        if series is not None else (None, None)
    results = Results(request_performance=RequestPerformance(aggregate=performance),
                      observability=_observability(recs, ok, events, engine, (engine_ident or {}).get("model"),
                                                   [component] if component is not None else None, notes),
                      component_health=_health(events, engine, start, end))
    return BenchmarkReport(run=report_run, scenario=Scenario(stack=stack, load=_load(recs, ok, key, ident["proxy"])),
                           results=results)


def _finite(doc: Any) -> Any:
    """``doc`` with NaN and infinities as null (they are not JSON)."""
    if isinstance(doc, float):
        return doc if doc == doc and doc not in (float("inf"), float("-inf")) else None
    if isinstance(doc, dict):
        return {k: _finite(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_finite(v) for v in doc]
    return doc


def _file_name(key: RoundKey) -> str:
    safe = [re.sub(r"[^A-Za-z0-9._-]+", "_", str(part)) for part in key]
    return "{}__{}__{}__round-{}.json".format(*safe)


def write_reports(records_dir: Path, out: Path, records: Sequence[Record],
                  extra: Mapping[str, Any] | None = None, prom: Prometheus | None = None) -> dict[str, Any]:
    """One report per run, engine, scenario and round of ``records`` (read from ``records_dir``)
    into the existing directory ``out``, then its ``manifest.json`` (with ``extra``); returns it.
    With ``prom``, each round's engine time series from it (PromError propagates)."""
    series = Series(prom, min(prom.scrape_intervals().values(), default=DEFAULT_SCRAPE_S)) if prom else None
    groups = group_rounds(records)
    runs = list(dict.fromkeys(k[0] for k in groups))
    ident = identity([records_dir], runs)
    lines = read_log([records_dir])
    entries = []
    for key, recs in groups.items():
        doc = _finite(build_report(key, recs, ident, lines, series).document())
        path = out / _file_name(key)
        data = (json.dumps(doc, indent=1, allow_nan=False) + "\n").encode("utf-8")
        path.write_bytes(data)
        entries.append({"path": path.name, "run_id": key[0], "engine": key[1], "scenario": key[2], "round": key[3],
                        "requests": len(recs), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    manifest = {"tool": "llm-bench-exporter evidence report", "version": __version__,
                "format": "llm-d benchmark report", "schema_version": VERSION, "created_utc": iso(time.time()),
                "records": str(records_dir), "reports": entries, **ident, **(extra or {})}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest
