"""Output directories of every command: created, or one clear error that names the cause."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["OutDirError", "make_dir"]


class OutDirError(OSError):
    """The output directory cannot be used; the message names the path and the cause."""


def make_dir(path: str | Path, what: str = "output directory") -> Path:
    """``mkdir -p`` that checks a file can be written there; OutDirError otherwise."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutDirError(f"cannot create {what} {out}: a file of that name is in the way") from None
    except OSError as exc:
        raise OutDirError(f"cannot create {what} {out}: {exc.strerror or exc}") from None
    if not out.is_dir():
        raise OutDirError(f"cannot create {what} {out}: not a directory")
    if not os.access(out, os.W_OK | os.X_OK):
        raise OutDirError(f"cannot write in {what} {out}: permission denied")
    return out
