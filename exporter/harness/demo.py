"""``llm-bench-exporter demo``: the whole stack on one machine with simulated engines.

Starts a simulated SGLang and a simulated vLLM (the latter with a small ``empty_text``
rate, the seed's failure), the proxy in front of both with 8 simulated GPUs and a trace
capture, and a real Prometheus with the repo's config when one is installed.  Then it runs a
short plan against each engine in turn, like the seed, replays its own multi-turn traffic
against both as one more cell (``evidence trace``, ``load --trace``), writes the dashboards and
the round tables (with goodput and the rounds' noise), compares the two engines (``evidence
compare``), prints where everything is, and shuts every child down.

Also ``python -m exporter.demo [options]`` and ``python -m exporter.harness.demo [options]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from .cliutil import HelpFormatter, UserError, ensure_out_dir, fail, non_negative_float, positive_float, probability
from .demo_trace import BLOCK_SIZE, SCENARIO, capture_and_replay, fidelity, trace_tokenizer, traced_scenario
from .load import Driver
from .plan import Plan, PlanError, load_plan, scenario_names
from .stack import ENGINES, REPO_FILES, LocalStack
from .tables import round_table

__all__ = ["add_parser", "run_demo"]

#: A file that marks a directory as the demo's own output, which a later demo may clear.
MARKER = ".llmbench-demo"


#: the widest line the demo prints as prose (tables keep their rows whole)
WIDTH = 120


def table_row(line: str) -> bool:
    """A row of a table: a Markdown row, or columns aligned with runs of spaces (two runs or more)."""
    body = line.strip()
    return body.startswith("|") or len(re.findall(r"\S {2,}(?=\S)", body)) >= 2


def fit(msg: str, width: int = WIDTH) -> str:
    """``msg`` with each prose line longer than ``width`` wrapped at spaces, its continuation indented
    two more than the line (or under the text after an aligned label, ``records:    PATH``); table
    rows (:func:`table_row`) whole."""
    out = []
    for line in msg.split("\n"):
        if len(line) <= width or table_row(line):
            out.append(line)
            continue
        body = line.lstrip(" ")
        indent = line[: len(line) - len(body)]
        label = re.match(r"\S+ {2,}", body)
        more = indent + (" " * label.end() if label else "  ")
        out.append(textwrap.fill(body, width=width, initial_indent=indent, subsequent_indent=more,
                                 break_long_words=False, break_on_hyphens=False))
    return "\n".join(out)


def _say(msg: str) -> None:
    print(fit(msg), flush=True)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _prepare_out(path: str, keep: bool) -> Path:
    """``--out``: cleared when it is an earlier demo's output, refused when it holds other files."""
    out = Path(path).resolve()
    if out.is_dir() and not keep and any(out.iterdir()):
        if not ((out / MARKER).exists() or (out / "stack.yaml").exists() and (out / "logs").is_dir()):
            raise UserError(f"--out {out} holds files that are not an earlier demo's output: "
                            "choose another directory, or add --keep-output to write beside them")
        shutil.rmtree(out)
    ensure_out_dir(out)
    (out / MARKER).write_text("written by llm-bench-exporter demo; a later demo may clear this directory\n",
                              encoding="utf-8")
    return out


def _write_dashboards(out: Path) -> Path | None:
    try:
        from dashboards.boards import write_all
    except ImportError:
        return None
    target = out / "dashboards"
    write_all(target)
    return target


def _evidence(prom_url: str | None, window: str, out: Path) -> tuple[Path | None, str | None]:
    """The evidence tool on the demo's own window, while Prometheus still runs: the export's
    directory (None without Prometheus) and the proxy-side headline tables."""
    from exporter.evidence.export import ExportError, export
    from exporter.evidence.promapi import PromError, Prometheus
    from exporter.evidence.summarize import load_records, summarize, write_summary
    from exporter.evidence.summary_md import headline_markdown
    from exporter.evidence.windows import parse_window

    prom = Prometheus(prom_url) if prom_url else None
    exported = None
    records = out / "records"
    try:
        summary = summarize(load_records(records), prom, records_dirs=[records])
        write_summary(summary, out / "summary")
        for line in summary.get("warnings") or []:  # e.g. rounds whose timing uncertainty is high
            _say(line)
        _llmd_reports(records, out / "llm-d", prom)
        if prom is not None:
            export(prom, parse_window(window), out / "evidence", progress=False, records=records)
            exported = out / "evidence"
    except (ExportError, PromError, OSError, ValueError) as exc:
        _say(f"evidence failed: {exc}")
        return exported, None
    return exported, headline_markdown(summary, width=WIDTH)  # its tables split to fit the terminal


