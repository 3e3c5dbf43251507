"""A real vLLM (the CPU build) for the tests: a tiny model, the server, its pids.

The benchmarks have their own (``bench/vllm_engine.py``, kept alike): ``tests/`` and ``bench/``
import nothing of each other.

The vLLM venv comes from ``.ci/install-vllm.sh`` (``$LLMBENCH_VLLM_VENV``, default
``/tmp/llmbench-vllm-venv``).  The model is a random-weight ``LlamaForCausalLM`` (hidden 128, two
heads of 64, two layers) with a byte-level BPE tokenizer trained here on Python's own source
files: nothing is downloaded.  This file also runs as a script inside the vLLM venv
(``python tests/vllm_engine.py build-model DIR``), so its top level imports only the standard
library; the project's helpers are imported where they are used.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from exporter.harness.stack import Child

__all__ = ["INSTALL_SCRIPT", "venv_dir", "vllm_bin", "vllm_missing", "require_vllm", "build_model",
           "VllmServer", "bench_serve_argv", "bench_serve", "start_proxy"]

INSTALL_SCRIPT = ".ci/install-vllm.sh"
MAX_MODEL_LEN = 2048
#: what the CPU build reads: its platform, and a small KV cache (GiB)
VLLM_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def venv_dir() -> Path:
    return Path(os.environ.get("LLMBENCH_VLLM_VENV", "/tmp/llmbench-vllm-venv"))


def vllm_bin(name: str = "python") -> Path:
    return venv_dir() / "bin" / name


def vllm_missing() -> str | None:
    """Why vLLM cannot run here (None when it can): no venv, or one that cannot import it."""
    vllm = vllm_bin("vllm")
    if not vllm.exists():
        return f"no vLLM venv at {venv_dir()} (run {INSTALL_SCRIPT})"
    probe = subprocess.run([str(vllm), "--version"], capture_output=True, text=True, timeout=300,
                           env={**os.environ, **VLLM_ENV})
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return f"`vllm --version` fails in {venv_dir()} ({last}); run {INSTALL_SCRIPT}"
    return None


def require_vllm() -> None:
    """Skip without a working vLLM venv, unless CI demands one (LLMBENCH_REQUIRE_VLLM=1)."""
    import pytest

    why = vllm_missing()
    if why:
        if os.environ.get("LLMBENCH_REQUIRE_VLLM") == "1":
            pytest.fail(why)
        pytest.skip(why)


def build_model(out: Path, timeout_s: float = 600) -> Path:
    """The tiny model in ``out`` (built by the vLLM venv's Python, which has torch)."""
    done = subprocess.run([str(vllm_bin()), __file__, "build-model", str(out)], timeout=timeout_s,
                          env={**os.environ, **VLLM_ENV}, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"building the model failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return out


def _training_text(limit_bytes: int = 8 << 20) -> list[str]:
    """Python's own standard-library sources, up to ``limit_bytes``: text every machine has."""
    import sysconfig

    texts, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="ignore")
        texts.append(text)
        size += len(text)
        if size >= limit_bytes:
            break
    return texts


def _build_model_main(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    special = ["<unk>", "<s>", "</s>", "<pad>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(_training_text(), trainers.BpeTrainer(
        vocab_size=4096, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", model_max_length=MAX_MODEL_LEN)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, head_dim=64,
                         max_position_embeddings=MAX_MODEL_LEN, bos_token_id=1, eos_token_id=2, pad_token_id=3,
                         torch_dtype="float32", tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(out)
    (out / "built.json").write_text(json.dumps({"vocab": tok.get_vocab_size()}))


def _proc_children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _proc_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class VllmServer:
    """``vllm serve`` on a free loopback port, as a child process (its own process group)."""

    def __init__(self, model: Path, log_dir: Path, extra: Sequence[str] = ()) -> None:
        from exporter.harness.stack import free_port

        self.model = model
        # A port chosen here, not bound by vLLM on port 0 and read back: its API server runs as a
        # grandchild (under ``timeout``, after minutes of start-up), and the proxy's config and
        # the clients need the port before then.  A port taken meanwhile fails the start at once.
        self.port = free_port()
        self.log_dir = log_dir
        self.extra = list(extra)
        self.child: Child | None = None
        self.startup_s = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        return [str(vllm_bin("vllm")), "serve", str(self.model), "--served-model-name", "tiny",
                "--host", "127.0.0.1", "--port", str(self.port),
                "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32", *self.extra]

    def start(self, timeout_s: float = 600) -> VllmServer:
        from exporter.harness.stack import Child, wait_http

        t0 = time.monotonic()
        self.child = Child("vllm", ["timeout", "-s", "TERM", "3600", *self.argv()], self.log_dir, env=VLLM_ENV)
        try:
            wait_http(f"{self.url}/health", timeout_s, self.child)
        except (RuntimeError, TimeoutError) as exc:
            self.stop()
            tail = (self.log_dir / "vllm.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{exc}\n--- vllm.log (tail) ---\n{tail}") from None
        self.startup_s = time.monotonic() - t0
        return self

    def pids(self) -> list[int]:
        """The whole process tree: ``timeout``, the API server and its children."""
        assert self.child is not None
        pids, todo = [], [self.child.proc.pid]
        while todo:
            p = todo.pop()
            pids.append(p)
            todo += _proc_children(p)
        return pids

    def engine_core_pid(self) -> int:
        """The engine core process (vLLM names it ``VLLM::EngineCore``)."""
        found = [p for p in self.pids() if "EngineCore" in _proc_name(p)]
        if not found:
            raise LookupError(f"no EngineCore process among {[(p, _proc_name(p)) for p in self.pids()]}")
        return found[0]

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop(timeout_s=30)

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


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
    result_dir.mkdir(parents=True, exist_ok=True)
    log_path = result_dir / "bench.log"
    with open(log_path, "wb") as log:
        done = subprocess.run(bench_serve_argv(base_url, model_dir, result_dir, **kwargs), stdout=log,
                              stderr=subprocess.STDOUT, env={**os.environ, **VLLM_ENV}, timeout=960)
    if done.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"vllm bench serve exited with {done.returncode}:\n{tail}")
    result: dict[str, Any] = json.loads((result_dir / "result.json").read_text())
    return result


def start_proxy(out: Path, engines: list[dict[str, Any]], **config: Any) -> tuple[Child, str]:
    """``llm-bench-exporter serve`` on a free loopback port (records in ``out/run``), ready."""
    import yaml

    from exporter.harness.stack import Child, exporter_argv, free_port, wait_http

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


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "build-model":
        sys.exit("usage: python tests/vllm_engine.py build-model DIR")
    shutil.rmtree(sys.argv[2], ignore_errors=True)
    _build_model_main(Path(sys.argv[2]))
