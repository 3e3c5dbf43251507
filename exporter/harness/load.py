"""The load driver: closed-loop (concurrency) and open-loop (Poisson rate) benchmark rounds.

It judges every response with :mod:`exporter.core.analysis`, the same core the proxy uses, so
the driver and the proxy agree on TTFT, TPOT, E2E and success.  Each request carries
``X-Bench-Scenario``, ``X-Bench-Round`` and ``X-Request-Id``; before each round the driver
announces the scenario to the proxy (``POST /-/scenario``) when the base URL goes through
one, so the boards can show scenario windows.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import random
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import yaml

from exporter.core.content import is_event_stream
from exporter.core.analysis import RequestSpec, StreamAnalyzer
from exporter.proxy.records import JsonlWriter
from exporter.core.stats import median_of_rounds, round_row
from exporter.proxy.config import DEFAULT_SLO
from exporter.proxy.transport import transport_reason

__all__ = ["Cell", "Stage", "Plan", "Driver", "load_plan", "make_prompt", "add_parser"]

_VOCAB = (
    "time person year way day thing man world life hand part child eye woman place work week case "
    "point government company number group problem fact water room mother area money story month "
    "lot right study book job word business issue side kind head house service friend father power "
    "hour game line end member law car city community name president team minute idea kid body "
    "information back parent face others level office door health art war history party result "
    "change morning reason research girl guy moment air teacher force education"
).split()


def make_prompt(rng: random.Random, words: int) -> str:
    """``words`` random words: exactly ``words`` tokens for the simulated engines."""
    return " ".join(rng.choice(_VOCAB) for _ in range(words))


@dataclass(frozen=True)
class Cell:
    """One scenario: a request shape and a load level, run as warm-up then rounds."""

    scenario: str
    input_tokens: int
    output_tokens: int
    requests: int
    concurrency: int | None = None
    rate: float | None = None
    rounds: int = 1
    warmup: int = 0
    chat: bool = False

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError(f"{self.scenario}: give exactly one of concurrency and rate")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"{self.scenario}: concurrency must be >= 1")
        if self.rate is not None and self.rate <= 0:
            raise ValueError(f"{self.scenario}: rate must be > 0")
        if min(self.input_tokens, self.output_tokens, self.requests, self.rounds) < 1 or self.warmup < 0:
            raise ValueError(f"{self.scenario}: tokens, requests and rounds must be >= 1")


@dataclass(frozen=True)
class Stage:
    name: str
    cells: list[Cell]
    stop_after_failed_rounds: int | None = None  # stop after K consecutive rounds with a failure


@dataclass(frozen=True)
class Plan:
    stages: list[Stage]
    model: str | None = None


def load_plan(path: str | Path) -> Plan:
    """Read a plan YAML: ``stages: [{name, stop_after_failed_rounds?, cells: [...]}]``."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("stages"), list):
        raise ValueError(f"{path}: expected a mapping with a 'stages' list")
    defaults = data.get("defaults") or {}
    stages = []
    for i, st in enumerate(data["stages"]):
        if not isinstance(st, dict) or not isinstance(st.get("cells"), list):
            raise ValueError(f"{path}: stages.{i}: expected a mapping with a 'cells' list")
        cells = []
        for j, c in enumerate(st["cells"]):
            try:
                cells.append(Cell(**{**defaults, **c}))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{path}: stages.{i}.cells.{j}: {exc}") from None
        stages.append(Stage(str(st.get("name", f"stage{i}")), cells, st.get("stop_after_failed_rounds")))
    return Plan(stages, data.get("model"))


@dataclass
class _Progress:
    label: str
    total: int
    done: int = 0
    failed: int = 0
    enabled: bool = field(default_factory=lambda: sys.stderr.isatty())

    def tick(self, ok: bool) -> None:
        self.done += 1
        self.failed += 0 if ok else 1
        if self.enabled:
            width = 30
            fill = int(width * self.done / max(1, self.total))
            sys.stderr.write(f"\r{self.label:<28} [{'#' * fill}{'.' * (width - fill)}] "
                             f"{self.done}/{self.total} failed {self.failed}")
            if self.done == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