def _llmd_reports(records: Path, out: Path, prom: Any = None) -> None:
    """``evidence report --format llm-d``: one llm-d Benchmark Report per engine and round, each naming
    the simulated engine's version and arguments (with Prometheus, its own time series too)."""
    from exporter.evidence.llmd import write_reports
    from exporter.evidence.merge import load_records

    out.mkdir(parents=True, exist_ok=True)
    write_reports(records, out, load_records(records), prom=prom)


def _compare(out: Path) -> Path | None:
    """``evidence compare`` of the two engines, from the proxy's one records directory."""
    try:
        from exporter.evidence.compare import CompareError, compare_dirs
        from exporter.evidence.merge import MergeError
        from exporter.evidence.outdir import OutDirError
    except ImportError:
        _say("compare: skipped (exporter.evidence.compare is not installed)")
        return None
    records = out / "records"
    try:
        compare_dirs(records, records, out / "compare", label_a=ENGINES[0], label_b=ENGINES[1])
    except (CompareError, MergeError, OutDirError, OSError) as exc:
        _say(f"compare failed: {exc}")
        return None
    return out / "compare"


def _html_report(out: Path, prom_url: str | None, plan: str, summaries: list[dict[str, Any]]) -> Path | None:
    """``evidence report --format html`` of the demo's run: the seed's report, one page."""
    from exporter.evidence.merge import MergeError
    from exporter.evidence.outdir import OutDirError
    from exporter.evidence.promapi import PromError, Prometheus
    from exporter.evidence.report.cells import CellsError
    from exporter.evidence.report.write import ReportError, ReportOptions, write_report
    from exporter.evidence.tokens import TokenizerError, load_vocabulary

    stops = [{**stop, "engine": s.get("engine")} for s in summaries for stop in s.get("stops") or []]
    try:
        named = out / "sim-tokenizer"
        vocabulary = load_vocabulary(named) if (named / "tokenizer.json").exists() else None
        write_report(ReportOptions([out / "records"], out / "report", "html", prom=Prometheus(prom_url) if prom_url
                                   else None, plan=Path(plan), vocabulary=vocabulary, stops=stops))
    except (CellsError, MergeError, OutDirError, PromError, ReportError, TokenizerError, OSError, ValueError) as exc:
        _say(f"report failed: {exc}")
        return None
    return out / "report" / "report.html"


def _empty_200s(out: Path) -> list[str]:
    """What the simulated vLLM generated in its empty-text 200s, from their captures (the proxy
    asked it for its token ids), named by the simulated vocabulary: the seed's diagnosis."""
    from exporter.evidence.merge import MergeError, load_records

    records = out / "records"
    try:
        loaded = load_records(records)
    except MergeError:  # no records: nothing to diagnose
        return []
    empty = [r for r in loaded if r.get("reason") == "empty_text" and r.get("capture")]
    if not empty:
        return []
    shown = "what the engine generated" if len(empty) <= 3 else "the first 3, what the engine generated"
    lines = [f"empty 200s: {len(empty)} (HTTP 200, [DONE], usage, no visible text); {shown}:"]
    try:
        from exporter.evidence.decode import decode_capture
        from exporter.evidence.tokens import TokenizerError, load_vocabulary, summary_line

        from .sim_vocab import write_tokenizer
        named = out / "sim-tokenizer"  # the simulated model's tokenizer when the demo traced, else its vocabulary
        vocabulary = load_vocabulary(named if (named / "tokenizer.json").exists() else write_tokenizer(named))
    except (ImportError, TokenizerError) as exc:
        return lines + [f"  (not shown: {exc})"]
    for rec in empty[:3]:
        decoded = decode_capture(records / rec["capture"], vocabulary)
        tokens = decoded.get("tokens")
        lines.append(f"  {rec['id'][:12]}: " + ("no token ids in the capture" if tokens is None
                                                  else summary_line(tokens, limit=3)))
    capture = records / empty[0]["capture"]
    lines.append(f"  again: evidence decode {capture} --tokenizer {out / 'sim-tokenizer'}")
    return lines


