"""A real vLLM (the CPU build) for the tests and the benchmarks: its venv, the tiny model, the
server and its engine core, vLLM's own client ``vllm bench serve``.

The vLLM venv comes from ``.ci/install-vllm.sh`` (``$LLMBENCH_VLLM_VENV``, default
``/tmp/llmbench-vllm-venv``); the model is ``tiny_model``'s, built by that venv's Python.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from exporter.harness import tiny_model
from exporter.harness.real_engine import EngineServer, proc_name, run_client, venv_missing
from exporter.harness.tiny_model import MAX_MODEL_LEN

__all__ = ["INSTALL_SCRIPT", "MAX_MODEL_LEN", "VLLM_ENV", "venv_dir", "vllm_bin", "vllm_missing", "build_model",
           "VllmServer", "bench_serve_argv", "bench_serve"]

INSTALL_SCRIPT = ".ci/install-vllm.sh"
#: what the CPU build reads: its platform, and a small KV cache (GiB)
VLLM_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}


def venv_dir() -> Path:
    return Path(os.environ.get("LLMBENCH_VLLM_VENV", "/tmp/llmbench-vllm-venv"))


def vllm_bin(name: str = "python") -> Path:
    return venv_dir() / "bin" / name


def vllm_missing() -> str | None:
    """Why vLLM cannot run here (None when it can): no venv, or one that cannot import it."""
    return venv_missing("vLLM", venv_dir(), [str(vllm_bin("vllm")), "--version"], "vllm --version", VLLM_ENV,
                        INSTALL_SCRIPT)


def build_model(out: Path, timeout_s: float = 600) -> Path:
    """The tiny model in ``out``, built by the vLLM venv's Python (which has torch)."""
    return tiny_model.build(vllm_bin(), out, VLLM_ENV, timeout_s)


class VllmServer(EngineServer):
    """``vllm serve`` on a free loopback port, as a child process (its own process group)."""

    name = "vllm"
    env = VLLM_ENV

    def argv(self) -> list[str]:
        return [str(vllm_bin("vllm")), "serve", str(self.model), "--served-model-name", "tiny",
                "--host", "127.0.0.1", "--port", str(self.port),
                "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32", *self.extra]

    def engine_core_pid(self) -> int:
        """The engine core process (vLLM names it ``VLLM::EngineCore``)."""
        found = [p for p in self.pids() if "EngineCore" in proc_name(p)]
        if not found:
            raise LookupError(f"no EngineCore process among {[(p, proc_name(p)) for p in self.pids()]}")
        return found[0]


def bench_serve_argv(base_url: str, model_dir: Path, result_dir: Path, *, input_len: int, output_len: int,
                     prompts: int, concurrency: int, seed: int = 0, request_id_prefix: str = "bench-") -> list[str]:
    """``vllm bench serve`` (vLLM's own client) against ``base_url``, its JSON (with each request's
    TTFT, in request order) saved as ``result_dir/result.json``.  Request ``i`` carries the header
    ``X-Request-Id: {request_id_prefix}{i}``."""
    return ["timeout", "900", str(vllm_bin("vllm")), "bench", "serve", "--backend", "vllm", "--base-url", base_url,
            "--model", "tiny", "--tokenizer", str(model_dir), "--dataset-name", "random",
            "--random-input-len", str(input_len), "--random-output-len", str(output_len),
            "--num-prompts", str(prompts), "--max-concurrency", str(concurrency), "--ignore-eos",
            "--seed", str(seed), "--request-id-prefix", request_id_prefix,
            "--save-result", "--save-detailed", "--result-dir", str(result_dir), "--result-filename", "result.json"]


def bench_serve(base_url: str, model_dir: Path, result_dir: Path, **kwargs: Any) -> dict[str, Any]:
    """Run ``vllm bench serve`` (:func:`bench_serve_argv`) to the end; its saved result."""
    text = run_client(bench_serve_argv(base_url, model_dir, result_dir, **kwargs), VLLM_ENV,
                      result_dir / "bench.log", result_dir / "result.json", "vllm bench serve")
    result: dict[str, Any] = json.loads(text)
    return result
