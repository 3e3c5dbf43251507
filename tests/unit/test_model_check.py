"""``llm-bench-exporter model-check DIR``: each file's size and SHA-256, each safetensors header's
tensor count, the index checked against the shards, progress on stderr, and a second check
against the first one's JSON."""

from __future__ import annotations

import hashlib
import io
import json
import struct
from pathlib import Path

import pytest

from exporter.cli import main
from exporter.harness.model_check import _Progress, compare, safetensors_count, scan


def _shard(path: Path, names: list[str]) -> None:
    header = {"__metadata__": {"format": "pt"}, **{n: {"dtype": "F32", "shape": [2], "data_offsets": [8 * i, 8 * i + 8]}
                                                   for i, n in enumerate(names)}}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(8 * len(names)))


def _model(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    _shard(d / "model-00001-of-00002.safetensors", ["a", "b", "c"])
    _shard(d / "model-00002-of-00002.safetensors", ["d"])
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                  "c": "model-00001-of-00002.safetensors", "d": "model-00002-of-00002.safetensors"}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (d / "config.json").write_text("{}")
    return d


def test_sizes_hashes_and_tensor_counts(tmp_path: Path) -> None:
    d = _model(tmp_path)
    doc = scan(d, threads=2)
    by = {f["path"]: f for f in doc["files"]}
    for name, f in by.items():
        data = (d / name).read_bytes()
        assert (f["bytes"], f["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    assert by["model-00001-of-00002.safetensors"]["tensors"] == 3 and "tensors" not in by["config.json"]
    assert doc["tensors"] == 4 and doc["index"] == {"ok": True, "tensors": 4, "tensors_in_shards": 4, "shards": 2,
                                                    "missing_shards": []}
    (d / "model-00002-of-00002.safetensors").unlink()
    assert scan(d)["index"]["missing_shards"] == ["model-00002-of-00002.safetensors"]
    (d / "junk.safetensors").write_bytes(b"\xff" * 16)
    assert safetensors_count(d / "junk.safetensors") is None


def test_progress_is_told() -> None:
    out = io.StringIO()
    p = _Progress(100, every_s=0.0, out=out)
    p.add(50)
    p.add(50)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "(50%)" in lines[0] and "(100%)" in lines[1] and "s left" in lines[1]


def test_checked_again_before_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _model(tmp_path)
    first = tmp_path / "model.json"
    assert main(["model-check", str(d), "--out", str(first)]) == 0
    assert main(["model-check", str(d), "--check", str(first), "--out", str(tmp_path / "again.json")]) == 0
    assert "the same files as" in capsys.readouterr().err
    (d / "config.json").write_text('{"changed": true}')
    assert main(["model-check", str(d), "--check", str(first), "--out", str(tmp_path / "third.json")]) == 1
    assert "changed: config.json" in capsys.readouterr().err
    assert compare(scan(d), json.loads(first.read_text())) == [
        line for line in compare(scan(d), json.loads(first.read_text())) if line.startswith("changed")]
    assert main(["model-check", str(tmp_path / "nowhere")]) == 2
