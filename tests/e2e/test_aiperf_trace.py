"""AIPerf reads our trace, for real: traffic through the real proxy (config ``trace``) in front of a
simulated vLLM that counts with the model's tokenizer, ``evidence trace`` on its records, and AIPerf's own
``mooncake_trace`` loader (from PyPI, in a venv of its own) reading the trace as ``aiperf profile
--custom-dataset-type mooncake_trace`` would, no engine needed: every line, its lengths and hash ids as
written, and the prompts AIPerf builds from them are ``input_length`` tokens long and share blocks where
the ids say so.  Needs ``.ci/install-aiperf.sh`` (skipped without it, failed without it when
LLMBENCH_REQUIRE_AIPERF=1)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from exporter.harness.load import make_prompt
from exporter.harness.real_engine import start_proxy
from exporter.harness.stack import Child, exporter_argv, free_port, wait_http

from tests.helpers import skip_or_fail
from tests.tiny_tokenizer import build_tokenizer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BLOCK = 16


def aiperf_python() -> Path:
    venv = Path(os.environ.get("LLMBENCH_AIPERF_VENV", "/tmp/llmbench-aiperf-venv"))
    python = venv / "bin" / "python"
    if not python.exists():
        skip_or_fail(f"no AIPerf venv at {venv} (bash .ci/install-aiperf.sh)", "LLMBENCH_REQUIRE_AIPERF")
    return python


def _capture(out: Path, tokenizer: Path) -> None:
    """Seven requests through the proxy, most behind one shared system prompt, one sent twice."""
    port = free_port()
    sim = Child("sim", exporter_argv("sim", "--profile", "vllm", "--listen", f"127.0.0.1:{port}", "--speed", "50",
                                     "--tokenizer", str(tokenizer)), out / "logs")
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 30, sim)
        proxy, url = start_proxy(out, [{"name": "vllm", "upstream": f"http://127.0.0.1:{port}"}],
                                 trace={"tokenizer": str(tokenizer), "block_size": BLOCK})
        try:
            rng = random.Random(3)
            system = make_prompt(rng, 40)
            prompts = [f"{system} {make_prompt(rng, k)}" for k in (5, 31, 60, 2)] + [make_prompt(rng, 50)]
            prompts += [prompts[0], f"{system} {make_prompt(rng, 9)}"]
            for i, prompt in enumerate(prompts):
                r = requests.post(f"{url}/vllm/v1/completions", timeout=30, json={
                    "prompt": prompt, "max_tokens": 2 + i, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}})
                assert r.status_code == 200, r.text
        finally:
            proxy.stop()
    finally:
        sim.stop()


def _online_env() -> dict[str, str]:
    """AIPerf 0.13 looks a tokenizer up in the Hugging Face cache, never on disk, when HF_HUB_OFFLINE or
    TRANSFORMERS_OFFLINE is set: the tokenizer here is a local directory, nothing is downloaded."""
    return {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}


def _plain_tokenizer(tmp_path: Path, tokenizer: Path) -> Path:
    """AIPerf's transformers wants its special tokens as strings: the same tokenizer.json, a plain config."""
    plain = tmp_path / "tok-aiperf"
    plain.mkdir()
    (plain / "tokenizer.json").write_bytes((tokenizer / "tokenizer.json").read_bytes())
    (plain / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    return plain


def test_aiperf_reads_our_multi_turn_trace(tmp_path: Path) -> None:
    """Session records (as the proxy writes them with trace: on) through ``evidence trace``: AIPerf's loader
    groups the lines into one conversation per session, turns in order, with our ``delay`` and lengths."""
    python = aiperf_python()
    plain = _plain_tokenizer(tmp_path, build_tokenizer(tmp_path / "tok"))
    recs = []
    for t, sid, n_in, n_out in ((0.0, "a", 20, 4), (0.1, "b", 18, 3), (1.0, "a", 40, 5), (1.5, "b", 30, 2),
                                (2.2, "a", 52, 3)):
        recs.append({"id": f"r{t}", "run_id": "run1", "engine": "vllm", "scenario": "chat", "start_unix": 100 + t,
                     "e2e_s": 0.25, "outcome": "success", "prompt_tokens": n_in, "completion_tokens": n_out,
                     "prefix_hashes": None, "trace_block_size": BLOCK, "session_id": sid})
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    trace = tmp_path / "agents.jsonl"
    done = subprocess.run([sys.executable, "-m", "exporter.evidence", "trace", "--records", str(tmp_path / "rec"),
                           "--out", str(trace)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    read = subprocess.run([str(python), str(ROOT / "tests" / "aiperf_read_trace.py"), str(trace), str(plain),
                           str(BLOCK)], capture_output=True, text=True, timeout=300, env=_online_env())
    assert read.returncode == 0, read.stderr[-3000:]
    got = json.loads(read.stdout.strip().splitlines()[-1])
    assert got["loader"] == "MooncakeTraceDatasetLoader"
    turns = [(t["session_id"], t["timestamp"], t["delay"], t["max_tokens"], len(t["ids"])) for t in got["turns"]]
    assert turns == [("session-0", 0, None, 4, 20), ("session-0", None, 750, 5, 16), ("session-0", None, 950, 3, 7),
                     ("session-1", 100, None, 3, 18), ("session-1", None, 1150, 2, 9)]


def test_aiperf_reads_the_trace_evidence_writes(tmp_path: Path) -> None:
    python = aiperf_python()
    tokenizer = build_tokenizer(tmp_path / "tok")
    _capture(tmp_path, tokenizer)
    trace = tmp_path / "week.jsonl"
    done = subprocess.run([sys.executable, "-m", "exporter.evidence", "trace", "--records", str(tmp_path / "run"),
                           "--out", str(trace)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ours = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(ours) == 7 and ours[5]["hash_ids"] == ours[0]["hash_ids"]
    assert ours[1]["hash_ids"][:2] == ours[0]["hash_ids"][:2] and not set(ours[4]["hash_ids"]) & set(ours[0]["hash_ids"])

    plain = _plain_tokenizer(tmp_path, tokenizer)
    read = subprocess.run([str(python), str(ROOT / "tests" / "aiperf_read_trace.py"), str(trace), str(plain),
                           str(BLOCK)], capture_output=True, text=True, timeout=300,
                          env=_online_env())
    assert read.returncode == 0, read.stderr[-3000:]
    got = json.loads(read.stdout.strip().splitlines()[-1])
    assert got["loader"] == "MooncakeTraceDatasetLoader" and got["block_size"] == BLOCK
    assert [{k: t[k] for k in ours[0]} for t in got["traces"]] == ours  # every line: timestamps, lengths, hash ids
    turns = got["turns"]
    assert [(t["timestamp"], t["max_tokens"]) for t in turns] == [(x["timestamp"], x["output_length"]) for x in ours]
    assert [len(t["ids"]) for t in turns] == [x["input_length"] for x in ours]  # AIPerf's prompts: our lengths
    ids = [t["ids"] for t in turns]
    assert ids[5] == ids[0]  # equal hash ids, the same prompt
    assert ids[1][:2 * BLOCK] == ids[0][:2 * BLOCK] and ids[1][2 * BLOCK:3 * BLOCK] != ids[0][2 * BLOCK:3 * BLOCK]
    assert ids[4][:BLOCK] != ids[0][:BLOCK]
