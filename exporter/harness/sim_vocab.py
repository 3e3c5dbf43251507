"""The simulated engines' vocabulary: the token ids they send when asked (``return_token_ids``)
and a ``tokenizer.json`` that names them, so that ``evidence decode --tokenizer`` can show what a
simulated empty-text 200 generated, as it does for a real model.

Ids 0-3 are the special tokens of the tests' tiny model (``<unk>``, ``<s>``, ``</s>``, ``<pad>``);
the text token ``i`` of an answer (`` tok{i}``) is id ``4 + i % WORDS``.  The simulated
``empty_text`` fault generates ``</s>`` (id 2) throughout: a model pushed to end-of-sequence
while ``ignore_eos`` forbids stopping, one cause the seed's empty 200s may have had.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["EOS_ID", "WORDS", "token_id", "write_tokenizer"]

SPECIAL = ("<unk>", "<s>", "</s>", "<pad>")
EOS_ID = 2
#: text tokens in the vocabulary
WORDS = 4096


def token_id(i: int) -> int:
    """The id of an answer's ``i``-th text token (`` tok{i}``)."""
    return len(SPECIAL) + i % WORDS


def write_tokenizer(directory: Path) -> Path:
    """A Hugging Face ``tokenizer.json`` (word level) for these ids, in ``directory``."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    vocab.update({f"tok{i}": token_id(i) for i in range(WORDS)})
    doc = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, tok in enumerate(SPECIAL)],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
        "decoder": None, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tokenizer.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path
