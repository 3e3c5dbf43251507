"""``evidence summarize`` over several proxies' records: the exact union; TTFT variants."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from exporter.core.stats import percentile
from exporter.evidence.cli import main as evidence_main


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _records(rng: random.Random, proxy: str, n: int, start: float, variants: bool = True) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        ttft = rng.uniform(0.1, 2.0)
        rec = {"id": f"{proxy}-{i}", "engine": "vllm", "scenario": "s", "round": 1, "start_unix": start + i * 0.5,
               "e2e_s": ttft + 1.0, "ttft_s": ttft, "tpot_s": rng.uniform(0.005, 0.02), "completion_tokens": 100,
               "outcome": "success", "reason": None}
        if variants:
            rec.update(ttfb_s=ttft / 10, ttfe_s=ttft / 2)
        out.append(rec)
    out[0].update(outcome="failure", reason="empty_text", ttft_s=None)
    return out


def test_summarize_merges_two_proxies_exactly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(1)
    a, b = _records(rng, "p1", 23, 1000.0), _records(rng, "p2", 31, 1003.0, variants=False)
    da, db = _write(tmp_path / "a", a), _write(tmp_path / "b", b)
    out = tmp_path / "merged"
    # the same directory twice counts its requests once
    assert evidence_main(["summarize", "--records", str(da), "--records", str(db), "--records", str(da),
                          "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    both = a + b
    ok = [r for r in both if r["outcome"] == "success"]
    row, = s["rounds"]  # same engine, scenario and round on both proxies: one round
    assert (row["requests"], row["success"]) == (54, 52)
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        for q in (50, 95):
            name = f"{key[:-2]}_p{q}_s"
            if name in row:
                assert row[name] == pytest.approx(percentile([r[key] for r in ok], q))
    assert row["duration_s"] == pytest.approx(max(r["start_unix"] + r["e2e_s"] for r in both) - 1000.0)
    assert row["output_throughput_tok_s"] == pytest.approx(52 * 100 / row["duration_s"])
    assert any("already seen" in n for n in s["sources"])
    v, = s["ttft_variants"]
    assert v["ttfb_n"] == 22 and v["ttfb_p95_s"] == pytest.approx(percentile([r["ttfb_s"] for r in a if r["ttft_s"]], 95))
    assert v["ttft_n"] == 52
    md = (out / "summary.md").read_text()
    assert "TTFT variants" in md and "older proxy" in md and "Records merged" in md
    assert "Pooled: each P50/P95 is over every successful request of the scenario's rounds together" in md


def test_summarize_without_ttft_variants(tmp_path: Path) -> None:
    d = _write(tmp_path / "old", _records(random.Random(2), "p", 5, 0.0, variants=False))
    assert evidence_main(["summarize", "--records", str(d), "--out", str(tmp_path / "o")]) == 0
    v, = json.loads((tmp_path / "o" / "summary.json").read_text())["ttft_variants"]
    assert v["ttfb_n"] == 0 and v["ttfb_p95_s"] is None and v["ttft_p95_s"] is not None
