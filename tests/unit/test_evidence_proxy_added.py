"""SPEC 27, the evidence side: ``evidence summarize`` shows what the proxy added to each round's
TTFT (``proxy_added_s``), ``summarize`` and ``compare`` warn when the rounds they hold took ``t0``
in different ways (``t0_source``; records of an older proxy count as ``unknown``), and the report
shows ``proxy_added`` beside TTFT among its caveats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from exporter.core.stats import median, percentile
from exporter.evidence.cli import main as evidence_main
from exporter.evidence.noise import human

from tests.report_records import write_records

RUN = "20261201T090000Z-bbbbbb"


def _round(rnd: int, t0: float, source: str | None, added: list[float], engine: str = "vllm") -> list[dict[str, Any]]:
    """A round of len(added) successful requests, one after the other; ``source`` None: no field."""
    out = []
    for i, a in enumerate(added):
        r: dict[str, Any] = {"id": f"{engine}-r{rnd}-{i}", "run_id": RUN, "engine": engine, "scenario": "short-c1",
                             "round": rnd, "start_unix": t0 + i, "e2e_s": 0.5, "ttft_s": 0.1 + i * 0.01,
                             "tpot_s": 0.01, "completion_tokens": 10, "outcome": "success", "reason": None,
                             "timing_uncertainty_s": 0.0001}
        if source is not None:
            r.update(t0_source=source, proxy_added_s=a)
        out.append(r)
    return out


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


ADDED_1 = [0.0002, 0.0004, 0.0003, 0.0009, 0.0001, 0.0005]
ADDED_2 = [0.002, 0.001, 0.004, 0.003, 0.0015, 0.0025]


def test_summarize_shows_proxy_added_per_round(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recs = _round(1, 1000.0, "kernel", ADDED_1) + _round(2, 2000.0, "kernel", ADDED_2)
    out = tmp_path / "out"
    assert evidence_main(["summarize", "--records", str(_write(tmp_path / "rec", recs)), "--out", str(out)]) == 0
    assert "warning:" not in capsys.readouterr().err  # one t0_source: nothing to warn of
    s = json.loads((out / "summary.json").read_text())
    rows = {r["round"]: r for r in s["proxy_added"]}
    for rnd, added in ((1, ADDED_1), (2, ADDED_2)):
        mine = [r for r in recs if r["round"] == rnd]
        assert rows[rnd]["t0_source"] == "kernel" and rows[rnd]["t0_sources"] == {"kernel": len(added)}
        assert rows[rnd]["proxy_added_n"] == len(added)
        assert rows[rnd]["proxy_added_p50_s"] == pytest.approx(percentile(added, 50))
        assert rows[rnd]["proxy_added_p95_s"] == pytest.approx(percentile(added, 95))
        client = [r["ttft_s"] + r["proxy_added_s"] for r in mine]
        assert rows[rnd]["client_ttft_p95_s"] == pytest.approx(percentile(client, 95))
    assert not s["warnings"]
    md = (out / "summary.md").read_text()
    section = md.split("## What the proxy added to TTFT")[1].split("\n## ")[0]
    assert "| proxy added P95 ms |" in section
    assert f"| {human('proxy_added_p95_s', percentile(ADDED_2, 95))} |" in section
    assert (out / "proxy_added.csv").is_file()


@pytest.mark.parametrize("second", ["loop", None])
def test_summarize_warns_when_rounds_mix_t0_source(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   second: str | None) -> None:
    """A kernel round beside a loop round, or beside an older proxy's round without the field."""
    recs = _round(1, 1000.0, "kernel", ADDED_1) + _round(2, 2000.0, second, ADDED_2)
    out = tmp_path / "out"
    assert evidence_main(["summarize", "--records", str(_write(tmp_path / "rec", recs)), "--out", str(out)]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    other = second or "unknown"
    assert len(err) == 1 and "t0_source" in err[0] and "kernel in 1 round" in err[0] and f"{other} in 1 round" in err[0]
    assert err[0] in json.loads((out / "summary.json").read_text())["warnings"]


def test_compare_warns_when_its_sides_mix_t0_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _write(tmp_path / "a", _round(1, 1000.0, "kernel", ADDED_1) + _round(2, 2000.0, "kernel", ADDED_2))
    b = _write(tmp_path / "b", _round(1, 1000.0, "loop", ADDED_1) + _round(2, 2000.0, "loop", ADDED_2))
    assert evidence_main(["compare", str(a), str(b), "--out", str(tmp_path / "cmp"), "--no-png"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(err) == 1 and "t0_source" in err[0] and "A A: kernel" in err[0] and "B B: loop" in err[0]
    assert err[0] in (tmp_path / "cmp" / "compare.md").read_text()
    same = _write(tmp_path / "c", _round(1, 1000.0, "kernel", ADDED_2) + _round(2, 2000.0, "kernel", ADDED_1))
    assert evidence_main(["compare", str(a), str(same), "--out", str(tmp_path / "cmp2"), "--no-png"]) == 0
    assert "warning:" not in capsys.readouterr().err


def _with_added(d: Path) -> dict[tuple[str, str], list[list[float]]]:
    """Give the report's records a t0_source and a proxy_added_s; the values per (engine, scenario), by round."""
    path = d / "requests.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    by_cell: dict[tuple[str, str], dict[int, list[float]]] = {}
    for i, r in enumerate(recs):
        r["t0_source"] = "kernel"
        r["proxy_added_s"] = 0.0001 * (1 + i % 7) * (1 + int(r["round"])) * (2 if r["engine"] == "vllm" else 1)
        by_cell.setdefault((r["engine"], r["scenario"]), {}).setdefault(r["round"], []).append(r["proxy_added_s"])
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return {cell: list(rounds.values()) for cell, rounds in by_cell.items()}


def test_the_report_shows_proxy_added_beside_ttft(tmp_path: Path) -> None:
    d = write_records(tmp_path / "run")
    added = _with_added(d)
    out = tmp_path / "report"
    assert evidence_main(["report", "--format", "md", "--records", str(d), "--out", str(out)]) == 0
    caveats = (out / "report.md").read_text().split("## Caveats")[1].split("\n## ")[0]
    assert "| engine | scenario | rounds | t0 (requests) | TTFT P95 (ms) | proxy added P50 (ms) |" in caveats
    rows = {(c[1].strip(), c[2].strip()): c for c in (line.split("|") for line in caveats.splitlines()
                                                      if line.startswith("| ") and "---" not in line)}
    for engine, scenario in (("sglang", "short-c4"), ("vllm", "long-c4")):
        p95s = [percentile(xs, 95) for xs in added[(engine, scenario)]]
        row = rows[(engine, scenario)]
        assert row[4].strip() == "kernel"
        h = lambda v: human("proxy_added_p95_s", v)  # noqa: E731
        assert row[7].strip() == f"{h(median(p95s))} [{h(min(p95s))}–{h(max(p95s))}]"
    assert "not recorded" not in caveats


def test_the_report_says_when_proxy_added_was_not_recorded(tmp_path: Path) -> None:
    d = write_records(tmp_path / "run")  # records as an older proxy wrote them
    out = tmp_path / "report"
    assert evidence_main(["report", "--format", "md", "--records", str(d), "--out", str(out)]) == 0
    caveats = (out / "report.md").read_text().split("## Caveats")[1]
    assert "proxy_added_s" in caveats and "not recorded" in caveats and "| proxy added P50 (ms) |" not in caveats
