"""SPEC 30/31 on the evidence side: ``evidence summarize`` and the report show each round's ITL
distribution, TTFT beside TTFO and spec acceptance, recomputed here from the records (with
``statistics``, not the summary's code path); embeddings and rerank rounds stay out of the
generation tables; ``evidence decode`` judges a capture by its own route, as the proxy did."""

from __future__ import annotations

import csv
import json
import random
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from exporter.core.stats import percentile
from exporter.evidence.cli import main
from exporter.evidence.decode import decode_capture
from exporter.evidence.noise import human
from exporter.harness.sim import build_params, create_sim_app

from tests.helpers import read_records
from tests.report_records import PLAN, write_records
from tests.unit.test_report_page import _Tables

EMBED = "v1/embeddings"


def _decode_fields(rec: dict[str, Any], rng: random.Random) -> None:
    """Per-request decode fields as a proxy measuring decode writes them (some requests without TTFO,
    the vLLM ones with spec-decode counts)."""
    p50 = rng.uniform(0.005, 0.02)
    rec.update(itl_p50_s=p50, itl_p95_s=p50 * rng.uniform(1.5, 3),
               itl_p99_s=p50 * 4, itl_max_s=p50 * rng.uniform(4, 60), text_events=rng.randint(40, 128),
               tokens_per_event=rng.uniform(1.0, 3.0), decode_stalls=rng.randint(0, 2), merged_reads=rng.randint(0, 3),
               ttfo_s=rec["ttft_s"] + 0.2 if rng.random() < 0.7 else None)
    if rec["engine"] == "vllm":
        rec.update(spec_draft_tokens=rng.randint(50, 90), spec_accepted_tokens=rng.randint(10, 50))


def _records(base: Path) -> tuple[Path, list[dict[str, Any]]]:
    """The report's records with decode fields, and an embeddings request in each round of short-c1."""
    d = write_records(base / "records")
    path = d / "requests.jsonl"
    rng = random.Random(11)
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    extra = []
    for rec in recs:
        rec["route"] = "v1/chat/completions"
        if rec["outcome"] == "success":
            _decode_fields(rec, rng)
        if rec["scenario"] == "short-c1" and rec["id"].endswith("-0"):
            extra.append({**{k: v for k, v in rec.items() if not k.startswith(("itl_", "spec_", "tt"))},
                          "id": rec["id"] + "-embed", "route": EMBED, "ttft_s": None, "tpot_s": None,
                          "completion_tokens": 0, "e2e_s": 0.0123 + rng.random() / 100, "outcome": "success",
                          "reason": None})
    path.write_text("".join(json.dumps(r) + "\n" for r in recs + extra))
    return d, recs + extra


def _rounds(recs: list[dict[str, Any]]) -> dict[tuple[str, str, int], list[dict[str, Any]]]:
    out: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        if r["scenario"] != "warmup" and r.get("route") != EMBED:
            out[(r["engine"], r["scenario"], r["round"])].append(r)
    return out


def _expected(recs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in recs if r["outcome"] == "success"]
    ttfo = [r["ttfo_s"] for r in ok if r.get("ttfo_s") is not None]
    spec = [r for r in ok if "spec_draft_tokens" in r]
    return {"itl_p50_med_s": statistics.median(r["itl_p50_s"] for r in ok),
            "itl_p95_med_s": statistics.median(r["itl_p95_s"] for r in ok),
            "itl_max_s": max(r["itl_max_s"] for r in ok), "decode_stalls": sum(r["decode_stalls"] for r in ok),
            "tokens_per_event_mean": statistics.fmean(r["tokens_per_event"] for r in ok),
            "ttft_p95_s": percentile([r["ttft_s"] for r in ok], 95), "ttfo_p50_s": percentile(ttfo, 50),
            "spec_acceptance_ratio": (sum(r["spec_accepted_tokens"] for r in spec) / sum(r["spec_draft_tokens"] for r in spec))
            if spec else None}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]], Path]:
    base = tmp_path_factory.mktemp("decode")
    d, recs = _records(base)
    out = base / "summary"
    assert main(["summarize", "--records", str(d), "--out", str(out)]) == 0
    return d, recs, out


def test_summarize_gives_each_rounds_decode_figures(run: tuple[Path, list[dict[str, Any]], Path]) -> None:
    _, recs, out = run
    summary = json.loads((out / "summary.json").read_text())
    rows = {(r["engine"], r["scenario"], r["round"]): r for r in summary["decode"]}
    expected = _rounds(recs)
    assert set(rows) == set(expected)
    for key, part in expected.items():
        want = _expected(part)
        for field, value in want.items():
            assert rows[key][field] == (pytest.approx(value) if value is not None else None), (key, field)
    with open(out / "decode.csv", newline="") as fh:
        assert len(list(csv.DictReader(fh))) == len(rows)
    md = (out / "summary.md").read_text()
    assert "## Decode" in md and "not a pooled percentile" in md and "spec acceptance %" in md


