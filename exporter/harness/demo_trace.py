"""The demo's own traffic, captured and replayed: the proxy of ``llm-bench-exporter demo`` runs with
``trace:`` (the simulated model's tokenizer, :func:`.sim_vocab.write_model_tokenizer`), the simulated
engines with ``--tokenizer``; after the plan, one cell of the run (the multi-turn sessions when the plan
has them: prefixes shared across turns) is written as a Mooncake trace (``evidence trace``), replayed
against both engines as one more cell (``load --trace --tokenizer``, scenario ``replay``), and the
replay, captured by the same proxy, is compared with the trace it replayed.

Without the ``trace`` extra (``tokenizers``, ``jinja2``) the demo runs without a trace and says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .load import PROMPT_WORDS, Driver
from .plan import Plan, Stage, cell_from_options

__all__ = ["SCENARIO", "BLOCK_SIZE", "trace_tokenizer", "traced_scenario", "capture_and_replay", "fidelity"]

#: the replay cell's scenario
SCENARIO = "replay"
#: tokens per hashed block in the demo (its prompts are short: AIPerf's 512 would share little)
BLOCK_SIZE = 64


def trace_tokenizer(out: Path) -> tuple[Path | None, str]:
    """The simulated model's tokenizer directory (``out/sim-tokenizer``), or None without the trace extra;
    and a line that says which."""
    try:
        import jinja2  # noqa: F401  (the trace extra's)
        import tokenizers  # noqa: F401
    except ImportError:
        return None, ("trace: skipped (the trace extra is not installed: pip install -e '.[trace]'): the proxy "
                      "captures no prefix hashes, and the demo replays no trace")
    from .sim_vocab import write_model_tokenizer

    path = write_model_tokenizer(out / "sim-tokenizer", PROMPT_WORDS)
    return path, f"trace: on (the proxy hashes each prompt in blocks of {BLOCK_SIZE} tokens, tokenizer {path})"


def traced_scenario(plan: Plan) -> str:
    """The cell whose traffic the demo replays: the first with sessions (shared prefixes), else the first."""
    cells = [c for stage in plan.stages for c in stage.cells]
    return next((c.scenario for c in cells if c.sessions is not None), cells[0].scenario)


def capture_and_replay(proxy_url: str, out: Path, tokenizer: Path, scenario: str, engines: Sequence[str],
                       say: Callable[[str], None]) -> list[dict[str, Any]]:
    """``evidence trace`` of ``scenario`` as the first engine served it (the demo injects faults into the
    other), then that trace replayed against every engine; returns the replays' summaries (their round
    table rows)."""
    from exporter.evidence.merge import load_many
    from exporter.evidence.mooncake import mooncake_lines, write_trace
    from exporter.proxy.prompttokens import PromptTokenizer

    records = out / "records"
    # one line per request (--no-sessions): whole prompts at their timestamps, so that the replay, captured
    # again, can be compared line for line with the trace
    lines, facts = mooncake_lines(load_many([records])[0], engine=engines[0], scenario=scenario, sessions=False)
    trace = out / "trace" / f"{scenario}.jsonl"
    write_trace(trace, lines, facts, str(records))
    say(f"trace:      {trace} ({len(lines)} requests of {scenario} on {engines[0]}, {facts['distinct_ids']} block "
        f"ids; note beside it); again: evidence trace --records {records} --engine {engines[0]} "
        f"--scenario {scenario} --no-sessions --out FILE")
    cell = cell_from_options(scenario=SCENARIO, input_tokens=None, output_tokens=None, requests=None,
                             trace=str(trace), block_size=facts["block_size"])
    plan = Plan([Stage("replay", [cell])])
    summaries = []
    for name in engines:
        say(f"replaying {trace.name} against {name} ...")

        async def drive(engine: str = name) -> dict[str, Any]:
            async with Driver(f"{proxy_url}/{engine}", out / "load" / f"{engine}-replay", seed=11,
                              tokenizer=PromptTokenizer(tokenizer)) as driver:
                await driver.check_scenarios([SCENARIO])
                return await driver.run_plan(plan)

        summaries.append(asyncio.run(drive()))
    return summaries


def fidelity(out: Path, trace: Path, engine: str) -> str:
    """The replay as the proxy captured it, against the trace replayed: lengths, prefix sharing, arrivals.
    Lines due at the same millisecond may arrive in either order, so the sharing is compared by what does
    not depend on that order: how many block ids, and how many blocks reuse an earlier request's.  A request
    that failed (the demo's injected empty 200s) is compared too, by the engine's usage (``--all``)."""
    import json

    from exporter.evidence.merge import load_many
    from exporter.evidence.mooncake import mooncake_lines

    want = [json.loads(x) for x in trace.read_text(encoding="utf-8").splitlines() if x.strip()]
    records = load_many([out / "records"])[0]
    got, _ = mooncake_lines(records, engine=engine, scenario=SCENARIO, everything=True, sessions=False)
    failed = sum(1 for r in records if r.get("engine") == engine and r.get("scenario") == SCENARIO
                 and r.get("outcome") != "success")
    same_lengths = sorted(_lengths(want)) == sorted(_lengths(got))
    shape = [_sharing(x) for x in (want, got)]
    stamps = [sorted(int(x["timestamp"]) for x in lines) for lines in (want, got)]
    late = max((abs(a - b) for a, b in zip(*stamps)), default=0)
    verdict = "the same" if same_lengths and shape[0] == shape[1] and len(got) == len(want) else "NOT the same"
    return (f"replay captured again ({engine}): {len(got)} of {len(want)} requests"
            f"{f' ({failed} failed, compared by their usage)' if failed else ''}, lengths "
            f"{'as in' if same_lengths else 'NOT as in'} the trace, {shape[1][0]} block ids with {shape[1][1]} "
            f"reused (trace: {shape[0][0]}, {shape[0][1]}): {verdict}; arrivals within {late} ms of the trace's")


def _lengths(lines: Sequence[Mapping[str, Any]]) -> list[tuple[int, int]]:
    return [(int(x["input_length"]), int(x["output_length"])) for x in lines]


def _sharing(lines: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """(distinct block ids, blocks whose id an earlier request had)."""
    seen: set[int] = set()
    reused = 0
    for line in lines:
        ids = list(line["hash_ids"])
        reused += sum(1 for h in ids if h in seen)
        seen.update(ids)
    return len(seen), reused
