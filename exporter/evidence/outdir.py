"""Output directories of the evidence commands: created with one clear error, never mixed
with an earlier run's files (a non-empty directory is refused unless ``--force`` clears it)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from exporter.paths import OutDirError, make_dir

__all__ = ["OutDirError", "prepare_out", "make_dir", "check_out"]


def _refuse_to_clear(path: Path) -> str | None:
    resolved = path.resolve()
    if resolved == Path(resolved.anchor) or resolved == Path.home().resolve():
        return "it is / or the home directory"
    if resolved == Path.cwd().resolve() or resolved in Path.cwd().resolve().parents:
        return "it holds the current directory"
    if (resolved / ".git").exists():
        return "it is a git checkout"
    return None


def check_out(path: Path, force: bool) -> None:
    """Before any work: refuse an output path that :func:`prepare_out` would refuse."""
    if path.exists() and not path.is_dir():
        raise OutDirError(f"--out {path} is a file, not a directory")
    if path.is_dir():
        if any(path.iterdir()) and not force:
            raise OutDirError(f"--out {path} is not empty: choose a new directory, or add --force to clear it first")
        if not os.access(path, os.W_OK | os.X_OK):
            raise OutDirError(f"cannot write into output directory {path}: permission denied")
        return
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise OutDirError(f"cannot create output directory {path}: {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutDirError(f"cannot create output directory {path}: permission denied in {parent}")


def prepare_out(path: Path, force: bool) -> None:
    """An empty directory at ``path``: created, or (with ``force``) emptied first."""
    if path.exists() and not path.is_dir():
        raise OutDirError(f"--out {path} is a file, not a directory")
    if path.is_dir() and any(path.iterdir()):
        if not force:
            raise OutDirError(f"--out {path} is not empty: choose a new directory, or add --force to clear it first")
        why = _refuse_to_clear(path)
        if why:
            raise OutDirError(f"--force will not clear {path}: {why}")
        try:
            for child in path.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        except OSError as exc:
            raise OutDirError(f"cannot clear {path}: {exc.strerror or exc}") from None
    make_dir(path)
