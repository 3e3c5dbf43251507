"""A real SGLang (0.5.23, run on the CPU) for the tests: its venv, the tiny model, the server and
its processes, its own benchmark client.

The SGLang venv comes from ``.ci/install-sglang.sh`` (``$LLMBENCH_SGLANG_VENV``, default
``/tmp/llmbench-sglang-venv``), with an import-only stand-in for SGLang's kernel library (PyPI
has no CPU build of it): SGLang runs every layer on its plain-torch path, while what the proxy
talks to stays real (the HTTP server, the tokenizer, scheduler and detokenizer processes, the
SSE and usage formatting, the ``sglang:`` metrics).  The model is ``tiny_model``'s (a
random-weight two-layer llama, a BPE tokenizer trained here, a chat template), built by the
SGLang venv's Python.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from exporter.harness import tiny_model
from exporter.harness.real_engine import EngineServer, proc_name, run_client, venv_missing

__all__ = ["INSTALL_SCRIPT", "SGLANG_ENV", "SCHEDULER", "DETOKENIZER", "venv_dir", "sglang_bin", "sglang_missing",
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
    return venv_missing("SGLang", venv_dir(), [str(sglang_bin()), "-c", "import sgl_kernel, sglang.launch_server"],
                        "import sglang.launch_server", SGLANG_ENV, INSTALL_SCRIPT)


def build_model(out: Path, timeout_s: float = 600) -> Path:
    """The tiny model in ``out``, built by the SGLang venv's Python."""
    return tiny_model.build(sglang_bin(), out, SGLANG_ENV, timeout_s)


class SglangServer(EngineServer):
    """``python -m sglang.launch_server`` on a free loopback port, as a child process (its own
    process group), started the way ``shared/reference/sglang-cpu`` ran it.  :meth:`start` waits
    for ``/health``'s 200, which SGLang gives only after its own warm-up request."""

    name = "sglang"
    env = SGLANG_ENV

    def child_name(self) -> str:
        return f"sglang-{self.starts}"  # a log per start: a restart keeps the log of the one before

    def argv(self) -> list[str]:
        return [str(sglang_bin()), "-m", "sglang.launch_server", "--model-path", str(self.model),
                "--served-model-name", "tiny", "--device", "cpu", "--attention-backend", "torch_native",
                "--max-total-tokens", str(MAX_TOTAL_TOKENS), "--enable-metrics",
                # without it the scheduler spins a whole core while idle
                "--sleep-on-idle",
                "--host", "127.0.0.1", "--port", str(self.port), *self.extra]

    def child_pid(self, title: str) -> int:
        """The child process SGLang titled ``title`` (:data:`SCHEDULER`, :data:`DETOKENIZER`)."""
        found = [p for p in self.pids() if proc_name(p).strip() == title]
        if len(found) != 1:
            raise LookupError(f"{title}: {found} among {[(p, proc_name(p)) for p in self.pids()]}")
        return found[0]


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
    result_file = result_dir / "result.jsonl"
    text = run_client(bench_serving_argv(base_url, model_dir, result_file, **kwargs), SGLANG_ENV,
                      result_dir / "bench.log", result_file, "sglang.bench_serving")
    result: dict[str, Any] = json.loads(text.splitlines()[-1])
    return result
