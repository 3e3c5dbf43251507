"""A user's mistake gets one clear line and exit status 2, never a traceback (issue 12 item 3),
and every option's help shows its default (item 4).

Each case runs the CLI in a child process of its own, with its own stdout, stderr and exit
status.  The children are forked from this process after the commands' modules are imported
(a fresh interpreter per case would cost most of a second of imports each), and they run side
by side; a child reports an uncaught exception as the interpreter would, with a traceback.
``python -m`` itself is exercised by the tests at the end."""

from __future__ import annotations

import http.server
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CELL = "{scenario: a, input_tokens: 4, output_tokens: 2, requests: 2, concurrency: 1}"


@dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]
    cause: tuple[str, ...]  # each must appear in the message
    files: tuple[tuple[str, str], ...] = ()  # (relative path, text) written first
    usage: bool = False  # argparse's own error: the usage line, then the error line


PLANS = {
    "plan-1k": "stages: [{cells: [{scenario: a, input_tokens: 1k, output_tokens: 2, requests: 2, concurrency: 1}]}]",
    "plan-2.5": "stages: [{cells: [{scenario: a, input_tokens: 4, output_tokens: 2, requests: 2.5, concurrency: 1}]}]",
    "plan-default": f"default: {{rounds: 2}}\nstages: [{{cells: [{CELL}]}}]",
    "plan-stop": f"stages: [{{stop_after_failed_round: 3, cells: [{CELL}]}}]",
    "plan-nan": "stages: [{cells: [{scenario: a, input_tokens: 4, output_tokens: 2, requests: 2, rate: .nan}]}]",
    "plan-yaml": "stages: [\n",
}


def _cases(refused: int, busy: int, http404: int, proxy: int = 4, sim: int = 5) -> list[Case]:
    load = ("load", "--base-url")
    ok_url = f"http://127.0.0.1:{http404}"
    through = f"http://127.0.0.1:{proxy}/vllm"  # a real proxy that knows short-c1 and short-c32
    adhoc = ("--concurrency", "1", "--requests", "1", "--input-tokens", "4", "--output-tokens", "2")
    cases = [Case(f"load {name}", (*load, ok_url, "--plan", f"{name}.yaml"), cause, ((f"{name}.yaml", PLANS[name]),))
             for name, cause in [
                 ("plan-1k", ("stages.0.cells.0.input_tokens", "valid integer", "'1k'")),
                 ("plan-2.5", ("stages.0.cells.0.requests", "valid integer", "2.5")),
                 ("plan-default", ("default", "unknown key")),
                 ("plan-stop", ("stages.0.stop_after_failed_round", "unknown key")),
                 ("plan-nan", ("stages.0.cells.0.rate", "finite number")),
                 ("plan-yaml", ("not valid YAML",)),
             ]]
    cases += [
        Case("load missing plan", (*load, ok_url, "--plan", "nope.yaml"), ("nope.yaml", "no such file")),
        Case("load rate nan", (*load, ok_url, "--rate", "nan", "--requests", "1"), ("--rate", "finite"), usage=True),
        Case("load rate inf", (*load, ok_url, "--rate", "inf", "--requests", "1"), ("--rate", "finite"), usage=True),
        Case("load without --plan", (*load, ok_url, "--concurrency", "2"), ("without --plan", "--requests")),
        Case("load out under a file", (*load, ok_url, *adhoc, "--out", "afile/sub"),
             ("cannot create output directory afile/sub", "afile is a file"), (("afile", "x"),)),
        Case("load out not empty", (*load, through, "--scenario", "short-c1", *adhoc, "--out", "run1"),
             ("--out run1 is not empty", "--force"), (("run1/requests.jsonl", "{}\n"),)),
        Case("load unknown scenario", (*load, through, *adhoc), ("does not know the scenario adhoc (it would record it",
                                                                 "scenarios: in its config", "short-c1, short-c32")),
        Case("load plan unknown scenarios", (*load, through, "--plan", "p.yaml"),
             ("does not know the scenarios a, warmup", "'other'"),
             (("p.yaml", "stages: [{cells: [{scenario: short-c1, input_tokens: 4, output_tokens: 2, requests: 2, "
                         "concurrency: 1}, {scenario: a, input_tokens: 4, output_tokens: 2, requests: 2, rate: 1, "
                         "warmup: 1}]}]"),)),
        Case("load engine without proxy", (*load, f"http://127.0.0.1:{sim}", *adhoc),
             ("names no engine", "--no-proxy")),
        Case("load malformed url", (*load, "htp:/nowhere", *adhoc), ("malformed --base-url",)),
        Case("load trace without its tokenizer", (*load, ok_url, "--trace", "t.jsonl", "--tokenizer", "nope"),
             ("--tokenizer nope", "no tokenizer.json"),
             (("t.jsonl", '{"timestamp": 0, "input_length": 4, "output_length": 2, "hash_ids": [0]}\n'),)),
        Case("load refused", (*load, f"http://127.0.0.1:{refused}", *adhoc), ("connection refused",)),
        Case("load 404", (*load, f"{ok_url}/vllm", *adhoc), ("HTTP 404", "/vllm/v1/models", "path")),
        Case("sim busy port", ("sim", "--profile", "vllm", "--listen", f"127.0.0.1:{busy}"),
             (f"cannot listen on 127.0.0.1:{busy}", "in use")),
        Case("sim bad listen", ("sim", "--profile", "vllm", "--listen", "nowhere"), ("HOST:PORT",)),
        Case("sim speed nan", ("sim", "--profile", "vllm", "--speed", "nan"), ("--speed", "finite"), usage=True),
        Case("sim missing config", ("sim", "--profile", "vllm", "--config", "nope.yaml"), ("nope.yaml", "cannot read")),
        Case("sim config type", ("sim", "--profile", "vllm", "--config", "s.yaml"), ("speed", "finite number", "fast"),
             (("s.yaml", "speed: fast\n"),)),
        Case("demo missing plan", ("demo", "--plan", "nope.yaml"), ("nope.yaml", "no such file")),
        Case("demo out is a file", ("demo", "--out", "afile", "--plan", "p.yaml"), ("cannot create --out", "afile"),
             (("afile", "x"), ("p.yaml", f"stages: [{{cells: [{CELL}]}}]"))),
        Case("demo out holds other files", ("demo", "--out", "mine", "--plan", "p.yaml"),
             ("not an earlier demo's output", "--keep-output"),
             (("mine/notes.txt", "x"), ("p.yaml", f"stages: [{{cells: [{CELL}]}}]"))),
        Case("demo rate above 1", ("demo", "--empty-text-rate", "2"), ("--empty-text-rate", "between 0 and 1"),
             usage=True),
    ]
    return cases


