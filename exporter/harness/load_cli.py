"""``llm-bench-exporter load``: the load driver's command line.

Before the first benchmark request it checks, in this order: the plan (or the options),
``--out`` (a non-empty directory is refused unless ``--force`` clears it, so that two runs
never mix in one requests.jsonl), the base URL (``GET /v1/models``) and, through the proxy,
that the proxy knows every scenario name the run will use (``GET /-/scenarios``; warm-ups
are labelled ``warmup``).  ``--no-proxy`` drives an engine directly and skips the last check.

A SIGINT (Ctrl-C) or SIGTERM cancels the run; on its way out the driver clears the scenario it
announced (``POST /-/scenario`` with ``null``), so that the next client's requests are not
labelled with it, and the command exits with 128 + the signal's number.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

from exporter.evidence.outdir import OutDirError, check_out, prepare_out
from exporter.proxy.prompttokens import PromptTokenizer, TokenizerError

from .cliutil import HelpFormatter, UserError, fail, non_negative_float, non_negative_int, positive_float, positive_int
from .endpoints import ENDPOINTS
from .load import Driver
from .plan import WARMUP, Plan, PlanError, Stage, cell_from_options, load_plan, scenario_names
from .preflight import check_url_syntax
from .tables import failure_summary, prompt_warnings, round_table

__all__ = ["add_parser", "cmd_load"]


def _plan_from_args(args: argparse.Namespace) -> Plan:
    if args.endpoint not in ("completions", "chat") and (args.plan or args.sessions or args.trace):
        raise PlanError(f"--endpoint {args.endpoint} drives single requests: not with --plan, --sessions or --trace")
    if args.plan:
        return load_plan(args.plan)
    needed = () if args.trace else ("input_tokens", "output_tokens") if args.sessions else (
        "requests", "input_tokens", "output_tokens")
    missing = [f for f in needed if getattr(args, f) is None]
    if args.concurrency is None and args.rate is None and not args.sessions and not args.trace:
        missing.append("concurrency or --rate")
    if missing:
        raise PlanError("without --plan, give --concurrency or --rate, --requests, --input-tokens and "
                        "--output-tokens, or --sessions N --turns T, --input-tokens and --output-tokens, "
                        f"or --trace FILE (missing: {', '.join('--' + m.replace('_', '-') for m in missing)})")
    replay = {k: v for k, v in (("trace", args.trace), ("speedup", args.speedup), ("block_size", args.block_size))
              if v is not None}  # a replayed trace (exporter.harness.replay)
    cell = cell_from_options(scenario=args.scenario, input_tokens=args.input_tokens,
                             output_tokens=args.output_tokens, requests=args.requests,
                             concurrency=args.concurrency, rate=args.rate, rounds=args.rounds,
                             warmup=args.warmup, chat=args.endpoint == "chat", sessions=args.sessions,
                             turns=args.turns,
                             think_time_s=args.think_time, tools=args.tools, **replay)
    return Plan([Stage("adhoc", [cell], args.stop_after_failed_rounds)])


def _tokenizer(path: str | None) -> PromptTokenizer | None:
    """``--tokenizer``: the engine's tokenizer; UserError when it cannot be read."""
    if path is None:
        return None
    try:
        return PromptTokenizer(Path(path))
    except TokenizerError as exc:
        raise UserError(f"--tokenizer {path}: {exc}") from None


def _check_framing(driver: Driver, plan: Plan, path: str | None) -> None:
    """With ``--tokenizer``, how the engine frames every cell's prompts (a trace's blocks, a plan cell's
    ``input_tokens``, a session's user text), measured and checked before the first request
    (:func:`.replay.framing`); UserError when the lengths cannot be exact."""
    try:
        for cell in (c for stage in plan.stages for c in stage.cells):
            if cell.trace is not None:  # a trace with sessions replays them in chat
                driver.replays.framing(cell.chat, cell.block_size)
                if driver.replays.has_sessions(cell.trace, cell.requests):
                    driver.replays.framing(True, cell.block_size)
            driver.replays.ready(cell.chat, cell.sessions is not None, cell.trace)  # a plan cell's, a session's
    except TokenizerError as exc:
        raise UserError(f"--tokenizer {path}: {exc}") from None


class Interrupted(Exception):
    """``load`` stopped by a signal; the message says what became of its announcement."""

    def __init__(self, signum: int, cleared: str | None) -> None:
        self.signum = signum
        name = signal.Signals(signum).name
        super().__init__(f"interrupted ({name})" + (f"; {cleared}" if cleared else ""))