def _start(stack: LocalStack, args: argparse.Namespace, plan: Plan, tokenizer: Path | None) -> str | None:
    """The engines, the proxy (with a trace capture when there is a ``tokenizer``) and (unless told not
    to, or missing) Prometheus; its URL."""
    scenarios = [*scenario_names(plan), *([SCENARIO] if tokenizer is not None else [])]
    stack.start(scenarios=scenarios, speed=args.speed, gpu=args.gpu, tokenizer=tokenizer, block_size=BLOCK_SIZE,
                vllm_faults=["--fault-empty-text", str(args.empty_text_rate)])
    if args.no_prometheus:
        _say("Prometheus: skipped (--no-prometheus)")
        return None
    try:
        prom_url = stack.start_prometheus()
    except FileNotFoundError:
        _say("Prometheus: no `prometheus` binary on PATH, going on without it. Get one with\n"
             "  apt-get install -y --no-install-recommends prometheus   (Debian/Ubuntu)\n"
             f"  and it will scrape with {stack.prom_config}")
        return None
    _say(f"Prometheus: {prom_url} (config {stack.prom_config})")
    return prom_url


def _drive(stack: LocalStack, plan: Plan, out: Path, plan_name: str) -> list[dict[str, Any]]:
    summaries = []
    for name in ENGINES:  # one engine after the other, like the seed
        _say(f"running plan {plan_name} against {name} ...")

        async def drive(engine: str = name) -> dict[str, Any]:
            async with Driver(f"{stack.proxy_url}/{engine}", out / "load" / engine, seed=11) as driver:
                await driver.check_scenarios(scenario_names(plan))  # the demo's config lists them all
                return await driver.run_plan(plan)

        summaries.append(asyncio.run(drive()))
    return summaries


def _report(out: Path, stack: LocalStack, tables: tuple[str | None, str], found: dict[str, Path | None],
            window: str, keep_running: bool) -> None:
    proxy_side, client_side = tables
    if proxy_side:
        _say("\n" + proxy_side + "\n")
    _say(client_side + "\n")
    for line in _empty_200s(out):
        _say(line)
    _say(f"records:    {out / 'records' / 'requests.jsonl'} (raw SSE of failures in {out / 'records' / 'captures'})")
    _say(f"tables:     {out / 'load'}/<engine>/rounds.csv, summary.json; {out / 'rounds.txt'}")
    if found["boards"]:
        _say(f"dashboards: {found['boards']} (import into Grafana, or use compose/)")
    _say(f"logs:       {stack.logs}")
    _say(f"summary:    {out / 'summary'}/summary.md (proxy-side round tables, load per round, steady windows)")
    if (out / "llm-d" / "manifest.json").exists():
        _say(f"llm-d:      {out / 'llm-d'}/ (one llm-d Benchmark Report 0.2.1 per engine and round, with the engine's "
             "time series where Prometheus ran; manifest.json)")
    if found["evidence"]:
        _say(f"evidence:   {found['evidence']}/EVIDENCE.md (PNG boards, CSV/JSON per panel, manifest.json)")
    if found["compare"]:
        _say(f"compare:    {found['compare']}/compare.md ({ENGINES[1]} against {ENGINES[0]}: better, worse or "
             "within noise per scenario and metric; CSV and one PNG per metric beside it)")
    if stack.prom_url and keep_running:
        _say(f"again:      evidence export --prometheus {stack.prom_url} --window {window} --out DIR")
    if found["report"]:
        _say(f"report:     {found['report']} (open it in a browser: the run's report, one page)")