class Driver:
    """Sends benchmark requests to one OpenAI base URL and keeps their records."""

    def __init__(self, base_url: str, out_dir: Path | None = None, *, model: str | None = None,
                 seed: int = 0, label: str | None = None, timeout_s: float = 3600.0) -> None:
        self.base_url = base_url.rstrip("/")
        parts = urlsplit(self.base_url)
        segs = [s for s in parts.path.split("/") if s]
        self.engine = segs[-1] if segs else None
        root_path = "/".join(segs[:-1])
        self.proxy_root = urlunsplit((parts.scheme, parts.netloc, "/" + root_path if root_path else "", "", ""))
        self.label = label or self.engine or parts.netloc
        self.model = model
        self.rng = random.Random(seed)
        self.out_dir = out_dir
        self.records = JsonlWriter(out_dir / "requests.jsonl") if out_dir else None
        self.timeout_s = timeout_s
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Driver:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=self.timeout_s, connect=10),
        )
        if self.model is None:
            self.model = await self._discover_model()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.session is not None:
            await self.session.close()
        if self.records is not None:
            self.records.close()

    async def _discover_model(self) -> str:
        assert self.session is not None
        try:
            async with self.session.get(f"{self.base_url}/v1/models") as r:
                doc = await r.json(content_type=None)
                return str(doc["data"][0]["id"])
        except (aiohttp.ClientError, ValueError, KeyError, IndexError, TypeError, TimeoutError):
            return "default"

    async def announce(self, scenario: str | None, round_: int) -> None:
        """Tell the proxy which scenario round is running; a direct engine ignores this."""
        if self.engine is None or self.session is None:
            return
        try:
            async with self.session.post(f"{self.proxy_root}/-/scenario",
                                         json={"scenario": scenario, "round": round_, "engine": self.engine},
                                         timeout=aiohttp.ClientTimeout(total=5)) as r:
                await r.read()
        except (aiohttp.ClientError, TimeoutError):
            pass

    def body(self, cell: Cell) -> dict[str, Any]:
        prompt = make_prompt(self.rng, cell.input_tokens)
        body: dict[str, Any] = {
            "model": self.model, "max_tokens": cell.output_tokens, "ignore_eos": True,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
        }
        if cell.chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return body

    async def one(self, cell: Cell, scenario: str, round_: int) -> dict[str, Any]:
        """Send one request; return its record, judged by the shared core."""
        assert self.session is not None
        body = json.dumps(self.body(cell)).encode()
        spec = RequestSpec.from_body(body)
        rid = uuid.uuid4().hex
        path = "/v1/chat/completions" if cell.chat else "/v1/completions"
        headers = {"Content-Type": "application/json", "X-Bench-Scenario": scenario,
                   "X-Bench-Round": str(round_), "X-Request-Id": rid}
        wall = time.time()
        t0 = time.monotonic()
        analyzer: StreamAnalyzer | None = None
        proxy_id = None
        error = detail = None
        try:
            async with self.session.post(self.base_url + path, data=body, headers=headers) as resp:
                proxy_id = resp.headers.get("X-LLMBench-Request-Id")
                streaming = is_event_stream(resp.headers.get("Content-Type"), spec.stream)
                analyzer = StreamAnalyzer(t0, resp.status, spec, streaming=streaming)
                async for chunk in resp.content.iter_any():
                    analyzer.feed(chunk, time.monotonic())
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            error = transport_reason(exc)
            detail = (f"no complete response within {self.timeout_s} s" if error == "timeout"
                      else f"{type(exc).__name__}: {exc}")
        if analyzer is None:
            analyzer = StreamAnalyzer(t0, None, spec, streaming=True)
        result = analyzer.finish(time.monotonic(), error, detail)
        record = {"id": rid, "proxy_id": proxy_id, "engine": self.label, "scenario": scenario,
                  "round": round_, "start_unix": round(wall, 6), **result.as_dict()}
        if self.records is not None:
            self.records.write(record)
        return record

    async def run_round(self, cell: Cell, scenario: str, round_: int, n: int) -> tuple[list[dict[str, Any]], float]:
        """``n`` requests at the cell's load level; returns (records, duration in seconds)."""
        progress = _Progress(f"{self.label} {scenario}#{round_}", n)
        records: list[dict[str, Any]] = []

        async def send() -> None:
            rec = await self.one(cell, scenario, round_)
            records.append(rec)
            progress.tick(rec["outcome"] == "success")

        start = time.monotonic()
        if cell.concurrency is not None:
            remaining = iter(range(n))

            async def worker() -> None:
                for _ in remaining:
                    await send()

            await asyncio.gather(*(worker() for _ in range(min(cell.concurrency, n))))
        else:
            assert cell.rate is not None
            tasks = []
            for i in range(n):
                if i:
                    await asyncio.sleep(self.rng.expovariate(cell.rate))
                tasks.append(asyncio.create_task(send()))
            await asyncio.gather(*tasks)
        return records, time.monotonic() - start

    async def run_plan(self, plan: Plan) -> dict[str, Any]:
        """Every stage in order; a stage stops after K consecutive rounds with a failure."""
        all_rows: list[dict[str, Any]] = []
        cells_out, stops = [], []
        for stage in plan.stages:
            streak = 0
            for cell in stage.cells:
                if stage.stop_after_failed_rounds and streak >= stage.stop_after_failed_rounds:
                    break
                rows: list[dict[str, Any]] = []
                if cell.warmup:
                    await self.announce("warmup", 0)
                    await self.run_round(cell, "warmup", 0, cell.warmup)
                for r in range(1, cell.rounds + 1):
                    await self.announce(cell.scenario, r)
                    records, duration = await self.run_round(cell, cell.scenario, r, cell.requests)
                    row = {"engine": self.label, "stage": stage.name, "scenario": cell.scenario,
                           "round": r, **round_row(records, duration, slo=DEFAULT_SLO)}
                    rows.append(row)
                    streak = streak + 1 if row["failures"] else 0
                    k = stage.stop_after_failed_rounds
                    if k and streak >= k:
                        stops.append({"stage": stage.name, "after": f"{cell.scenario}#{r}",
                                      "reason": f"{k} consecutive rounds with a failed request",
                                      "skipped": [c.scenario for c in stage.cells[stage.cells.index(cell) + 1:]]})
                        break
                await self.announce(None, 0)
                cells_out.append({"stage": stage.name, "cell": asdict(cell), "rounds": rows,
                                  "median": median_of_rounds(rows)})
                all_rows.extend(rows)
        summary = {"engine": self.label, "base_url": self.base_url, "model": self.model,
                   "cells": cells_out, "stops": stops}
        if self.out_dir is not None:
            write_tables(self.out_dir, all_rows, summary)
        return summary