Results = dict[str, tuple[Case, "Ran"]]


class _NotFound(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


def _child(argv: tuple[str, ...], cwd: Path, out: Path, err: Path) -> None:
    """In the forked child: fresh stdout/stderr files, no inherited log handlers, then the CLI;
    exits with its status, never returns."""
    import logging
    import traceback

    from exporter.cli import main

    status = 1
    try:
        os.chdir(cwd)
        for fd, path in ((1, out), (2, err)):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
        logging.root.handlers.clear()  # pytest's capture handlers would hide a logged traceback
        try:
            status = main(list(argv))
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - as the interpreter does: traceback, status 1
            traceback.print_exc()
            status = 1
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status)


def _run_all(cases: list[Case], base: Path, timeout_s: float = 60.0) -> dict[str, Ran]:
    import exporter.harness.demo  # noqa: F401 - every command's modules, imported once before forking
    import exporter.harness.load  # noqa: F401
    import exporter.harness.sim  # noqa: F401

    started: dict[int, tuple[Case, Path]] = {}
    for i, case in enumerate(cases):
        cwd = base / str(i)
        cwd.mkdir()
        for rel, text in case.files:
            (cwd / rel).parent.mkdir(parents=True, exist_ok=True)
            (cwd / rel).write_text(text)
        pid = os.fork()
        if pid == 0:
            _child(case.argv, cwd, base / f"{i}.out", base / f"{i}.err")
        started[pid] = (case, base / str(i))
    ran: dict[str, Ran] = {}
    deadline = time.monotonic() + timeout_s
    while started:
        for pid in list(started):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                case, where = started.pop(pid)
                ran[case.name] = Ran(os.waitstatus_to_exitcode(status), Path(f"{where}.out").read_text(),
                                     Path(f"{where}.err").read_text())
        if started and time.monotonic() > deadline:
            for pid in started:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            pytest.fail(f"no exit within {timeout_s:.0f} s: {[c.name for c, _ in started.values()]}")
        time.sleep(0.01)
    return ran


def _serve_404() -> tuple[int, int]:
    """An HTTP server that answers 404 to everything, in a forked child (no thread here: the
    cases are forked from this process); returns (port, pid)."""
    server = http.server.HTTPServer(("127.0.0.1", 0), _NotFound)
    pid = os.fork()
    if pid == 0:
        try:
            server.serve_forever()
        finally:
            os._exit(0)
    port = server.server_address[1]
    server.server_close()
    return int(port), pid


