"""A tiny model tokenizer built by the tests: a BPE trained here with Hugging Face ``tokenizers`` (as
``exporter/harness/tiny_model.py``'s model builder trains its own), saved as a model directory would hold it:
``tokenizer.json`` (a BOS added to a plain prompt, as Llama's does) and ``tokenizer_config.json``
with the special tokens and a chat template.  Every word of the load driver's prompts is one token."""

from __future__ import annotations

import json
import random
from pathlib import Path

from exporter.harness.load import make_prompt

SPECIAL = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def build_tokenizer(out: Path) -> Path:
    """The tokenizer's directory ``out`` (made here, in well under a second)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = [make_prompt(random.Random(i), 400) for i in range(20)]
    corpus += ["the quick brown fox jumps over the lazy dog", "hello world, how are you today?"]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIAL, show_progress=False))
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", bos)])
    tok.save(str(out / "tokenizer.json"))
    config = {"bos_token": "<s>", "unk_token": "<unk>",
              "eos_token": {"content": "</s>", "lstrip": False, "rstrip": False, "normalized": False, "special": True},
              "chat_template": CHAT_TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast"}
    (out / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return out
