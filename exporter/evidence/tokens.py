"""What the engine generated, token by token: ``evidence decode --tokenizer PATH``.

A capture whose engine was asked for its output token ids (engine option ``token_ids: true``)
holds them; the model's own tokenizer (its ``tokenizer.json``, read with Hugging Face
``tokenizers``, the ``trace`` extra) names each id and says which are special tokens, so an
empty-text HTTP 200 says what the engine generated instead of text (for instance sixteen
``</s>``, which detokenizing skips).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["TokenizerError", "load_vocabulary", "explain", "summary_line"]


class TokenizerError(Exception):
    """The tokenizer cannot be read (one line for the user)."""


def load_vocabulary(path: Path) -> tuple[Any, set[int]]:
    """The tokenizer at ``path`` (a model directory or its ``tokenizer.json``) and its special ids."""
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise TokenizerError("--tokenizer needs the tokenizers package: "
                             "pip install 'llm-bench-exporter[trace]'") from exc
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise TokenizerError(f"no tokenizer.json at {path}")
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as exc:  # the library raises its own exception types
        raise TokenizerError(f"cannot read {file}: {exc}") from exc
    special = {i for i, t in tok.get_added_tokens_decoder().items() if getattr(t, "special", False)}
    return tok, special


def explain(ids: list[int], tok: Any, special: set[int]) -> list[dict[str, Any]]:
    """One entry per id: the id, its token as the vocabulary names it, its text, whether special."""
    return [{"id": i, "token": tok.id_to_token(i), "text": tok.decode([i], skip_special_tokens=False),
             "special": i in special} for i in ids]


def summary_line(tokens: list[dict[str, Any]], limit: int = 12) -> str:
    """``16 token ids: 16 x 2 '</s>' (special)``: runs of equal ids, the first ``limit`` runs."""
    runs: list[list[Any]] = []
    for t in tokens:
        if runs and runs[-1][0]["id"] == t["id"]:
            runs[-1][1] += 1
        else:
            runs.append([t, 1])
    shown = [f"{n} x {t['id']} {t['token']!r}" + (" (special)" if t["special"] else "") for t, n in runs[:limit]]
    more = f", ... {len(runs) - limit} more runs" if len(runs) > limit else ""
    visible = sum(1 for t in tokens if not t["special"] and t["text"].strip())
    return f"{len(tokens)} token ids ({visible} with visible text): " + ", ".join(shown) + more