def _serve_proxy(records: Path) -> tuple[int, int, int]:
    """A simulated vLLM and the real proxy in front of it (scenarios short-c1 and short-c32), in
    a forked child; returns (proxy port, sim port, pid)."""
    from aiohttp import web

    from exporter.harness.sim import build_params, create_sim_app
    from exporter.proxy.app import create_app

    from tests.helpers import make_config

    socks = [socket.socket() for _ in range(2)]
    for sock in socks:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
    proxy_port, sim_port = (sock.getsockname()[1] for sock in socks)
    pid = os.fork()
    if pid == 0:
        try:
            import asyncio

            async def serve() -> None:
                for app, sock in ((create_sim_app(build_params("vllm", speed=50.0)), socks[1]),
                                  (create_app(make_config(records, sim_port)), socks[0])):
                    runner = web.AppRunner(app, access_log=None)
                    await runner.setup()
                    await web.SockSite(runner, sock).start()
                await asyncio.Event().wait()

            asyncio.run(serve())
        finally:
            os._exit(0)
    for sock in socks:
        sock.close()
    return proxy_port, sim_port, pid


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Results]:
    port_404, server = _serve_404()
    proxy, sim, stack = _serve_proxy(tmp_path_factory.mktemp("proxy"))
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    refused = socket.socket()  # bound and not listening: a connection is refused, and the port stays ours
    refused.bind(("127.0.0.1", 0))
    cases = _cases(refused.getsockname()[1], busy.getsockname()[1], port_404, proxy, sim)
    try:
        ran = _run_all(cases, tmp_path_factory.mktemp("cli"))
        yield {case.name: (case, ran[case.name]) for case in cases}
    finally:
        for pid in (server, stack):
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        busy.close()
        refused.close()


CASE_NAMES = [c.name for c in _cases(1, 2, 3)]


@pytest.mark.slow  # each case in a forked child
@pytest.mark.parametrize("name", CASE_NAMES)
def test_mistake_gives_one_clear_line(results: Results, name: str) -> None:
    case, proc = results[name]
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out, out
    lines = proc.stderr.strip().splitlines()
    message = lines[-1]
    for cause in case.cause:
        assert cause in message, f"{cause!r} not in {message!r}"
    if case.usage:
        assert lines[0].startswith("usage:") and "error: argument" in message
    else:
        assert len(lines) == 1, proc.stderr
        assert message.startswith(f"llm-bench-exporter {case.argv[0]}: ")


@pytest.mark.slow  # a forked child
@pytest.mark.parametrize("command", ["load", "demo", "sim"])
def test_every_option_shows_its_default(command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    proc = _run_all([Case(command, (command, "--help"), ())], tmp_path)[command]
    assert proc.returncode == 0, proc.stderr
    options = re.split(r"\n  (?=-)", proc.stdout.split("options:", 1)[1])
    options = [o for o in options if o.strip() and not o.lstrip().startswith("-h, --help")]
    assert len(options) >= 8
    for text in options:
        assert "default" in text or "(required)" in text, f"{command}: no default in {text.strip()!r}"
    if command == "load":
        assert "A run without --plan needs --concurrency C or --rate R, --requests N" in " ".join(proc.stdout.split())


@pytest.mark.slow  # a subprocess or a whole-tree tool: runs in the full suite
@pytest.mark.parametrize("module", ["exporter.harness.demo", "exporter.demo"])
def test_python_m_demo_is_the_demo_command(module: str) -> None:
    proc = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: llm-bench-exporter demo"), proc.stderr


@pytest.mark.slow  # forked children
def test_help_names_the_evidence_command_and_version_names_the_program(tmp_path: Path) -> None:
    from exporter import __version__

    ran = _run_all([Case("help", ("--help",), ()), Case("version", ("--version",), ())], tmp_path)
    text = " ".join(ran["help"].stdout.split())
    assert ran["help"].returncode == 0 and "`evidence --help`" in text and "evidence summarize" in text
    assert ".venv/bin/evidence" in text
    assert ran["version"].returncode == 0 and ran["version"].stdout == f"llm-bench-exporter {__version__}\n"


def test_evidence_help_names_the_other_command_without_markup(capsys: pytest.CaptureFixture[str]) -> None:
    from exporter import __version__
    from exporter.evidence.cli import main as evidence_main

    for argv in (["--help"], ["--version"]):
        with pytest.raises(SystemExit) as stop:
            evidence_main(argv)
        assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out and "llm-bench-exporter --help" in out
    assert out.rstrip().endswith(f"llm-bench-exporter {__version__}")