def _replay(stack: LocalStack, out: Path, plan: Plan, tokenizer: Path | None) -> list[dict[str, Any]]:
    """The demo's own traffic replayed (:mod:`.demo_trace`): the replays' summaries, their table and how
    the replay, captured again, compares with the trace."""
    if tokenizer is None:
        return []
    from exporter.evidence.mooncake import TraceError
    from exporter.proxy.prompttokens import TokenizerError

    scenario = traced_scenario(plan)
    try:
        summaries = capture_and_replay(stack.proxy_url, out, tokenizer, scenario, ENGINES, _say)
    except (TraceError, TokenizerError, PlanError, OSError) as exc:
        _say(f"trace replay failed: {exc}")
        return []
    _say("\n" + round_table(summaries, width=WIDTH) + "\n")
    trace = out / "trace" / f"{scenario}.jsonl"
    for name in ENGINES:
        _say(fidelity(out, trace, name))
    return summaries


def _run(args: argparse.Namespace, out: Path, plan: Plan, stack: LocalStack) -> int:
    tokenizer, said = trace_tokenizer(out)
    _say(said)
    prom_url = _start(stack, args, plan, tokenizer)
    _say(f"proxy: {stack.proxy_url}  (metrics at /metrics)")
    started = time.time()
    summaries = _drive(stack, plan, out, args.plan)
    summaries += _replay(stack, out, plan, tokenizer)
    ended = time.time()
    time.sleep(args.settle)  # let Prometheus scrape the last counts
    (out / "summary.json").write_text(json.dumps(summaries, indent=2), encoding="utf-8")
    table = round_table(summaries, width=WIDTH)
    (out / "rounds.txt").write_text(table + "\n", encoding="utf-8")
    window = f"{int(started)},{int(ended + args.settle)}"
    exported, proxy_side = _evidence(prom_url, window, out)
    found = {"boards": _write_dashboards(out), "evidence": exported, "compare": _compare(out),
             "report": _html_report(out, prom_url, args.plan, summaries)}
    _report(out, stack, (proxy_side, table), found, window, args.keep_running)
    if args.keep_running:
        _say("stack left running; Ctrl-C stops it")
        while stack.alive():
            time.sleep(1)
    return 0


def run_demo(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops the stack as cleanly as Ctrl-C
    try:
        plan = load_plan(args.plan)
        out = _prepare_out(args.out, args.keep_output)
    except (PlanError, UserError) as exc:
        return fail("demo", exc)
    stack = LocalStack(out)
    try:
        return _run(args, out, plan, stack)
    except (RuntimeError, TimeoutError) as exc:  # a child that died or never got ready
        print(f"llm-bench-exporter demo: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    finally:
        stack.stop()


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="the whole stack on one machine with simulated engines",
                       formatter_class=HelpFormatter, description=__doc__.split("\n\n")[1].replace("\n", " "))
    p.add_argument("--out", metavar="DIR", default="demo-run",
        help="output directory; an earlier demo's output there is cleared")
    p.add_argument("--plan", metavar="FILE", default=str(REPO_FILES / "examples" / "plans" / "demo.yaml"),
        help="plan YAML")
    p.add_argument("--speed", metavar="FACTOR", type=positive_float, default=1.5,
                   help="simulated engines' speed factor: every time is divided by it")
    p.add_argument("--empty-text-rate", metavar="P", type=probability, default=0.02,
                   help="probability per request of the vLLM sim's empty_text fault, 0..1")
    p.add_argument("--gpu", metavar="off|nvml|sim:N", default="sim:8",
        help="GPU collector of the proxy: off | nvml | sim:N")
    p.add_argument("--settle", metavar="SECONDS", type=non_negative_float, default=6.0,
        help="seconds to wait for a last scrape")
    p.add_argument("--no-prometheus", action="store_true", help="do not start Prometheus (default: start it "
                                                                 "when a `prometheus` binary is on PATH)")
    p.add_argument("--keep-running", action="store_true", help="leave the stack up until Ctrl-C (default: stop "
                                                                "it when the plan is done)")
    p.add_argument("--keep-output", action="store_true", help="do not clear --out first (default: clear an "
                                                               "earlier demo's output)")
    p.set_defaults(func=run_demo)


if __name__ == "__main__":  # pragma: no cover - ``python -m exporter.harness.demo [options]``
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _parser = argparse.ArgumentParser(prog="llm-bench-exporter")
    add_parser(_parser.add_subparsers(dest="command", required=True))
    _args = _parser.parse_args(["demo", *sys.argv[1:]])
    sys.exit(_args.func(_args))