def test_pooling_requests_stay_out_of_the_generation_tables(run: tuple[Path, list[dict[str, Any]], Path]) -> None:
    _, recs, out = run
    summary = json.loads((out / "summary.json").read_text())
    gen = _rounds(recs)
    for row in summary["rounds"]:
        assert row["requests"] == len(gen[(row["engine"], row["scenario"], row["round"])])
    embeds = [r for r in recs if r.get("route") == EMBED]
    pooled = {(p["engine"], p["round"]): p for p in summary["pooling"]}
    assert len(pooled) == len(embeds) and all(p["route"] == EMBED for p in pooled.values())
    for r in embeds:
        assert pooled[(r["engine"], r["round"])]["e2e_p50_s"] == pytest.approx(r["e2e_s"])
    assert "## Embeddings and rerank" in (out / "summary.md").read_text()


def test_summarize_splits_decode_by_route(tmp_path: Path) -> None:
    d, recs = _records(tmp_path)
    path = d / "requests.jsonl"
    for i, r in enumerate(recs):
        if r.get("route") == "v1/chat/completions" and i % 2:
            r["route"] = "v1/responses"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert main(["summarize", "--records", str(d), "--out", str(tmp_path / "s")]) == 0
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    by = {(r["engine"], r["scenario"], r["round"], r["route"]): r for r in summary["decode"]}
    for (engine, scenario, rnd), part in _rounds(recs).items():
        for route in {r["route"] for r in part if r["outcome"] == "success"}:
            mine = [r for r in part if r.get("route") == route]
            assert by[(engine, scenario, rnd, route)]["itl_p95_med_s"] == pytest.approx(_expected(mine)["itl_p95_med_s"])


def test_report_shows_the_decode_table_per_cell(run: tuple[Path, list[dict[str, Any]], Path]) -> None:
    d, recs, out = run
    plan = out.parent / "plan.yaml"
    plan.write_text(PLAN)
    page = out.parent / "report"
    assert main(["report", "--format", "html", "--records", str(d), "--plan", str(plan), "--out", str(page)]) == 0
    parser = _Tables()
    parser.feed((page / "report.html").read_text())
    table = next(t for t in parser.tables if t[0][:2] == ["cell", "engine"] and "ITL med P95 (ms)" in t[0])
    col = table[0].index("ITL med P95 (ms)")
    shown = {(row[0], row[1]): row[col] for row in table[1:]}
    per_round = defaultdict(list)
    for (engine, scenario, _), part in _rounds(recs).items():
        per_round[(engine, scenario)].append(_expected(part)["itl_p95_med_s"])
    names = {"short-c1": "1024/128 C1", "short-c4": "1024/128 C4", "long-c4": "8192/128 C4"}
    for (engine, scenario), xs in per_round.items():
        if scenario not in names:  # the rate and calibration cells: named otherwise, or left out
            continue
        lo, hi = human("itl_p95_med_s", min(xs)), human("itl_p95_med_s", max(xs))
        want = human("itl_p95_med_s", statistics.median(xs)) + ("" if lo == hi else f" [{lo}–{hi}]")
        assert shown[(names[scenario], engine)] == want
    assert not any(row[0].startswith("probe") for row in table[1:])  # calibration stays out
    assert any(t[0][:3] == ["cell", "engine", "route"] and t[1][2] == EMBED for t in parser.tables)


@pytest.mark.parametrize("route,body", [
    ("v1/responses", {"model": "m", "input": "a b c", "stream": True, "max_output_tokens": 4, "ignore_eos": True}),
    ("v1/messages", {"model": "m", "messages": [{"role": "user", "content": "a b"}], "stream": True,
                     "max_tokens": 4, "ignore_eos": True}),
    ("v1/embeddings", {"model": "m", "input": ["a", "b c"]}),
    ("v1/rerank", {"model": "m", "query": "q", "documents": ["a", "b", "c"]}),
])
async def test_decode_judges_a_capture_by_its_route(aiohttp_server: Any, proxy_factory: Any, tmp_path: Path,
                                                    route: str, body: dict[str, Any]) -> None:
    sim = await aiohttp_server(create_sim_app(build_params("vllm", speed=200.0)))
    proxy = await proxy_factory(sim.port, capture_raw_sse="all")
    await (await proxy.post(f"/vllm/{route}", json=body)).read()
    rec, = read_records(tmp_path)
    assert rec["outcome"] == "success"
    result = decode_capture(Path(rec["capture"]))
    assert (result["verdict"], result["reason"]) == (rec["outcome"], rec["reason"]) and result["matches_proxy"]
    assert result["ok"] and result["visible_chars"] == rec["visible_chars"]


async def test_decode_judges_a_short_embeddings_answer_as_the_proxy_did(aiohttp_server: Any, proxy_factory: Any,
                                                                         tmp_path: Path) -> None:
    """One vector for two inputs: a failure at the proxy, and the same failure offline, since the
    capture keeps how many inputs were asked."""
    async def one_vector(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"object": "list", "model": "m", "data": [{"object": "embedding", "index": 0,
                                  "embedding": [0.5, 0.25]}], "usage": {"prompt_tokens": 3, "total_tokens": 3}})

    app = web.Application()
    app.router.add_post("/v1/embeddings", one_vector)
    server = await aiohttp_server(app)
    proxy = await proxy_factory(server.port, capture_raw_sse="all")
    await (await proxy.post("/vllm/v1/embeddings", json={"model": "m", "input": ["a", "b c"]})).read()
    rec, = read_records(tmp_path)
    assert rec["outcome"] == "failure", rec
    result = decode_capture(Path(rec["capture"]))
    assert (result["verdict"], result["reason"]) == (rec["outcome"], rec["reason"]) and result["matches_proxy"]
