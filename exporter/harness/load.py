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
import json
import random
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from exporter.core.analysis import RequestSpec, StreamAnalyzer
from exporter.core.content import is_event_stream
from exporter.proxy.records import JsonlWriter
from exporter.proxy.transport import transport_reason

from .cliutil import (HelpFormatter, UserError, ensure_out_dir, fail, non_negative_int, positive_float,
                      positive_int)
from .plan import Cell, Plan, PlanError, Stage, cell_from_options, load_plan
from .preflight import check_base_url, check_url_syntax
from .runner import run_plan
from .tables import failure_summary, round_table, write_tables

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
                 seed: int = 0, label: str | None = None, timeout_s: float = 3600.0,
                 check_url: bool = False) -> None:
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
        self.first_error: str | None = None  # "reason: detail" of the first failed request
        self.check_url = check_url  # check the base URL before the first request (the CLI does)

    async def __aenter__(self) -> Driver:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=self.timeout_s, connect=10),
        )
        try:
            if self.check_url:
                await self.preflight()
            elif self.model is None:
                self.model = await self._discover_model()
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.session is not None:
            await self.session.close()
        if self.records is not None:
            self.records.close()

    async def preflight(self) -> None:
        """Check the base URL before the first request (a UserError tells what is wrong);
        take the model name from its /v1/models when none was given."""
        assert self.session is not None
        found = await check_base_url(self.session, self.base_url)
        if self.model is None:
            self.model = found or "default"

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
        if self.first_error is None and result.outcome != "success":
            self.first_error = f"{result.reason}: {result.detail}" if result.detail else str(result.reason)
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
        """Every stage in order (see :mod:`exporter.harness.runner`); writes the tables to
        ``out_dir`` when there is one and returns the summary."""
        summary = await run_plan(self, plan)
        summary["first_error"] = self.first_error
        if self.out_dir is not None:
            write_tables(self.out_dir, summary)
        return summary


def _plan_from_args(args: argparse.Namespace) -> Plan:
    if args.plan:
        return load_plan(args.plan)
    missing = [f for f in ("requests", "input_tokens", "output_tokens") if getattr(args, f) is None]
    if args.concurrency is None and args.rate is None:
        missing.append("concurrency or --rate")
    if missing:
        raise PlanError("without --plan, give --concurrency or --rate, --requests, --input-tokens and "
                        f"--output-tokens (missing: {', '.join('--' + m.replace('_', '-') for m in missing)})")
    cell = cell_from_options(scenario=args.scenario, input_tokens=args.input_tokens,
                             output_tokens=args.output_tokens, requests=args.requests,
                             concurrency=args.concurrency, rate=args.rate, rounds=args.rounds,
                             warmup=args.warmup, chat=args.chat)
    return Plan([Stage("adhoc", [cell], args.stop_after_failed_rounds)])


async def _drive(args: argparse.Namespace, plan: Plan, out: Path | None) -> dict[str, Any]:
    async with Driver(args.base_url, out, model=args.model or plan.model, seed=args.seed, label=args.label,
                      timeout_s=args.timeout, check_url=True) as driver:
        return await driver.run_plan(plan)


def cmd_load(args: argparse.Namespace) -> int:
    try:
        args.base_url = check_url_syntax(args.base_url)
        plan = _plan_from_args(args)
        out = ensure_out_dir(args.out) if args.out else None
        summary = asyncio.run(_drive(args, plan, out))
    except (UserError, PlanError) as exc:
        return fail("load", exc)
    except OSError as exc:
        if not args.out:
            raise
        return fail("load", f"cannot write under --out {args.out}: {exc.strerror or exc}")
    except KeyboardInterrupt:
        print("llm-bench-exporter load: interrupted", file=sys.stderr)
        return 130
    print(round_table([summary]))
    failures = failure_summary([summary])
    if out is not None:
        print(f"tables in {out}/rounds.csv and {out}/summary.json")
    if failures:
        print(failures)
    sent = sum(c["median"]["requests"] for c in summary["cells"])
    if sent and not sum(c["median"]["success"] for c in summary["cells"]):
        print(f"llm-bench-exporter load: no request succeeded; {failures}", file=sys.stderr)
        return 1
    return 0


_NEEDS = ("A run without --plan needs --concurrency C or --rate R, --requests N, --input-tokens I and "
          "--output-tokens O; a run with --plan takes every one of those from the plan file.")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("load", help="drive benchmark load (closed or open loop)", description=(
        "Closed-loop (--concurrency) or open-loop (--rate, Poisson arrivals) load against an OpenAI base "
        "URL, judged by the proxy's own rules.  " + _NEEDS), formatter_class=HelpFormatter)
    p.add_argument("--base-url", metavar="URL", required=True,
                   help="OpenAI base URL (required), e.g. http://127.0.0.1:9464/vllm through the proxy")
    p.add_argument("--scenario", metavar="NAME", default="adhoc", help="scenario label of the requests")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--concurrency", metavar="C", type=positive_int,
                      help="requests in flight at once, closed loop (default: none; without --plan give this "
                           "or --rate)")
    mode.add_argument("--rate", metavar="R", type=positive_float,
                      help="requests per second, Poisson arrivals, open loop (default: none; without --plan give "
                           "this or --concurrency)")
    p.add_argument("--requests", metavar="N", type=positive_int,
        help="requests per round (default: none; needed without --plan)")
    p.add_argument("--rounds", metavar="N", type=positive_int, default=1, help="rounds per scenario")
    p.add_argument("--warmup", metavar="N", type=non_negative_int, default=0, help="warm-up requests before the rounds")
    p.add_argument("--input-tokens", metavar="I", type=positive_int,
                   help="prompt length in tokens (words) (default: none; needed without --plan)")
    p.add_argument("--output-tokens", metavar="O", type=positive_int,
                   help="max_tokens of each request, with ignore_eos (default: none; needed without --plan)")
    p.add_argument("--chat", action="store_true", help="use /v1/chat/completions (default: /v1/completions)")
    p.add_argument("--plan", metavar="FILE",
        help="plan YAML: stages of cells and sweeps, see examples/plans/ (default: none; "
                                  "one cell from the options above)")
    p.add_argument("--stop-after-failed-rounds", metavar="K", type=positive_int,
                   help="stop after K consecutive rounds with a failed request (default: never)")
    p.add_argument("--model", metavar="NAME", help="model name (default: the plan's, else the first of /v1/models)")
    p.add_argument("--seed", metavar="N", type=int, default=0,
        help="seed of the prompts' words and the Poisson arrivals")
    p.add_argument("--timeout", metavar="SECONDS", type=positive_float, default=3600.0,
        help="seconds one request may take")
    p.add_argument("--label", metavar="NAME", help="engine name in the tables (default: the base URL's last path part, "
                                   "else host:port)")
    p.add_argument("--out", metavar="DIR",
        help="directory for requests.jsonl, rounds.csv, summary.json (default: none, "
                                 "nothing written)")
    p.set_defaults(func=cmd_load, concurrency=None)
