"""``evidence report --format html|md``: every core-matrix cell recomputed from ``requests.jsonl``
here (with the core's percentile, not the report's code path) and found in the page; the
denominators without warm-ups and calibration; the attachments' hashes; the command's mistakes
answered with one line and exit 2."""

from __future__ import annotations

import hashlib
import json
import statistics
from collections import defaultdict
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from exporter.core.stats import percentile
from exporter.evidence.cli import main
from exporter.evidence.noise import human
from exporter.evidence.report.doc import SECTION_TITLES

from tests.report_records import CELLS, PLAN, RUN, write_records


class _Tables(HTMLParser):
    """Every table of the page as rows of cell texts (rowspans filled in), and the h2 headings."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.headings: list[str] = []
        self._cell: list[str] | None = None
        self._span = 1
        self._spans: dict[int, tuple[int, str]] = {}
        self._in_h2 = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append([])
            self._spans = {}
        elif tag == "tr":
            self.tables[-1].append([])
            self._fill()
        elif tag in ("td", "th"):
            self._cell, self._span = [], int(dict(attrs).get("rowspan") or 1)
        elif tag == "h2":
            self._in_h2 = True
            self.headings.append("")

    def _fill(self) -> None:
        row = self.tables[-1][-1]
        while len(row) in self._spans:
            left, text = self._spans[len(row)]
            row.append(text)
            self._spans = {k: v for k, v in self._spans.items() if k != len(row) - 1} if left <= 1 else \
                {**self._spans, len(row) - 1: (left - 1, text)}

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            text = "".join(self._cell).strip()
            row = self.tables[-1][-1]
            if self._span > 1:
                self._spans[len(row)] = (self._span - 1, text)
            row.append(text)
            self._cell = None
            self._fill()
        elif tag == "h2":
            self._in_h2 = False

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        if self._in_h2:
            self.headings[-1] += data


def _expected_cells(records: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, str]]:
    """(engine, scenario) -> the figures the matrix must show, computed from the records here."""
    rounds: dict[tuple[str, str], dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r["scenario"] != "warmup":
            rounds[(r["engine"], r["scenario"])][r["round"]].append(r)
    out = {}
    for key, by_round in rounds.items():
        per: dict[str, list[float]] = defaultdict(list)
        success = total = passed = 0
        for recs in by_round.values():
            ok = [r for r in recs if r["outcome"] == "success"]
            success, total, passed = success + len(ok), total + len(recs), passed + (len(ok) == len(recs))
            duration = max(r["start_unix"] + r["e2e_s"] for r in recs) - min(r["start_unix"] for r in recs)
            per["ttft_p95_s"].append(percentile([r["ttft_s"] for r in ok], 95))
            per["tpot_p95_s"].append(percentile([r["tpot_s"] for r in ok], 95))
            per["output_throughput_tok_s"].append(sum(r["completion_tokens"] for r in ok) / duration)
        cell = {"success k/n": f"{success}/{total}", "rounds passed": f"{passed}/{len(by_round)}"}
        for k, xs in per.items():
            lo, hi = human(k, min(xs)), human(k, max(xs))
            cell[k] = human(k, statistics.median(xs)) + ("" if lo == hi else f" [{lo}–{hi}]")
        out[key] = cell
    return out


_FIGURE_OF = {"success k/n": "success k/n (requests)", "rounds passed": "rounds passed r/R",
              "ttft_p95_s": "TTFT P95 (ms), median [min–max]", "tpot_p95_s": "TPOT P95 (ms), median [min–max]",
              "output_throughput_tok_s": "output throughput (tok/s), median [min–max]"}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    base = tmp_path_factory.mktemp("report")
    records = write_records(base / "records")
    plan = base / "plan.yaml"
    plan.write_text(PLAN)
    out = base / "out"
    assert main(["report", "--format", "html", "--records", str(records), "--plan", str(plan),
                 "--out", str(out)]) == 0
    return records, plan, out


def test_every_core_matrix_cell_equals_the_records(made: tuple[Path, Path, Path]) -> None:
    records, _, out = made
    recs = [json.loads(line) for line in (records / "requests.jsonl").read_text().splitlines()]
    page = _Tables()
    page.feed((out / "report.html").read_text())
    matrix = next(t for t in page.tables if t[0][:2] == ["shape (in/out tokens)", "figure"])
    head = matrix[0]
    shown = {(row[0], row[1], head[j]): row[j]
             for row in matrix[1:] for j in range(2, len(head))}
    checked = 0
    for (engine, scenario), cell in _expected_cells(recs).items():
        inp, outp, conc, _, stage, _, _ = CELLS[scenario]
        if stage != "core":
            continue
        for key, want in cell.items():
            got = shown[(f"{inp}/{outp}", _FIGURE_OF[key], f"C{conc} {engine}")]
            assert got == want, (engine, scenario, key, got, want)
            checked += 1
    assert checked == 2 * 3 * 5  # two engines, three core cells, five figures


def test_warmups_and_calibration_stay_out_of_the_totals(made: tuple[Path, Path, Path]) -> None:
    _, _, out = made
    doc = json.loads((out / "summary.json").read_text())
    totals = doc["report"]["totals"]
    counted = {s: c for s, c in CELLS.items() if c[4] != "calibration"}
    assert totals["requests"] == 2 * sum(c[5] * c[6] for c in counted.values())
    assert totals["rounds"] == 2 * sum(c[5] for c in counted.values())
    assert totals["warmup_requests"] == 2 * 2 * len(CELLS)
    assert totals["calibration_requests"] == 2 * CELLS["probe"][5] * CELLS["probe"][6]
    assert totals["failures"] == 2  # the empty 200 and the client abort
    assert doc["report"]["calibration"] == ["probe"]


def test_sections_rate_sweep_and_failures_are_on_the_page(made: tuple[Path, Path, Path]) -> None:
    _, _, out = made
    text = (out / "report.html").read_text()
    page = _Tables()
    page.feed(text)
    assert page.headings == list(SECTION_TITLES)
    sweep = next(t for t in page.tables if t[0][0] == "rate (req/s)")
    assert [row[0] for row in sweep[1:]] == ["2"]
    fields = next(t for t in page.tables if t[0][:2] == ["engine", "scenario#round"] and "fields" in t[0])
    assert len(fields) == 2 and fields[1][0] == "vllm" and "visible_text_length=0" in fields[1][3]
    assert "accepted_as_success=False" in fields[1][3]
    assert "http://" not in text.replace("http://127.0.0.1:1", "") and "https://" not in text
    assert text.count("data:image/png;base64,") == 4 + 1 + 1  # four metrics, the frontier, the rate sweep


def test_the_manifest_hashes_every_file_and_the_records(made: tuple[Path, Path, Path]) -> None:
    records, _, out = made
    manifest = json.loads((out / "manifest.json").read_text())
    names = {f["path"] for f in manifest["files"]}
    assert {"report.html", "summary.json", "rounds.csv"} <= names
    for f in manifest["files"]:
        assert hashlib.sha256((out / f["path"]).read_bytes()).hexdigest() == f["sha256"]
    hashed = {Path(r["path"]).name: r["sha256"] for r in manifest["records"]}
    for name in ("requests.jsonl", "scenarios.jsonl", "engines.jsonl"):
        assert hashed[name] == hashlib.sha256((records / name).read_bytes()).hexdigest()
    assert manifest["run_id"] == RUN


def test_markdown_writes_its_pngs(made: tuple[Path, Path, Path], tmp_path: Path) -> None:
    records, plan, _ = made
    out = tmp_path / "md"
    assert main(["report", "--format", "md", "--records", str(records), "--plan", str(plan), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    pngs = [line.split("](")[1].rstrip(")") for line in md.splitlines() if line.startswith("![")]
    assert len(pngs) == 6
    for name in pngs:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [line[3:] for line in md.splitlines() if line.startswith("## ")] == list(SECTION_TITLES)


def test_without_cells_the_scenarios_are_unpivoted(tmp_path: Path) -> None:
    records = write_records(tmp_path / "records")
    lines = [json.loads(x) for x in (records / "scenarios.jsonl").read_text().splitlines()]
    (records / "scenarios.jsonl").write_text("".join(json.dumps({k: v for k, v in x.items() if k != "cell"}) + "\n"
                                                     for x in lines))
    assert main(["report", "--format", "html", "--records", str(records), "--out", str(tmp_path / "o")]) == 0
    page = _Tables()
    page.feed((tmp_path / "o" / "report.html").read_text())
    unpivoted = next(t for t in page.tables if t[0][:2] == ["engine", "scenario"] and "success k/n" in t[0])
    assert {row[1] for row in unpivoted[1:]} == set(CELLS)


@pytest.mark.parametrize("extra, why", [
    (["--format", "html", "--plan", "/nonexistent/plan.yaml"], "--plan /nonexistent/plan.yaml: cannot read"),
    (["--format", "html", "--run", "nope"], "--run nope: no records of that run"),
    (["--format", "llm-d", "--plan", "x.yaml"], "--plan belong to --format html|md"),
    (["--format", "html", "--baseline", "/nonexistent/dir"], "no records"),
])
def test_mistakes_are_one_line_and_exit_2(made: tuple[Path, Path, Path], tmp_path: Path, extra: list[str], why: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    records, _, _ = made
    assert main(["report", "--records", str(records), "--out", str(tmp_path / "o"), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and why in err, err


def test_a_non_empty_out_is_refused_without_force(made: tuple[Path, Path, Path],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    records, _, out = made
    before = (out / "report.html").read_bytes()
    assert main(["report", "--format", "html", "--records", str(records), "--out", str(out)]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert (out / "report.html").read_bytes() == before


def test_two_runs_need_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = write_records(tmp_path / "records")
    lines = (records / "requests.jsonl").read_text().splitlines()
    other = [json.dumps({**json.loads(x), "run_id": "20260102T000000Z-ffffff", "id": f"b{i}"})
             for i, x in enumerate(lines[:5])]
    (records / "requests.jsonl").write_text("\n".join(lines + other) + "\n")
    assert main(["report", "--format", "html", "--records", str(records), "--out", str(tmp_path / "o")]) == 2
    assert "pick one with --run ID" in capsys.readouterr().err
    assert main(["report", "--format", "html", "--records", str(records), "--run", RUN,
                 "--out", str(tmp_path / "o")]) == 0


def test_history_against_a_baseline_gives_the_noise_verdict(made: tuple[Path, Path, Path], tmp_path: Path) -> None:
    records, plan, _ = made
    baseline = write_records(tmp_path / "baseline")
    lines = [json.loads(x) for x in (baseline / "requests.jsonl").read_text().splitlines()]
    for r in lines:  # the earlier run answered ten times sooner
        r["run_id"] = "20251201T000000Z-000000"
        if r["ttft_s"] is not None:
            r["ttft_s"] /= 10
    (baseline / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    out = tmp_path / "o"
    assert main(["report", "--format", "html", "--records", str(records), "--plan", str(plan), "--baseline",
                 str(baseline), "--out", str(out)]) == 0
    page = _Tables()
    page.feed((out / "report.html").read_text())
    history = next(t for t in page.tables if t[0] == ["engine", "scenario", "figure", "baseline", "this run", "delta",
                                                       "verdict"])
    verdicts = {(row[0], row[1], row[2]): row[6] for row in history[1:]}
    assert verdicts[("sglang", "short-c4", "TTFT P95 (ms)")] == "worse"
    assert verdicts[("vllm", "long-c4", "TTFT P95 (ms)")] == "worse"
    assert verdicts[("sglang", "short-c4", "Success ratio (%)")] == "within noise"


def test_an_empty_200s_token_ids_come_from_its_capture(tmp_path: Path) -> None:
    from exporter.proxy.records import Capture, write_capture

    records = write_records(tmp_path / "records")
    lines = [json.loads(x) for x in (records / "requests.jsonl").read_text().splitlines()]
    empty = next(r for r in lines if r["reason"] == "empty_text")
    chunk = {"choices": [{"index": 0, "text": "", "token_ids": [2, 2, 2]}]}
    body = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
    cap = Capture(limit=1 << 20)
    cap.add(body, 0.01)
    write_capture(records / "captures", empty["id"], cap, {"status": 200, "streaming": True})
    empty["capture"] = f"captures/{empty['id']}.sse"
    (records / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    out = tmp_path / "o"
    assert main(["report", "--format", "html", "--records", str(records), "--out", str(out)]) == 0
    page = _Tables()
    page.feed((out / "report.html").read_text())
    fields = next(t for t in page.tables if t[0][:2] == ["engine", "scenario#round"] and "fields" in t[0])
    assert fields[1][4].startswith("3 token ids: [2, 2, 2]"), fields[1]