ROUND_COLUMNS = (
    "engine", "stage", "scenario", "round", "requests", "success", "failures", "failure_reasons",
    "duration_s", "success_output_tokens", "output_throughput_tok_s", "ttft_p50_s", "ttft_p95_s",
    "tpot_p50_s", "tpot_p95_s", "e2e_p95_s", "slo_ttft_attainment", "slo_tpot_attainment", "slo_attainment",
)


def write_tables(out_dir: Path, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    """``rounds.csv`` (one row per round) and ``summary.json`` (medians, stops)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "rounds.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, ROUND_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow({**row, "failure_reasons": json.dumps(row.get("failure_reasons", {}), sort_keys=True)})
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")


def _plan_from_args(args: argparse.Namespace) -> Plan:
    if args.plan:
        return load_plan(args.plan)
    missing = [f for f in ("requests", "input_tokens", "output_tokens") if getattr(args, f) is None]
    if missing:
        raise ValueError("without --plan, give --requests, --input-tokens and --output-tokens "
                         f"(missing: {', '.join('--' + m.replace('_', '-') for m in missing)})")
    cell = Cell(scenario=args.scenario, input_tokens=args.input_tokens, output_tokens=args.output_tokens,
                requests=args.requests, concurrency=args.concurrency, rate=args.rate,
                rounds=args.rounds, warmup=args.warmup, chat=args.chat)
    return Plan([Stage("adhoc", [cell], args.stop_after_failed_rounds)])


def cmd_load(args: argparse.Namespace) -> int:
    try:
        plan = _plan_from_args(args)
    except ValueError as exc:
        print(f"llm-bench-exporter load: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else None

    async def go() -> dict[str, Any]:
        async with Driver(args.base_url, out, model=args.model or plan.model, seed=args.seed, label=args.label) as d:
            return await d.run_plan(plan)

    summary = asyncio.run(go())
    for cell in summary["cells"]:
        m = cell["median"]
        tput = m["output_throughput_tok_s"]
        ttft = m["ttft_p95_s"]
        print(f"{summary['engine']:>8} {cell['cell']['scenario']:<14} success {m['success']}/{m['requests']}"
              f"  throughput {tput if tput is None else round(tput, 2)} tok/s"
              f"  TTFT P95 {ttft if ttft is None else round(ttft, 3)} s")
    for stop in summary["stops"]:
        print(f"stage {stop['stage']} stopped after {stop['after']}: {stop['reason']}")
    if out is not None:
        print(f"tables in {out}/rounds.csv and {out}/summary.json")
    sent = sum(c["median"]["requests"] for c in summary["cells"])
    if sent and not sum(c["median"]["success"] for c in summary["cells"]):
        print("llm-bench-exporter load: no request succeeded", file=sys.stderr)
        return 1
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("load", help="drive benchmark load (closed or open loop)")
    p.add_argument("--base-url", required=True, help="OpenAI base URL, e.g. http://127.0.0.1:9464/vllm")
    p.add_argument("--scenario", default="adhoc")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--concurrency", type=int)
    mode.add_argument("--rate", type=float, help="requests per second, Poisson arrivals")
    p.add_argument("--requests", type=int, help="requests per round")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--warmup", type=int, default=0, help="warm-up requests before the rounds")
    p.add_argument("--input-tokens", type=int)
    p.add_argument("--output-tokens", type=int)
    p.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    p.add_argument("--plan", help="plan YAML (stages of cells)")
    p.add_argument("--stop-after-failed-rounds", type=int)
    p.add_argument("--model", help="model name (default: the first of /v1/models)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", help="engine name in the tables (default: the base URL's last path part, else host:port)")
    p.add_argument("--out", help="directory for requests.jsonl, rounds.csv, summary.json")
    p.set_defaults(func=cmd_load, concurrency=None)
