"""A real SGLang (0.5.23, run on the CPU) for the tests: the tiny model, the server, its processes,
its own benchmark client.

The SGLang venv comes from ``.ci/install-sglang.sh`` (``$LLMBENCH_SGLANG_VENV``, default
``/tmp/llmbench-sglang-venv``), with an import-only stand-in for SGLang's kernel library (PyPI
has no CPU build of it): SGLang runs every layer on its plain-torch path, while what the proxy
talks to stays real (the HTTP server, the tokenizer, scheduler and detokenizer processes, the
SSE and usage formatting, the ``sglang:`` metrics).  The model is the one ``tests/vllm_engine.py``
builds (a random-weight two-layer llama, a BPE tokenizer trained here, a chat template), built by
the SGLang venv's Python.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests import vllm_engine

if TYPE_CHECKING:
    from exporter.harness.stack import Child

__all__ = ["INSTALL_SCRIPT", "SGLANG_ENV", "venv_dir", "sglang_bin", "sglang_missing", "require_sglang",
           "build_model", "SglangServer", "bench_serving_argv", "bench_serving"]

INSTALL_SCRIPT = ".ci/install-sglang.sh"
MAX_TOTAL_TOKENS = 4096
#: what SGLang reads: its CPU engine, no downloads, one thread per process (a 2-core machine
#: runs three of them beside the tests)
SGLANG_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
              "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "DO_NOT_TRACK": "1"}
#: what SGLang names its child processes (``setproctitle``)
SCHEDULER, DETOKENIZER = "sglang::scheduler", "sglang::detokenizer"


def venv_dir() -> Path:
    return Path(os.environ.get("LLMBENCH_SGLANG_VENV", "/tmp/llmbench-sglang-venv"))


def sglang_bin(name: str = "python") -> Path:
    return venv_dir() / "bin" / name


def sglang_missing() -> str | None:
    """Why SGLang cannot run here (None when it can): no venv, or one that cannot import it."""
    python = sglang_bin()
    if not python.exists():
        return f"no SGLang venv at {venv_dir()} (run {INSTALL_SCRIPT})"
    probe = subprocess.run([str(python), "-c", "import sgl_kernel, sglang.launch_server"], capture_output=True,
                           text=True, timeout=300, env={**os.environ, **SGLANG_ENV})
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return f"`import sglang.launch_server` fails in {venv_dir()} ({last}); run {INSTALL_SCRIPT}"
    return None


def require_sglang() -> None:
    """Skip without a working SGLang venv, unless CI demands one (LLMBENCH_REQUIRE_SGLANG=1)."""
    import pytest

    why = sglang_missing()
    if why:
        if os.environ.get("LLMBENCH_REQUIRE_SGLANG") == "1":
            pytest.fail(why)
        pytest.skip(why)


def build_model(out: Path, timeout_s: float = 600) -> Path:
    """The tiny model of ``tests/vllm_engine.py`` in ``out``, built by the SGLang venv's Python."""
    done = subprocess.run([str(sglang_bin()), vllm_engine.__file__, "build-model", str(out)], timeout=timeout_s,
                          env={**os.environ, **SGLANG_ENV}, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"building the model failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return out


class SglangServer:
    """``python -m sglang.launch_server`` on a free loopback port, as a child process (its own
    process group), started the way ``shared/reference/sglang-cpu`` ran it."""

    def __init__(self, model: Path, log_dir: Path, extra: Sequence[str] = ()) -> None:
        from exporter.harness.stack import free_port

        self.model = model
        self.port = free_port()
        self.log_dir = log_dir
        self.extra = list(extra)
        self.child: Child | None = None
        self.startup_s = 0.0
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"sglang-{self.starts}.log"

    def argv(self) -> list[str]:
        return [str(sglang_bin()), "-m", "sglang.launch_server", "--model-path", str(self.model),
                "--served-model-name", "tiny", "--device", "cpu", "--attention-backend", "torch_native",
                "--max-total-tokens", str(MAX_TOTAL_TOKENS), "--enable-metrics",
                # without it the scheduler spins a whole core while idle
                "--sleep-on-idle",
                "--host", "127.0.0.1", "--port", str(self.port), *self.extra]

    def start(self, timeout_s: float = 600) -> SglangServer:
        """Start (again, on the same port: the proxy and Prometheus keep their targets) and wait
        until ``/health`` answers 200, which SGLang gives only after its own warm-up request."""
        from exporter.harness.stack import Child, wait_http

        t0 = time.monotonic()
        self.starts += 1
        self.child = Child(f"sglang-{self.starts}", ["timeout", "-s", "TERM", "3600", *self.argv()], self.log_dir,
                           env=SGLANG_ENV)
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
        """The whole process tree: ``timeout``, the HTTP server (tokenizer manager) and its children."""
        assert self.child is not None
        pids, todo = [], [self.child.proc.pid]
        while todo:
            p = todo.pop()
            pids.append(p)
            todo += vllm_engine._proc_children(p)
        return pids

    def child_pid(self, title: str) -> int:
        """The child process SGLang titled ``title`` (:data:`SCHEDULER`, :data:`DETOKENIZER`)."""
        found = [p for p in self.pids() if vllm_engine._proc_name(p).strip() == title]
        if len(found) != 1:
            raise LookupError(f"{title}: {found} among {[(p, vllm_engine._proc_name(p)) for p in self.pids()]}")
        return found[0]

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop(timeout_s=30)

    def __enter__(self) -> SglangServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def bench_serving_argv(base_url: str, model_dir: Path, result_file: Path, *, input_len: int, output_len: int,
                       prompts: int, concurrency: int, seed: int = 0) -> list[str]:
    """SGLang's own client, ``python -m sglang.bench_serving --backend sglang-oai`` (streamed
    ``/v1/completions`` without ``stream_options``, ``ignore_eos``), on fixed-length random token
    ids, against ``base_url``; one line of JSON per run, with each request's TTFT, appended to
    ``result_file``.  Before the measured requests it sends one warm-up request."""
    return ["timeout", "900", str(sglang_bin()), "-m", "sglang.bench_serving", "--backend", "sglang-oai",
            "--base-url", base_url, "--model", "tiny", "--tokenizer", str(model_dir),
            "--dataset-name", "random-ids", "--random-input-len", str(input_len),
            "--random-output-len", str(output_len), "--random-range-ratio", "1", "--num-prompts", str(prompts),
            "--max-concurrency", str(concurrency), "--seed", str(seed), "--disable-tqdm",
            "--output-file", str(result_file), "--output-details"]


def bench_serving(base_url: str, model_dir: Path, result_dir: Path, **kwargs: Any) -> dict[str, Any]:
    """Run :func:`bench_serving_argv` to the end; its result (the last line of its output file)."""
    result_dir.mkdir(parents=True, exist_ok=True)
    log_path, result_file = result_dir / "bench.log", result_dir / "result.jsonl"
    with open(log_path, "wb") as log:
        done = subprocess.run(bench_serving_argv(base_url, model_dir, result_file, **kwargs), stdout=log,
                              stderr=subprocess.STDOUT, env={**os.environ, **SGLANG_ENV}, timeout=960)
    if done.returncode != 0 or not result_file.exists():
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"sglang.bench_serving exited with {done.returncode}:\n{tail}")
    result: dict[str, Any] = json.loads(result_file.read_text().splitlines()[-1])
    return result