async def _drive(args: argparse.Namespace, plan: Plan, out: Path | None) -> dict[str, Any]:
    """Run the plan; a SIGINT or SIGTERM cancels it, and the driver clears the scenario it announced
    on its way out (:meth:`Driver.clear_announcement`) before :class:`Interrupted` is raised."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    got: list[int] = []

    def stop(signum: int) -> None:
        if not got and task is not None:
            got.append(signum)
            task.cancel()

    handled = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, stop, signum)
            handled.append(signum)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no such support
            pass
    driver = Driver(args.base_url, None, model=args.model or plan.model, seed=args.seed, label=args.label,
                    timeout_s=args.timeout, check_url=True, tokenizer=_tokenizer(args.tokenizer),
                    endpoint=args.endpoint)
    _check_framing(driver, plan, args.tokenizer)
    try:
        async with driver:
            if args.no_proxy:
                driver.direct()
            else:
                await driver.check_scenarios(scenario_names(plan))
            if out is not None:
                prepare_out(out, args.force)
                driver.write_to(out)
            return await driver.run_plan(plan)
    except asyncio.CancelledError:
        if got and task is not None:
            task.uncancel()  # the cancel was ours: the run ends as Interrupted, not cancelled
            raise Interrupted(got[0], driver.cleared) from None
        raise
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)


def _report(summary: dict[str, Any], out: Path | None) -> int:
    print(round_table([summary]))
    for warning in prompt_warnings([summary]):  # the prompts were not as long as asked, as the engine counts
        print(warning, file=sys.stderr)
    failures = failure_summary([summary])
    if out is not None:
        print(f"tables in {out}/rounds.csv and {out}/summary.json, each request in {out}/requests.jsonl")
    if failures:
        print(failures)
    sent = sum(c["median"]["requests"] for c in summary["cells"])
    if sent and not sum(c["median"]["success"] for c in summary["cells"]):
        print(f"llm-bench-exporter load: no request succeeded; {failures}", file=sys.stderr)
        return 1
    return 0


def cmd_load(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else None
    try:
        args.base_url = check_url_syntax(args.base_url)
        plan = _plan_from_args(args)
        if out is not None:
            check_out(out, args.force)
        summary = asyncio.run(_drive(args, plan, out))
    except (UserError, PlanError, OutDirError) as exc:
        return fail("load", exc)
    except OSError as exc:
        if out is None:
            raise
        return fail("load", f"cannot write under --out {out}: {exc.strerror or exc}")
    except Interrupted as exc:
        print(f"llm-bench-exporter load: {exc}", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:
        print("llm-bench-exporter load: interrupted", file=sys.stderr)
        return 130
    return _report(summary, out)


_NEEDS = ("A run without --plan needs --concurrency C or --rate R, --requests N, --input-tokens I and "
          "--output-tokens O (or --trace FILE alone: a Mooncake trace replayed at its own timestamps); a run "
          "with --plan takes every one of those from the plan file.")
_CHECKS = ("Through the proxy (http://HOST:PORT/<engine>) every scenario name the run uses, the plan's cells "
           f"and '{WARMUP}' for warm-ups, must be in the proxy config's scenarios: list, or the run is refused "
           "before its first request.  Progress goes to stderr: a bar on a terminal, else a line every 10 s.  "
           "The table is the load driver's own, client-side; the proxy's records are the primary numbers "
           "(evidence summarize).  Stopped by SIGINT (Ctrl-C) or SIGTERM, it clears the scenario it announced "
           "to the proxy before it exits (status 130 or 143).  The table shows each cell's prompt length asked "
           "('in tok') beside the one the engine counted ('prompt tok', from its usage); where they differ by more "
           "than 10 % a 'warning:' line on stderr says so (prompts are words unless --tokenizer).")


def _add_session_options(p: argparse.ArgumentParser) -> None:
    """``--sessions N --turns T [--think-time S] [--tools]``: a session cell (:mod:`.sessions`)."""
    p.add_argument("--sessions", metavar="N", type=positive_int,
                   help="N multi-turn chat sessions at once, each sending its whole history with X-Session-ID "
                        "(default: none, single requests); each round is N x --turns requests")
    p.add_argument("--turns", metavar="T", type=positive_int, default=1,
                   help="turns per session: each adds --input-tokens of user text and asks for --output-tokens")
    p.add_argument("--think-time", metavar="S", type=non_negative_float, default=0.0,
                   help="seconds a session waits between an answer and its next turn")
    p.add_argument("--tools", action="store_true",
                   help="sessions offer a tool and answer each tool call with a tool message, carried by the next "
                        "turn (default: no tools)")


def _add_trace_options(p: argparse.ArgumentParser) -> None:
    """``--speedup X``, ``--block-size N``: how a trace cell replays (:mod:`.replay`); ``--tokenizer PATH``:
    how long every prompt is, in the engine's tokens."""
    p.add_argument("--speedup", metavar="X", type=positive_float,
                   help="with --trace: its timestamps divided by X (default: 1, as recorded)")
    p.add_argument("--block-size", metavar="N", type=positive_int,
                   help="with --trace: tokens per hash id, as the trace's note says (default: the size its lines' "
                        "input_length and hash ids imply, else 512)")
    p.add_argument("--tokenizer", metavar="PATH",
                   help="the engine's tokenizer (its model directory or tokenizer.json; the trace extra), so that "
                        "each prompt is exactly --input-tokens (a plan cell's input_tokens, a trace line's "
                        "input_length) tokens as the engine counts them, its BOS and chat template included; a "
                        "session's turns add that many tokens of user text; a trace's blocks fall on its block "
                        "boundaries (default: none, one word per token: exact for the simulated engines only, a "
                        "real model's tokenizer counts more; the table's 'prompt tok' shows its count)")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("load", help="drive benchmark load (closed or open loop)", description=(
        "Closed-loop (--concurrency) or open-loop (--rate, Poisson arrivals) load against an OpenAI base "
        "URL, judged by the proxy's own rules.  " + _NEEDS + "  " + _CHECKS), formatter_class=HelpFormatter)
    p.add_argument("--base-url", metavar="URL", required=True,
                   help="OpenAI base URL (required), e.g. http://127.0.0.1:9464/vllm through the proxy")
    p.add_argument("--no-proxy", action="store_true",
                   help="--base-url is an engine itself: no scenario check, no round announcements "
                        "(default: the base URL must go through the proxy)")
    p.add_argument("--scenario", metavar="NAME", default="adhoc",
                   help="scenario label of the requests (the proxy config must list it)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--concurrency", metavar="C", type=positive_int,
                      help="requests in flight at once, closed loop (default: none; without --plan give this "
                           "or --rate)")
    mode.add_argument("--rate", metavar="R", type=positive_float,
                      help="requests per second, Poisson arrivals, open loop (default: none; without --plan give "
                           "this or --concurrency)")
    mode.add_argument("--trace", metavar="FILE",
                      help="replay a Mooncake trace (evidence trace writes one) open loop at its timestamps: "
                           "equal hash_ids give equal prompt blocks, output_length is max_tokens with ignore_eos; "
                           "--requests takes its first lines, each round replays it with text of its own "
                           "(default: none)")
    _add_trace_options(p)
    p.add_argument("--requests", metavar="N", type=positive_int,
                   help="requests per round (default: none; needed without --plan)")
    p.add_argument("--rounds", metavar="N", type=positive_int, default=1, help="rounds per scenario")
    p.add_argument("--warmup", metavar="N", type=non_negative_int, default=0,
                   help=f"warm-up requests before the rounds, labelled '{WARMUP}'")
    p.add_argument("--input-tokens", metavar="I", type=positive_int,
                   help="prompt length: words, or the engine's tokens with --tokenizer (default: none; needed "
                        "without --plan)")
    p.add_argument("--output-tokens", metavar="O", type=positive_int,
                   help="max_tokens of each request, with ignore_eos (default: none; needed without --plan)")
    p.add_argument("--endpoint", choices=ENDPOINTS, default="completions",
                   help="the endpoint each request goes to: /v1/completions, /v1/chat/completions, /v1/responses, "
                        "/v1/messages (streamed, the answer's length fixed), /v1/embeddings (the prompt embedded) "
                        "or /v1/rerank (four pieces of the prompt ranked)")
    p.add_argument("--chat", dest="endpoint", action="store_const", const="chat",
                   help="the same as --endpoint chat (default: off)")
    _add_session_options(p)
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
    p.add_argument("--label", metavar="NAME", help="engine name in the tables (default: the base URL's last path "
                                                   "part, else host:port)")
    p.add_argument("--out", metavar="DIR",
                   help="directory for requests.jsonl, rounds.csv, summary.json; refused when not empty "
                        "(default: none, nothing written)")
    p.add_argument("--force", action="store_true", help="clear a non-empty --out first (default: refuse it)")
    p.set_defaults(func=cmd_load, concurrency=None)
