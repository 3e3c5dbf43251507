"""What the harness of a real engine (``real_vllm``, ``real_sglang``) needs whatever the engine:
its venv's check, its server as a child process and that process's tree, its benchmark client
run to the end, and the proxy before it.

Used by the end-to-end tests (``tests/``) and the benchmarks (``bench/``), which import nothing
of each other.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Self

from exporter.harness.stack import Child, exporter_argv, free_port, wait_http

__all__ = ["proc_children", "proc_name", "venv_missing", "EngineServer", "run_client", "start_proxy"]


def proc_children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def proc_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def venv_missing(engine: str, venv: Path, probe: Sequence[str], what: str, env: Mapping[str, str],
                 install_script: str) -> str | None:
    """Why ``engine`` cannot run from ``venv`` (None when it can): no venv (``probe[0]``, a program
    of the venv, is missing), or one where ``probe`` (shown as ``what``) fails."""
    if not Path(probe[0]).exists():
        return f"no {engine} venv at {venv} (run {install_script})"
    done = subprocess.run(list(probe), capture_output=True, text=True, timeout=300, env={**os.environ, **env})
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return f"`{what}` fails in {venv} ({last}); run {install_script}"
    return None


class EngineServer:
    """An engine's server on a free loopback port, as a child process (its own process group,
    under ``timeout``), ready when ``/health`` answers 200.  A subclass names the engine, the
    environment it reads and its command line."""

    name: ClassVar[str]
    env: ClassVar[Mapping[str, str]]

    def __init__(self, model: Path, log_dir: Path, extra: Sequence[str] = ()) -> None:
        self.model = model
        # A port chosen here, not bound by the engine on port 0 and read back: its server runs
        # as a grandchild (under ``timeout``, after minutes of start-up), and the proxy's config
        # and the clients need the port before then.  A port taken meanwhile fails the start.
        self.port = free_port()
        self.log_dir = log_dir
        self.extra = list(extra)
        self.child: Child | None = None
        self.startup_s = 0.0
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def child_name(self) -> str:
        """The name of the child process of this start (its log is ``log_dir/NAME.log``)."""
        return self.name

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.child_name()}.log"

    def argv(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout_s: float = 600) -> Self:
        """Start (again, on the same port: the proxy and Prometheus keep their targets) and wait
        until ``/health`` answers 200."""
        t0 = time.monotonic()
        self.starts += 1
        self.child = Child(self.child_name(), ["timeout", "-s", "TERM", "3600", *self.argv()], self.log_dir,
                           env=self.env)
        try:
            wait_http(f"{self.url}/health", timeout_s, self.child)
        except (RuntimeError, TimeoutError) as exc:
            self.stop()
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{exc}\n--- {self.log_path.name} (tail) ---\n{tail}") from None
        self.startup_s = time.monotonic() - t0
        return self

    def alive(self) -> bool:
        return self.child is not None and self.child.proc.poll() is None

    def pids(self) -> list[int]:
        """The whole process tree: ``timeout``, the engine's server and its children."""
        assert self.child is not None
        pids, todo = [], [self.child.proc.pid]
        while todo:
            p = todo.pop()
            pids.append(p)
            todo += proc_children(p)
        return pids

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop(timeout_s=30)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_client(argv: Sequence[str], env: Mapping[str, str], log_path: Path, result_file: Path, what: str) -> str:
    """Run an engine's benchmark client to the end, its output in ``log_path``; the text of the
    result file it wrote."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        done = subprocess.run(list(argv), stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env},
                              timeout=960)
    if done.returncode != 0 or not result_file.exists():
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{what} exited with {done.returncode}:\n{tail}")
    return result_file.read_text()


def start_proxy(out: Path, engines: list[dict[str, Any]], **config: Any) -> tuple[Child, str]:
    """``llm-bench-exporter serve`` on a free loopback port (records in ``out/run``), ready."""
    import yaml

    port = free_port()  # serve refuses port 0 (its config takes 1-65535) and names no bound port
    path = out / "proxy.yaml"
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"listen": f"127.0.0.1:{port}", "records_dir": str(out / "run"),
                                    "engines": engines, **config}))
    proxy = Child("proxy", ["timeout", "-s", "TERM", "3600", *exporter_argv("serve", "--config", str(path))], out)
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", 60, proxy)
    except (RuntimeError, TimeoutError):
        proxy.stop()
        raise
    return proxy, f"http://127.0.0.1:{port}"
