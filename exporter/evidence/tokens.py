"""What the engine generated, token by token: ``evidence decode --tokenizer PATH``.

A capture whose engine was asked for its output token ids (engine option ``token_ids: true``)
holds them; the model's own tokenizer (its ``tokenizer.json``, read with Hugging Face
``tokenizers``, the ``trace`` extra) names each id and says which are special tokens, so an
empty-text HTTP 200 says what the engine generated instead of text (for instance sixteen
``</s>``, which detokenizing skips).

The text of the ids is made as the engines' incremental detokenizers make it, not token by token: a
byte-level BPE token may hold part of a character (decoded alone it is U+FFFD), and a SentencePiece
token's leading space is dropped when it is decoded at the start of a text.  So each id's piece is
what decoding the ids up to it adds to the ids before it, behind a token of context (as an engine
decodes behind the prompt), held back while it ends in a partial character; the pieces join to the
whole, which is the engine's visible text (special tokens skipped).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["TokenizerError", "load_vocabulary", "explain", "detokenize", "summary_line"]

_PARTIAL = "\ufffd"  # what a lone byte of a multi-byte character decodes to


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


def _context(tok: Any, special: set[int]) -> list[int]:
    """One ordinary token (a word's, decoded alone to letters or digits) to decode behind, or none."""
    for i in range(min(tok.get_vocab_size(), 4096)):
        if i not in special and tok.decode([i], skip_special_tokens=True).isalnum():
            return [i]
    return []


def detokenize(ids: list[int], tok: Any, special: set[int]) -> tuple[str, list[str]]:
    """The text of ``ids`` as an engine shows it (special tokens skipped), and each id's piece of it."""
    ctx = _context(tok, special)
    base = tok.decode(ctx, skip_special_tokens=True)
    pieces: list[str] = []
    shown = ""
    for k in range(1, len(ids) + 1):
        text = tok.decode(ctx + ids[:k], skip_special_tokens=True)[len(base):]
        if text.endswith(_PARTIAL) and k < len(ids):  # a character cut between tokens: its bytes wait
            pieces.append("")
            continue
        pieces.append(text[len(shown):] if text.startswith(shown) else text)
        shown = text if text.startswith(shown) else shown + text
    return shown, pieces


def explain(ids: list[int], tok: Any, special: set[int]) -> list[dict[str, Any]]:
    """One entry per id: the id, its token as the vocabulary names it, its piece of the engine's text
    (:func:`detokenize`: pieces join to the whole), whether special."""
    _, pieces = detokenize(ids, tok, special)
    return [{"id": i, "token": tok.id_to_token(i), "text": piece, "special": i in special}
            for i, piece in zip(ids, pieces)]


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
