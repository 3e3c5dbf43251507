"""``evidence compare``: two synthetic runs with known medians: a clear win and a tie in the noise."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import matplotlib.image as mpimg
import pytest

from exporter.evidence.cli import main as evidence_main
from exporter.evidence.compare import compare_dirs, compare_runs, load_run
from exporter.evidence.noise import METRICS


def _round(engine: str, scenario: str, rnd: int, throughput: float, ttft: float, n: int = 10) -> list[dict[str, Any]]:
    """``n`` successful 100-token requests whose round lasts n * 100 / throughput seconds: a closed
    loop of two clients, each sending its next request as the last one ends (the same load on
    both sides, so the verdicts judge the figures)."""
    t0 = rnd * 1000.0
    duration = n * 100 / throughput
    e2e = duration / (n // 2)
    return [{"id": f"{engine}-{scenario}-{rnd}-{i}", "engine": engine, "scenario": scenario, "round": rnd,
             "start_unix": t0 + (i // 2) * e2e, "e2e_s": e2e, "ttft_s": ttft + i * 0.001,
             "tpot_s": 0.01, "completion_tokens": 100, "outcome": "success", "reason": None} for i in range(n)]


def _run(path: Path, engine: str, win_tp: float, win_ttft: float, noise_tps: tuple[float, ...]) -> Path:
    recs: list[dict[str, Any]] = []
    for rnd in (1, 2, 3):
        recs += _round(engine, "win", rnd, win_tp * (1 + 0.01 * rnd), win_ttft)
        recs += _round(engine, "noise", rnd, noise_tps[rnd - 1], 0.5)
    path.mkdir(parents=True, exist_ok=True)
    (path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _rows(result: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["scenario"], r["metric"]): r for r in result["rows"]}


def test_compare_a_clear_win_and_a_difference_inside_the_noise(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", "sglang", 100.0, 1.0, (100.0, 120.0, 140.0))
    b = _run(tmp_path / "b", "vllm", 200.0, 0.5, (110.0, 125.0, 135.0))
    result = compare_dirs(a, b, tmp_path / "out", "sglang", "vllm")
    rows = _rows(result)
    win = rows[("win", "output_throughput_tok_s")]
    assert win["value_a"] == pytest.approx(102.0) and win["value_b"] == pytest.approx(204.0)
    assert win["delta_pct"] == pytest.approx(100.0) and win["verdict"] == "better"
    assert rows[("win", "ttft_p95_s")]["verdict"] == "better"  # lower is better
    assert rows[("win", "ttft_p95_s")]["delta_pct"] < -40
    noise = rows[("noise", "output_throughput_tok_s")]
    assert noise["value_a"] == pytest.approx(120.0) and noise["value_b"] == pytest.approx(125.0)
    assert noise["spread_a"] == pytest.approx([100.0, 140.0]) and noise["verdict"] == "within noise"
    assert rows[("noise", "success_ratio")]["verdict"] == "within noise"  # equal
    # B against A mirrored: the win becomes a loss
    back = _rows({"rows": compare_runs(load_run(b, "vllm", None), load_run(a, "sglang", None))})
    assert back[("win", "output_throughput_tok_s")]["verdict"] == "worse"
    out = tmp_path / "out"
    md = (out / "compare.md").read_text()
    assert "Charts: `success_ratio.png`" in md
    assert "within noise" in md and "Verdict rule" in md and "## win" in md and "[100–140]" in md and "+100.0 %" in md
    with open(out / "compare.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == 2 * len(METRICS)
    assert {r["verdict"] for r in table if r["scenario"] == "win" and r["metric"] == "output_throughput_tok_s"} == {"better"}
    for metric in METRICS:
        img = mpimg.imread(out / f"{metric.key}.png")
        assert img.shape[0] > 100 and len({tuple(px) for px in img.reshape(-1, img.shape[2])[::53]}) > 5


def test_compare_two_engines_of_one_run_and_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _run(tmp_path / "a", "sglang", 100.0, 1.0, (100.0, 120.0, 140.0))
    both = tmp_path / "both"
    both.mkdir()
    _run(tmp_path / "b", "vllm", 300.0, 0.5, (110.0, 125.0, 135.0))
    (both / "requests.jsonl").write_text((a / "requests.jsonl").read_text() + (tmp_path / "b" / "requests.jsonl").read_text())
    assert evidence_main(["compare", str(both), str(both), "--out", str(tmp_path / "o"),
                          "--label-a", "sglang", "--label-b", "vllm", "--no-png"]) == 0
    assert not list((tmp_path / "o").glob("*.png")) and "Charts:" not in (tmp_path / "o" / "compare.md").read_text()
    table = list(csv.DictReader(open(tmp_path / "o" / "compare.csv", newline="")))
    row = next(r for r in table if r["scenario"] == "win" and r["metric"] == "output_throughput_tok_s")
    assert (row["engine_a"], row["engine_b"], row["verdict"]) == ("sglang", "vllm", "better")
    capsys.readouterr()
    assert evidence_main(["compare", str(both), str(both), "--out", str(tmp_path / "p"), "--engine-a", "tgi"]) == 2
    assert "engine 'tgi' is not in" in capsys.readouterr().err


def test_a_scenario_only_one_run_holds_is_named_not_dropped(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", "sglang", 100.0, 1.0, (100.0, 120.0, 140.0))
    extra = _round("sglang", "long-only-a", 1, 50.0, 2.0)
    with open(a / "requests.jsonl", "a") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in extra))
    b = _run(tmp_path / "b", "vllm", 200.0, 0.5, (110.0, 125.0, 135.0))
    result = compare_dirs(a, b, tmp_path / "out", "sglang", "vllm", png=False)
    assert result["unpaired"] == {"a": ["long-only-a"], "b": []}
    assert {r["scenario"] for r in result["rows"]} == {"win", "noise"}
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "Not compared, only in A (sglang): long-only-a." in md and "only in B" not in md


def test_requests_of_another_length_are_not_judged(tmp_path: Path) -> None:
    """Two bench clients' defaults differ (SGLang's random dataset draws lengths up to the asked
    one): a faster engine on shorter prompts says nothing, so the verdict names the workloads."""
    def with_prompts(path: Path, tokens: int) -> Path:
        recs = [json.loads(line) for line in (path / "requests.jsonl").read_text().splitlines()]
        (path / "requests.jsonl").write_text("".join(json.dumps({**r, "prompt_tokens": tokens}) + "\n" for r in recs))
        return path

    a = with_prompts(_run(tmp_path / "a", "sglang", 100.0, 1.0, (100.0, 120.0, 140.0)), 484)
    b = with_prompts(_run(tmp_path / "b", "vllm", 200.0, 0.5, (110.0, 125.0, 135.0)), 1024)
    rows = _rows(compare_dirs(a, b, tmp_path / "out", "sglang", "vllm", png=False))
    win = rows[("win", "output_throughput_tok_s")]
    assert win["verdict"] == "not judged: loads differ"
    assert win["why"] == "workloads differ: prompt 484 against 1024 tokens per request, more than 10% apart"
    # within 10%: judged as before
    with_prompts(a, 1000)
    assert _rows(compare_dirs(a, b, tmp_path / "out2", "sglang", "vllm", png=False))[("win", "output_throughput_tok_s")][
        "verdict"] == "better"


def test_each_side_names_the_build_it_measured(tmp_path: Path) -> None:
    """compare reads engines.jsonl beside each side's records, as summarize does: the engines'
    identities of each run are in compare.md."""
    a = _run(tmp_path / "a", "sglang", 100.0, 1.0, (100.0, 120.0, 140.0))
    b = _run(tmp_path / "b", "vllm", 200.0, 0.5, (110.0, 125.0, 135.0))
    for path, kind, version in ((a, "sglang", "0.5.23"), (b, "vllm", "0.32.0")):
        recs = [json.loads(line) for line in (path / "requests.jsonl").read_text().splitlines()]
        (path / "requests.jsonl").write_text("".join(json.dumps({**r, "run_id": "r1"}) + "\n" for r in recs))
        (path / "engines.jsonl").write_text(json.dumps(
            {"event": "identity", "run_id": "r1", "unix": 1.0, "engine": kind, "kind": kind, "version": version,
             "model": "tiny", "root": "/m", "max_model_len": 2048, "server_args": None, "model_info": None}) + "\n")
    compare_dirs(a, b, tmp_path / "out", "sglang", "vllm", png=False)
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "- A measured sglang: sglang 0.5.23, model tiny" in md
    assert "- B measured vllm: vllm 0.32.0, model tiny" in md
