"""Per-request records and raw SSE captures on disk.

* ``requests.jsonl``: one line per finished request.  Each line goes to the file in one
  ``write(2)`` on an ``O_APPEND`` descriptor, so concurrent writers never interleave within a
  line and a crash of this process between two writes (even SIGKILL) leaves only whole lines.
  A write that the kernel cuts short (a full disk) has already written the start of its line:
  the writer then raises ``OSError``, and readers of the file report that line as not JSON.
* ``scenarios.jsonl``: scenario and round changes with wall-clock and unix times.
* ``captures/<id>.sse``: the exact upstream body bytes; ``captures/<id>.json``: arrival
  offsets of every read, the HTTP status, the request's length expectation and the
  SHA-256 of the ``.sse`` file.  No request or response headers are stored, so
  ``Authorization`` and API keys never reach disk.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

__all__ = ["JsonlWriter", "Capture", "write_capture", "read_capture", "CAPTURE_FORMAT"]

CAPTURE_FORMAT = "llmbench-capture/1"

_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


#: what the standard library's encoder refuses orjson refuses too (subclasses of dict and list,
#: dataclasses, datetimes: TypeError, then the standard library's own answer)
_AS_STDLIB = orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


def _nonfinite(values: Any) -> bool:
    """A NaN or an infinity among ``values`` (a dict's values, a list), at any depth."""
    for v in values:
        t = type(v)
        if t is float:
            if not math.isfinite(v):
                return True
        elif t is dict:
            if _nonfinite(v.values()):
                return True
        elif t is list or t is tuple:
            if _nonfinite(v):
                return True
        elif isinstance(v, float) and not math.isfinite(v):
            return True
    return False


def _dumps(record: dict[str, Any]) -> bytes:
    """One compact JSON line; NaN and infinities are refused (they are not JSON).

    orjson where it can (a tenth of the standard library's time per record; it would write NaN
    as ``null``, so those are looked for first), the standard library for what orjson refuses
    (an integer over 64 bits, a key that is not a string)."""
    if _nonfinite(record.values()):
        raise ValueError("Out of range float values are not JSON compliant")
    try:
        return orjson.dumps(record, option=_AS_STDLIB)
    except TypeError:
        return _encode(record).encode("utf-8")


class JsonlWriter:
    """Append whole JSON lines to a file, one system call per line."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        data = _dumps(record) + b"\n"
        written = os.write(self._fd, data)
        if written != len(data):  # a full disk: the line's start is already in the file
            raise OSError(f"short write to {self.path}: {written} of {len(data)} bytes")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@dataclass(slots=True)
class Capture:
    """Reads of one response kept in memory (references, no copies) up to a byte cap."""

    limit: int
    chunks: list[bytes] = field(default_factory=list)
    offsets: list[float] = field(default_factory=list)
    size: int = 0
    truncated: bool = False

    def add(self, chunk: bytes, offset: float) -> None:
        if self.truncated:
            return
        if self.size + len(chunk) > self.limit:
            self.truncated = True
            return
        self.chunks.append(chunk)
        self.offsets.append(offset)
        self.size += len(chunk)


def write_capture(directory: Path, request_id: str, capture: Capture, meta: dict[str, Any]) -> tuple[str, str]:
    """Write ``<id>.sse`` and ``<id>.json``; return (path of the .sse file, its SHA-256)."""
    directory.mkdir(parents=True, exist_ok=True)
    body = b"".join(capture.chunks)
    digest = hashlib.sha256(body).hexdigest()
    sse_path = directory / f"{request_id}.sse"
    sse_path.write_bytes(body)
    reads, pos = [], 0
    for chunk, offset in zip(capture.chunks, capture.offsets):
        reads.append([pos, len(chunk), round(offset, 6)])
        pos += len(chunk)
    doc = {
        "format": CAPTURE_FORMAT,
        "id": request_id,
        "sha256": digest,
        "bytes": len(body),
        "truncated": capture.truncated,
        "reads": reads,  # [byte offset, length, seconds since t0]
        **meta,
    }
    tmp = directory / f".{request_id}.json.tmp"
    tmp.write_text(json.dumps(doc), encoding="utf-8")  # no indent: the C encoder, GIL held briefly
    os.replace(tmp, directory / f"{request_id}.json")
    return str(sse_path), digest


def read_capture(path: Path) -> tuple[dict[str, Any], bytes]:
    """Load a capture from either of its two files; raise ValueError with a clear reason."""
    stem = path.with_suffix("") if path.suffix in (".sse", ".json") else path
    meta_path, body_path = stem.with_suffix(".json"), stem.with_suffix(".sse")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{meta_path}: capture metadata not found") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{meta_path}: capture metadata is not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != CAPTURE_FORMAT:
        raise ValueError(f"{meta_path}: not a {CAPTURE_FORMAT} file")
    try:
        body = body_path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{body_path}: capture body not found") from None
    return meta, body
