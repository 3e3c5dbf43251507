"""The simulated engines' vocabulary: the token ids they send when asked (``return_token_ids``)
and a ``tokenizer.json`` that names them, so that ``evidence decode --tokenizer`` can show what a
simulated empty-text 200 generated, as it does for a real model.

Ids 0-3 are the special tokens of the tests' tiny model (``<unk>``, ``<s>``, ``</s>``, ``<pad>``);
the text token ``i`` of an answer (`` tok{i}``) is id ``4 + i % WORDS``.  The simulated
``empty_text`` fault generates ``</s>`` (id 2) throughout: a model pushed to end-of-sequence
while ``ignore_eos`` forbids stopping, one cause the seed's empty 200s may have had.

:func:`write_model_tokenizer` makes the same vocabulary a model's tokenizer directory, for the demo's
trace capture and replay: the load driver's prompt words and the chat roles as tokens of their own
(ids past the answers'), a BOS added to a plain prompt (as Llama's tokenizer does) and a
``tokenizer_config.json`` with the special tokens and a chat template.  One whitespace-separated word
is one token, so the demo's prompts keep their lengths, the BOS (and the template) on top.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["EOS_ID", "WORDS", "CHAT_TEMPLATE", "token_id", "write_tokenizer", "write_model_tokenizer"]

CONTROL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")
EOS_ID = 2
#: text tokens in the vocabulary
WORDS = 4096
#: the chat roles' tokens, after the answers' in the model tokenizer
ROLES = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>")
#: the model tokenizer's chat template (BOS, then each message as ``<|role|>`` content EOS)
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def token_id(i: int) -> int:
    """The id of an answer's ``i``-th text token (`` tok{i}``)."""
    return len(CONTROL_TOKENS) + i % WORDS


def _document(more: Sequence[str] = ()) -> dict[str, Any]:
    vocab = {tok: i for i, tok in enumerate(CONTROL_TOKENS)}
    vocab.update({f"tok{i}": token_id(i) for i in range(WORDS)})
    for word in more:
        vocab.setdefault(word, len(vocab))
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, tok in enumerate(CONTROL_TOKENS)],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
        "decoder": None, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }


def write_tokenizer(directory: Path) -> Path:
    """A Hugging Face ``tokenizer.json`` (word level) for these ids, in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tokenizer.json"
    path.write_text(json.dumps(_document()), encoding="utf-8")
    return path


def write_model_tokenizer(directory: Path, prompt_words: Sequence[str]) -> Path:
    """The vocabulary as a model's tokenizer directory (``tokenizer.json``, ``tokenizer_config.json``):
    ``prompt_words`` and the chat roles added, a BOS before a plain prompt, a chat template."""
    doc = _document([*ROLES, *prompt_words])
    bos = {"id": "<s>", "ids": [CONTROL_TOKENS.index("<s>")], "tokens": ["<s>"]}
    doc["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": bos},
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(json.dumps(doc), encoding="utf-8")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "pad_token": "<pad>", "chat_template": CHAT_TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return directory
