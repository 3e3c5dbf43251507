"""``evidence trace``: a run's arrivals as a Mooncake trace, from the proxy's records (config ``trace``).

One JSON line per request in arrival order (the records' ``start_unix``):
``{"timestamp": MS, "input_length": N, "output_length": M, "hash_ids": [...]}``, where ``timestamp``
is whole milliseconds since the run's first arrival, ``input_length`` and ``output_length`` are the
engine's own ``prompt_tokens`` and ``completion_tokens``, and ``hash_ids`` numbers the records'
``prefix_hashes`` 0, 1, 2, ... in first-seen order (equal ids: equal prompt blocks, each chained to
the blocks before it).  Only successful requests, unless ``--all`` (then a failure without usage
takes the proxy's own token count and the length it asked for, or is left out).  Warm-ups
(scenario ``warmup``) are left out; ``--scenario NAME`` keeps one scenario's requests only (a
slice of a run: the demo replays its own multi-turn cell this way).

How many ids a line has: AIPerf's loader (``PromptGenerator._build_token_sequence`` in
``aiperf/dataset/generator/prompt.py``) builds ``len(hash_ids) - 1`` full blocks and a last one of
``input_length - (len(hash_ids) - 1) * block_size`` tokens, which must be 1..``block_size``: so
exactly ``ceil(input_length / block_size)`` ids.  Blocks the proxy could not hash (the engine
counted more tokens than the proxy's tokenizer; a request not traced) get fresh ids of their own;
hashes past that count are dropped.  The block size is not a field of the format: the note beside
the trace (``FILE.md``) gives it, with what is kept and what is not.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .merge import MergeError, load_many
from .runs import SKIP_SCENARIOS, RunError, run_of, runs_in

__all__ = ["DEFAULT_BLOCK_SIZE", "TraceError", "hash_id_count", "mooncake_lines", "write_trace", "note_text",
           "add_parser", "cmd_trace"]

#: AIPerf's default block size (``--isl-block-size``), and the proxy's ``trace.block_size``
DEFAULT_BLOCK_SIZE = 512


class TraceError(ValueError):
    """Records that give no trace as asked (one line: which runs or engines there are)."""


def hash_id_count(input_length: int, block_size: int) -> int:
    """Ids per line that AIPerf's mooncake_trace loader accepts: ``ceil(input_length / block_size)``."""
    return -(-input_length // block_size)


def _lengths(r: Mapping[str, Any], everything: bool) -> tuple[int, int] | None:
    """(input_length, output_length): the engine's usage; with ``--all`` a failure without it takes the
    proxy's token count and the fixed length asked for; None when the line cannot be written."""
    n_in, n_out = r.get("prompt_tokens"), r.get("completion_tokens")
    if everything:
        n_in = n_in if isinstance(n_in, int) else r.get("prefix_tokens")
        n_out = n_out if isinstance(n_out, int) else r.get("expected_tokens")
    if not isinstance(n_in, int) or not isinstance(n_out, int) or n_in < 1 or n_out < 0:
        return None
    return n_in, n_out


def _pick(records: Sequence[Mapping[str, Any]], run: str | None, engine: str | None,
          scenario: str | None = None) -> list[Mapping[str, Any]]:
    """The records of one run and one engine (refused when several and none is named), warm-ups out;
    with ``scenario``, that scenario's only."""
    runs = runs_in(records)
    if run is None and len(runs) > 1:
        raise TraceError(f"the records hold {len(runs)} runs ({', '.join(runs)}): pick one with --run ID")
    picked = [r for r in records if r.get("start_unix") is not None and r.get("scenario") not in SKIP_SCENARIOS
              and (run is None or run_of(r) == run or run in run_of(r).split("+"))
              and (scenario is None or r.get("scenario") == scenario)]
    if run is not None and not picked:
        raise RunError(f"--run {run}: no records of that run (runs there: {', '.join(runs) or 'none'})")
    if scenario is not None and not picked:
        names = sorted({str(r.get("scenario")) for r in records} - set(SKIP_SCENARIOS))
        raise TraceError(f"--scenario {scenario}: no requests of that scenario (scenarios there: "
                         f"{', '.join(names) if names else 'no requests at all'})")
    engines = sorted({str(r.get("engine")) for r in picked})
    if engine is None and len(engines) > 1:
        raise TraceError(f"the run holds {len(engines)} engines ({', '.join(engines)}): pick one with --engine NAME")
    return [r for r in picked if engine is None or r.get("engine") == engine]


def mooncake_lines(records: Sequence[Mapping[str, Any]], *, run: str | None = None, engine: str | None = None,
                   everything: bool = False, block_size: int | None = None,
                   scenario: str | None = None, sessions: bool = True) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The trace's lines and what the note says of them (counts, the block size, the run).  With ``sessions``
    (the default) the turns of a session after its first are written as AIPerf's multi-turn lines
    (:func:`_later_turn`); without, every request is a line of its own at its timestamp."""
    picked = sorted(_pick(records, run, engine, scenario), key=lambda r: float(r["start_unix"]))
    sizes = {r["trace_block_size"] for r in picked if isinstance(r.get("trace_block_size"), int)}
    if len(sizes) > 1:
        raise TraceError(f"the records were hashed with block sizes {sorted(sizes)}: one trace needs one")
    size = next(iter(sizes), None) or block_size or DEFAULT_BLOCK_SIZE
    if block_size is not None and block_size != size:
        raise TraceError(f"--block-size {block_size}: the records were hashed with blocks of {size} tokens")
    first = float(picked[0]["start_unix"]) if picked else 0.0
    ids: dict[str, int] = {}
    counter = itertools.count()
    lines, stats = [], {"requests": 0, "skipped": 0, "unhashed_blocks": 0, "untraced": 0, "blocks": 0}
    held: dict[str, tuple[str, Mapping[str, Any], tuple[int, int]]] = {}  # session: (trace id, last turn written)
    for r in picked:
        lengths = _lengths(r, everything) if everything or r.get("outcome") == "success" else None
        if lengths is None:
            stats["skipped"] += 1
            continue
        sid = r.get("session_id") if sessions and isinstance(r.get("session_id"), str) else None
        if sid is not None and sid in held:
            name, prev, prev_lengths = held[sid]
            later = _later_turn(r, lengths, prev, prev_lengths, size, counter)
            held[sid] = (name, r, lengths)
            lines.append({"session_id": name, **later})
            stats["blocks"] += len(later["hash_ids"])
            continue
        n = hash_id_count(lengths[0], size)
        hashes = [h for h in r.get("prefix_hashes") or [] if isinstance(h, str)][:n]
        line = [ids[h] if h in ids else ids.setdefault(h, next(counter)) for h in hashes]
        stats["unhashed_blocks"] += n - len(line)
        stats["untraced"] += not hashes
        line += [next(counter) for _ in range(n - len(line))]
        stats["blocks"] += n
        lines.append({"timestamp": round((float(r["start_unix"]) - first) * 1000), "input_length": lengths[0],
                      "output_length": lengths[1], "hash_ids": line})
        if sid is not None:
            held[sid] = (f"session-{len(held)}", r, lengths)
            lines[-1] = {"session_id": held[sid][0], **lines[-1]}
    stats["requests"] = len(lines)
    stats["sessions"] = len(held)
    runs = sorted({run_of(r) for r in picked})
    return lines, {**stats, "block_size": size, "distinct_ids": next(counter), "everything": everything,
                   "scenario": scenario,
                   "run": runs[0] if len(runs) == 1 else run, "engine": engine or next(iter({str(r.get("engine"))
                                                                                      for r in picked}), None)}


def _later_turn(r: Mapping[str, Any], lengths: tuple[int, int], prev: Mapping[str, Any],
                prev_lengths: tuple[int, int], size: int, counter: Iterator[int]) -> dict[str, Any]:
    """A session's later turn as AIPerf's multi-turn Mooncake line: no ``timestamp`` (AIPerf's fixed schedule
    would send it at that time, not after the previous answer), ``delay``: ms from the end of the previous
    turn written (its start plus its E2E) to this one's start, and ``input_length``: what the turn added to
    the history, the engine's prompt tokens less the previous turn's prompt and answer (1 at least), since
    AIPerf sends each turn's text after the history it keeps itself, the live answers included
    (``DELTAS_WITHOUT_RESPONSES``).  Its ``hash_ids`` are fresh: the added text shares no block."""
    end = float(prev["start_unix"]) + float(prev.get("e2e_s") or 0.0)
    added = max(1, lengths[0] - prev_lengths[0] - prev_lengths[1])
    return {"delay": max(0, round((float(r["start_unix"]) - end) * 1000)), "input_length": added,
            "output_length": lengths[1], "hash_ids": [next(counter) for _ in range(hash_id_count(added, size))]}


def _json_lines(lines: Sequence[Mapping[str, Any]]) -> Iterator[str]:
    for line in lines:
        yield json.dumps(line) + "\n"


def note_text(out: Path, facts: Mapping[str, Any], records: str) -> str:
    """The note beside the trace: the block size, what is kept, what is not, and that the key is gone."""
    size = facts["block_size"]
    which = "every request (--all)" if facts["everything"] else "successful requests only"
    lines = [
        f"# Mooncake trace {out.name}", "",
        f"- From the proxy's records {records}, run {facts['run']}, engine {facts['engine']}"
        f"{', scenario ' + str(facts['scenario']) if facts.get('scenario') else ''}: "
        f"{facts['requests']} requests, {which}, in arrival order; {facts['skipped']} left out "
        "(failed, or without the lengths a line needs).",
        f"- **Block size: {size} tokens.**  Each line has ceil(input_length / {size}) hash ids, as AIPerf's "
        f"mooncake_trace loader expects; replay with the same block size (AIPerf `--custom-dataset-type "
        f"mooncake_trace --isl-block-size {size}`, `llm-bench-exporter load --trace {out.name} --block-size {size}`, "
        "with `--tokenizer MODEL_DIR` for prompts of exactly `input_length` tokens as the engine counts them).",
        "- Kept: each request's arrival (`timestamp`, ms since the run's first arrival), the engine's own "
        "prompt and completion token counts (`input_length`, `output_length`), and `hash_ids`: equal ids are "
        "equal blocks of prompt tokens, each block's id standing for it and every block before it (a shared "
        f"prefix gives shared ids). {facts['distinct_ids']} distinct ids.",
        f"- {facts['unhashed_blocks']} blocks could not be hashed by the proxy (its tokenizer counted fewer "
        f"tokens than the engine, or the prompt was not traced: {facts['untraced']} requests) and have ids of "
        "their own, shared with nothing.",
        *([f"- **Sessions: {facts['sessions']}** (records with `session_id`), in AIPerf's multi-turn form: every turn "
           "carries `session_id` (renumbered `session-0`, `session-1`, ... in first-seen order); a session's first turn "
           "has its `timestamp` and its whole prompt; each later turn has no `timestamp` but `delay` (ms from the end "
           "of the previous turn's answer to this turn's start) and, as `input_length`, only what it added to the "
           "history (its prompt tokens less the previous turn's prompt and answer), with fresh hash ids; AIPerf "
           "and `load --trace` resend the history themselves, the live answers included."]
          if facts.get("sessions") else []),
        "- Not kept: no prompt or output text, no token ids, no hash: the proxy's keyed block hashes are "
        "renumbered here in first-seen order, and nothing else of them leaves the records.",
        "- The key: the proxy hashed each block with a key drawn at random for its run, held in its memory "
        "only and never written anywhere; it is gone with the proxy process, so no hash can be checked "
        "against a guessed prompt.",
    ]
    return "\n".join(lines) + "\n"


def write_trace(out: Path, lines: Sequence[Mapping[str, Any]], facts: Mapping[str, Any], records: str) -> Path:
    """Write the trace to ``out`` and its note to ``out`` + ``.md``; returns the note's path."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as fh:
        fh.writelines(_json_lines(lines))
    note = out.with_name(out.name + ".md")
    note.write_text(note_text(out, facts, records), encoding="utf-8")
    return note


def cmd_trace(args: argparse.Namespace) -> int:
    try:
        records, _ = load_many([Path(args.records)])
        lines, facts = mooncake_lines(records, run=args.run, engine=args.engine, everything=args.all,
                                      block_size=args.block_size, scenario=args.scenario,
                                      sessions=not args.no_sessions)
        if not lines:
            raise TraceError(f"no {'' if args.all else 'successful '}requests to write from {args.records}")
        note = write_trace(Path(args.out), lines, facts, args.records)
    except (MergeError, RunError, TraceError) as exc:
        print(f"evidence: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"evidence: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"{facts['requests']} requests, {facts['distinct_ids']} block ids, blocks of {facts['block_size']} tokens: "
          f"{args.out}; note: {note}")
    if facts["untraced"]:
        print(f"warning: {facts['untraced']} of {facts['requests']} requests carry no prefix hashes (the proxy's "
              "trace: config was off, or their prompt could not be tokenized): their blocks share nothing",
              file=sys.stderr)
    return 0


def add_parser(sub: Any) -> None:
    t = sub.add_parser("trace", help="a run's arrivals as a Mooncake trace (AIPerf, SGLang's bench, GuideLLM)",
                       description="Write the Mooncake trace of a run from the proxy's records: one JSON line per "
                                   "request in arrival order (timestamp in ms since the run's first arrival, the "
                                   "engine's input_length and output_length, hash_ids from the records' "
                                   "prefix_hashes, written by the proxy's trace: config), and a note beside it "
                                   "(FILE.md): the block size, what is kept and what is not.")
    t.add_argument("--records", required=True, metavar="DIR", help="records directory (or its requests.jsonl)")
    t.add_argument("--run", metavar="ID", help="the run (a run_id) to write (default: the records' only run; "
                                               "several are refused)")
    t.add_argument("--engine", metavar="NAME", help="the engine whose requests to write (default: the run's only "
                                                    "engine; several are refused)")
    t.add_argument("--scenario", metavar="NAME", help="only the requests of this scenario (default: every "
                                                      "scenario of the run but the warm-ups)")
    t.add_argument("--out", required=True, metavar="FILE", help="the trace (JSON lines); the note goes to FILE.md")
    t.add_argument("--all", action="store_true", help="every request, failures too (default: successful ones only)")
    t.add_argument("--no-sessions", action="store_true",
                   help="every request a line of its own at its timestamp, whole prompt (default: the turns of a "
                        "session after its first as AIPerf's multi-turn lines: session_id, delay, what each added)")
    t.add_argument("--block-size", type=int, metavar="N",
                   help=f"tokens per block, for records without hashes (default: the records' trace_block_size, "
                        f"else {DEFAULT_BLOCK_SIZE}); must match the records' when they have one")
    t.set_defaults(func=cmd_trace)
