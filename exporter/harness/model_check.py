"""``llm-bench-exporter model-check DIR``: what model files a run served, checked.

Lists every file under DIR (symbolic links followed, as a Hugging Face snapshot has them) with
its size and SHA-256, and for each ``.safetensors`` file the tensor count of its header (the
8-byte little-endian header length, then the JSON header: every key but ``__metadata__`` is a
tensor); a ``model.safetensors.index.json`` is checked against the shards (every shard it names
is there, and the tensors it maps equal the shards' headers).  Hashing runs in a few threads (the
hash releases the GIL) and shows its progress on stderr: a line every few seconds, with the
bytes done, the rate and the time left.

``--out FILE`` writes the JSON document (``llmbench-model-check/1``); ``--check FILE`` hashes
again and compares with such a document (exit 1 when any file differs, is missing or is new), so
the files can be checked again before a run; ``evidence report --model FILE`` carries it in its
manifest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .cliutil import HelpFormatter, UserError, fail

__all__ = ["add_parser", "scan", "compare", "safetensors_count", "FORMAT"]

FORMAT = "llmbench-model-check/1"
_BLOCK = 8 << 20
_MAX_HEADER = 100 << 20  # safetensors refuses larger headers too


def safetensors_count(path: Path) -> int | None:
    """The tensors in a safetensors file's header (None when the header cannot be read)."""
    try:
        with open(path, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            if size > _MAX_HEADER:
                return None
            header = json.loads(fh.read(size))
    except (OSError, struct.error, ValueError):
        return None
    return sum(1 for k in header if k != "__metadata__") if isinstance(header, dict) else None


class _Progress:
    """Bytes hashed so far, told on stderr at most every ``every_s`` seconds."""

    def __init__(self, total: int, every_s: float = 5.0, out: Any = None) -> None:
        self.total, self.every_s, self.out = total, every_s, out or sys.stderr
        self.done = 0
        self.t0 = self.last = time.monotonic()
        self.lock = threading.Lock()

    def add(self, n: int) -> None:
        with self.lock:
            self.done += n
            now = time.monotonic()
            if now - self.last < self.every_s and self.done < self.total:
                return
            self.last = now
        rate = self.done / max(now - self.t0, 1e-9)
        left = (self.total - self.done) / rate if rate > 0 else 0.0
        print(f"model-check: {self.done / 2**30:.1f} of {self.total / 2**30:.1f} GiB hashed "
              f"({self.done / max(self.total, 1):.0%}), {rate / 2**20:.0f} MiB/s, about {left:.0f} s left",
              file=self.out, flush=True)


def _sha256(path: Path, progress: Callable[[int], None]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            h.update(block)
            progress(len(block))
    return h.hexdigest()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and ".cache" not in p.relative_to(root).parts)


def _index_check(root: Path, files: list[dict[str, Any]]) -> dict[str, Any] | None:
    index = root / "model.safetensors.index.json"
    if not index.is_file():
        return None
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map") or {}
    except (OSError, ValueError, AttributeError):
        return {"ok": False, "problem": "model.safetensors.index.json is not a JSON object with a weight_map"}
    counts = {f["path"]: f.get("tensors") for f in files}
    shards = sorted(set(weight_map.values()))
    missing = [s for s in shards if s not in counts]
    in_headers = sum(counts.get(s) or 0 for s in shards)
    ok = not missing and in_headers == len(weight_map)
    return {"ok": ok, "tensors": len(weight_map), "tensors_in_shards": in_headers, "shards": len(shards),
            "missing_shards": missing}


def scan(root: Path, threads: int = 4, every_s: float = 5.0) -> dict[str, Any]:
    """The model-check document of the files under ``root``."""
    paths = _files(root)
    sizes = [p.stat().st_size for p in paths]
    progress = _Progress(sum(sizes), every_s)
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        digests = list(pool.map(lambda p: _sha256(p, progress.add), paths))
    files = []
    for path, size, digest in zip(paths, sizes, digests):
        entry: dict[str, Any] = {"path": str(path.relative_to(root)), "bytes": size, "sha256": digest}
        if path.suffix == ".safetensors":
            entry["tensors"] = safetensors_count(path)
        files.append(entry)
    return {"format": FORMAT, "dir": str(root.resolve()), "created_unix": round(time.time(), 3),
            "files": files, "total_bytes": sum(sizes), "tensors": sum(f.get("tensors") or 0 for f in files),
            "index": _index_check(root, files)}


def compare(found: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """What differs between two documents (empty when every file is the same)."""
    have = {f["path"]: f for f in found["files"]}
    want = {f["path"]: f for f in expected.get("files") or []}
    out = [f"missing: {p}" for p in sorted(set(want) - set(have))]
    out += [f"new: {p}" for p in sorted(set(have) - set(want))]
    for p in sorted(set(have) & set(want)):
        a, b = have[p], want[p]
        if (a["bytes"], a["sha256"]) != (b.get("bytes"), b.get("sha256")):
            out.append(f"changed: {p} ({b.get('bytes')} bytes {str(b.get('sha256'))[:12]}… -> "
                       f"{a['bytes']} bytes {a['sha256'][:12]}…)")
    return out


def cmd_model_check(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    try:
        if not root.is_dir():
            raise UserError(f"{root} is not a directory")
        expected = json.loads(Path(args.check).read_text(encoding="utf-8")) if args.check else None
        if expected is not None and expected.get("format") != FORMAT:
            raise UserError(f"--check {args.check}: not a {FORMAT} document")
        doc = scan(root, args.threads)
        text = json.dumps(doc, indent=1) + "\n"
        if args.out:
            Path(args.out).write_text(text, encoding="utf-8")
    except (OSError, ValueError, UserError) as exc:
        return fail("model-check", exc)
    if not args.out:
        sys.stdout.write(text)
    print(f"model-check: {len(doc['files'])} files, {doc['total_bytes'] / 2**30:.2f} GiB, {doc['tensors']} tensors"
          + ("" if doc["index"] is None else f"; index {'matches' if doc['index']['ok'] else 'DOES NOT match'}"),
          file=sys.stderr)
    if expected is None:
        return 0 if doc["index"] is None or doc["index"]["ok"] else 1
    problems = compare(doc, expected)
    for line in problems:
        print(f"model-check: {line}", file=sys.stderr)
    print(f"model-check: {'the same files as' if not problems else 'NOT the files of'} {args.check}", file=sys.stderr)
    return 1 if problems else 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("model-check", help="each model file's size and SHA-256, each safetensors header's tensor count",
                       formatter_class=HelpFormatter, description=__doc__.split("\n\n")[1].replace("\n", " "))
    p.add_argument("dir", metavar="DIR", help="the model's directory (a Hugging Face snapshot, say)")
    p.add_argument("--out", metavar="FILE", help="write the JSON document here (default: print it on stdout)")
    p.add_argument("--check", metavar="FILE", help="an earlier document: hash again and say what differs (exit 1 if "
                                                   "anything does)")
    p.add_argument("--threads", type=int, default=min(4, os.cpu_count() or 1), help="files hashed at once")
    p.set_defaults(func=cmd_model_check)
