"""The tiny model the real engines serve in the tests and benchmarks, built here: nothing is
downloaded.

A random-weight ``LlamaForCausalLM`` (hidden 128, two heads of 64, two layers) with a byte-level
BPE tokenizer trained on Python's own source files and a chat template.  It is built by an engine
venv's Python (which has torch, tokenizers and transformers; the project's venv need not), running
this file as a script: ``python exporter/harness/tiny_model.py build-model DIR``.  So its top
level imports only the standard library and nothing of ``exporter``: the engine venvs have no
``exporter`` to import.  :func:`build` is that call, made from the project's side.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["MAX_MODEL_LEN", "CHAT_TEMPLATE", "build"]

MAX_MODEL_LEN = 2048
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def build(python: Path, out: Path, env: Mapping[str, str], timeout_s: float = 600) -> Path:
    """The tiny model in ``out``, built by ``python`` (an engine venv's) with ``env`` added."""
    done = subprocess.run([str(python), __file__, "build-model", str(out)], timeout=timeout_s,
                          env={**os.environ, **env}, capture_output=True, text=True)
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


if __name__ == "__main__":
    # Run as a file, this folder comes first on sys.path: its modules (``progress``, ``tables``,
    # ``stack``, ...) must not stand in for packages of the same names that torch and
    # transformers may import.
    if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
        del sys.path[0]
    if len(sys.argv) != 3 or sys.argv[1] != "build-model":
        sys.exit(f"usage: python {__file__} build-model DIR")
    shutil.rmtree(sys.argv[2], ignore_errors=True)
    _build_model_main(Path(sys.argv[2]))
