"""``evidence export`` of one scenario round as docs/quickstart.md step 6 makes it: a ``curl POST
/-/scenario``, a bench client that takes a while to start (loading its tokenizer, sampling its
dataset) before its first request and to exit after its last, then the round cleared.  Simulated
engines, the real proxy and a real Prometheus (the repo's 5 s scrapes).

Another scenario (``in8k-c1``: both engines, some vLLM empty-text failures) runs just before the
round (``short-c4``: vLLM only, no failure), in the same minute, as the quick start's cells do.

* ``round_totals`` gives, beside the announced span's figures, the round's throughput over its
  requests' own span, as ``evidence summarize`` computes it (checked against the records here);
* the boards' queries of a scenario window are filtered by its scenario: the other scenario's
  series of that minute (sglang's throughput, vLLM's empty-text failures) are not in the export;
* the PNG boards mark each 1-minute-rate panel drawn over a shorter window in its title.

Nothing here assumes how long anything takes: the expected figures come from the records the
proxy wrote; the load waits for Prometheus to scrape the other scenario's requests before the round
and the round's before it is cleared (a 1-minute rate there holds both, short of a stall of most
of a minute), and the test checks that the other scenario shows in that window without the filter.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.axes
import pytest
import requests

from dashboards.catalogue import BOARDS, PANELS
from exporter.evidence import export, render
from exporter.evidence.cli import main as evidence_main
from exporter.evidence.evidence_md import panel_kind
from exporter.evidence.merge import load_records
from exporter.evidence.promapi import Prometheus
from exporter.harness.stack import LocalStack

from tests.helpers import require_prometheus, scrapes_since

OTHER, ROUND = "in8k-c1", "short-c4"
#: how long the bench client takes to start before its first request, and to exit after its last
STARTUP_S, EXIT_S = 3.0, 1.0
BODY = {"model": "m", "prompt": "a b c d", "max_tokens": 24, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True}}


@dataclass
class Site:
    prom: str
    records: Path
    out: Path


def _send(proxy: str, engine: str, n: int, fault_every: int = 0) -> None:
    """``n`` streamed completions, four at a time; every ``fault_every``-th an empty-text 200."""
    def one(i: int) -> None:
        headers = {"X-Sim-Fault": "empty_text"} if fault_every and i % fault_every == 0 else {}
        with requests.post(f"{proxy}/{engine}/v1/completions", json=BODY, headers=headers, timeout=60,
                           stream=True) as r:
            for _ in r.iter_content(chunk_size=None):
                pass

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(n)))


def _announce(proxy: str, scenario: str | None, rnd: int = 1) -> None:
    requests.post(f"{proxy}/-/scenario", json={"scenario": scenario, "round": rnd}, timeout=30).raise_for_status()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    require_prometheus()
    tmp = tmp_path_factory.mktemp("scenario-round")
    with LocalStack(tmp / "stack") as stack:
        stack.start(scenarios=[OTHER, ROUND], speed=5)
        prom = stack.start_prometheus()
        proxy = stack.proxy_url
        instance = proxy.removeprefix("http://")
        # Prometheus has scraped the proxy before the other scenario (start_prometheus waits for it)
        _announce(proxy, OTHER)
        _send(proxy, "sglang", 8)
        _send(proxy, "vllm", 9, fault_every=3)
        scrapes_since(prom, instance, time.time())  # its requests scraped: in the minute before the round
        _announce(proxy, ROUND)  # the quick start's curl; then the bench client starts
        time.sleep(STARTUP_S)
        _send(proxy, "vllm", 12)
        scrapes_since(prom, instance, time.time())  # the round's requests scraped inside it ...
        time.sleep(EXIT_S)  # ... as the client exits
        _announce(proxy, None)
        # two scrapes after the round, and the rules evaluated after them
        scrapes_since(prom, instance, time.time(), n=2, rules=True)
        yield Site(prom, tmp / "stack" / "records", tmp)


def _export(site: Site, window: str, name: str, *extra: str) -> tuple[Path, dict[str, Any]]:
    out = site.out / name
    assert evidence_main(["export", "--prometheus", site.prom, "--window", window, "--out", str(out),
                          "--boards", "comparison", *extra]) == 0
    return out, json.loads((out / "manifest.json").read_text())


def _round_records(site: Site, engine: str) -> list[dict[str, Any]]:
    return [r for r in load_records(site.records) if r["engine"] == engine and r["scenario"] == ROUND
            and str(r["round"]) == "1"]


def test_round_totals_give_the_requests_span_beside_the_announced_one(site: Site) -> None:
    out, manifest = _export(site, f"scenario:{ROUND}#1", "round", "--records", str(site.records))
    totals = manifest["round_totals"]
    mine = _round_records(site, "vllm")
    assert len(mine) == 12 and all(r["outcome"] == "success" for r in mine)
    first = min(r["start_unix"] for r in mine)
    last = max(r["start_unix"] + r["e2e_s"] for r in mine)
    tokens = sum(r["completion_tokens"] for r in mine if r["outcome"] == "success")
    v = totals["vllm"]
    # the records' figures, as evidence summarize computes them: first arrival to last end
    assert v["requests_span_s"] == pytest.approx(last - first, rel=1e-9)
    assert v["output_tokens_per_s_requests"] == pytest.approx(tokens / (last - first), rel=1e-9)
    assert (v["requests_first_start"], v["requests_last_end"]) == (pytest.approx(first), pytest.approx(last))
    assert v["records_requests"] == 12 and v["records_output_tokens"] == tokens == 12 * BODY["max_tokens"]
    # the SPEC's figure stays over the announced span, which holds the client's start-up and exit
    assert v["output_tokens_per_s"] == pytest.approx(v["output_tokens"] / v["announced_s"])
    assert v["announced_s"] >= v["requests_span_s"] + STARTUP_S + EXIT_S - 0.5
    # sglang had the round announced too, and sent nothing in it
    assert totals["sglang"]["requests"] == 0 and totals["sglang"]["requests_span_s"] is None
    md = (out / "EVIDENCE.md").read_text()
    section = md.split("## Round totals")[1].split("\n## ")[0]
    assert "tok/s over the requests' span" in section and "evidence summarize" in section
    row = next(x for x in section.splitlines() if x.startswith("| vllm |"))
    assert f"| {v['output_tokens_per_s_requests']:.1f} |" in row and f"| {v['requests_span_s']:.3f} s |" in row
    differ = abs(v["announced_s"] - v["requests_span_s"]) > 0.2 * v["requests_span_s"]
    assert ("start-up" in section) == differ  # one sentence why, where the spans differ by more than 20 %


def test_a_scenario_window_filters_the_boards_by_its_scenario(site: Site) -> None:
    """The user's short-c32 window showed vLLM lines of the scenarios run in the minute before."""
    out, manifest = _export(site, f"scenario:{ROUND}#1", "filtered", "--records", str(site.records))
    # the same window given as START,END keeps every scenario: there the other one's series are in
    # that minute (sglang's throughput, vLLM's empty-text failures)
    w = manifest["window"]
    plain_out, plain = _export(site, f"{w['start']:.3f},{w['end']:.3f}", "plain")
    assert _nonzero(plain_out, "throughput", "sglang") and _nonzero(plain_out, "failure_ratio", "empty_text")
    with_var = [k for k in BOARDS["comparison"].panels if "$scenario" in " ".join(k.exprs)]
    filtered = [k for k in with_var if panel_kind(k) != "exact-count"]
    assert filtered and any(panel_kind(p) == "rate" for p in filtered)
    # the exact counts stay whole: every request that ended in the window, as for any window
    for panel in (k for k in with_var if panel_kind(k) == "exact-count"):
        docs = [json.loads((d / "data" / "comparison" / f"{panel.key}.json").read_text()) for d in (out, plain_out)]
        assert [[s["values"] for s in q["series"]] for q in docs[0]["queries"]] == \
            [[s["values"] for s in q["series"]] for q in docs[1]["queries"]], panel.key
    for panel in filtered:
        doc = json.loads((out / "data" / "comparison" / f"{panel.key}.json").read_text())
        assert all(f'scenario=~"{ROUND}"' in q["expr"] for q in doc["queries"]), panel.key
        assert not _nonzero(out, panel.key, "sglang"), panel.key  # sglang ran only the other scenario
        assert not _nonzero(out, panel.key, "empty_text"), panel.key
        plain_doc = json.loads((plain_out / "data" / "comparison" / f"{panel.key}.json").read_text())
        assert all("scenario" not in q["expr"] for q in plain_doc["queries"]), panel.key
    assert _nonzero(out, "throughput", "vllm")  # the round itself is there
    for line in (out / "data" / "comparison" / "failure_ratio.csv").read_text().splitlines()[1:]:
        value = float(line.rsplit(",", 1)[1])
        assert "empty_text" not in line or value == 0.0 or math.isnan(value), line
    # EVIDENCE.md and manifest.json say so
    assert manifest["scenario_filter"] == ROUND and plain["scenario_filter"] is None
    assert f"- Scenario filter: `{ROUND}`" in (out / "EVIDENCE.md").read_text()
    assert "- Scenario filter: none" in (plain_out / "EVIDENCE.md").read_text()
    # the round totals count as before: their own selector, the scenario exactly
    assert manifest["round_totals"]["vllm"]["requests"] == 12
    # Prometheus reads an escaped name as the name itself (RE2's escapes, the string's backslashes)
    api = Prometheus(site.prom)
    assert api.query(f'count(llmbench_requests_total{{scenario=~"{export.regex_literal(ROUND)}"}})')
    assert api.query(f'llmbench_requests_total{{scenario=~"{export.regex_literal(ROUND[:5] + ".*")}"}}') == []
    assert api.query(f'llmbench_requests_total{{scenario=~"{export.regex_literal("a.b{1},|" + chr(34) + "q")}"}}') == []


def _nonzero(out: Path, panel: str, word: str) -> bool:
    """Whether a series of the panel whose name or labels hold ``word`` has a value other than 0."""
    doc = json.loads((out / "data" / "comparison" / f"{panel}.json").read_text())
    return any(v not in (None, 0.0) for q in doc["queries"] for s in q["series"]
               if word in s["name"] or word in s["labels"].values() for _, v in s["values"])


def test_the_png_marks_rate_panels_over_a_shorter_window(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    """The titles the renderer gives matplotlib (the last one of each panel: a title too long for a
    narrow panel is given again without its tail), not pixels."""
    given: dict[int, str] = {}
    original = matplotlib.axes.Axes.set_title

    def spy(self: Any, label: str, *args: Any, **kwargs: Any) -> Any:
        given[id(self)] = label
        return original(self, label, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", spy)
    _, manifest = _export(site, f"scenario:{ROUND}#1", "png", "--records", str(site.records))
    titles = list(given.values())
    seconds = manifest["window"]["end"] - manifest["window"]["start"]
    assert seconds < 60
    mark = f" — 1m rate, window {seconds:.0f} s" if seconds >= 10 else f" — 1m rate, window {seconds:.1f} s"
    assert f"Successful output throughput (tok/s){mark}: see round totals" in titles
    assert f"TTFT P95 (s){mark}: see evidence summarize" in titles
    board = BOARDS["comparison"].panels
    assert len(titles) == len(board)
    for panel in board:
        base = render.panel_title(panel)  # the title and its unit
        marked = [t for t in titles if t == base or t.startswith(f"{base} — ")]
        assert len(marked) == 1 and (mark in marked[0]) == (panel_kind(panel) == "rate"), (panel.key, marked)
    assert "Requests in flight" in titles and "Success ratio (%)" in titles  # a gauge, an exact count
    # a window longer than the rate window: no mark
    given.clear()
    end = manifest["window"]["end"]
    _export(site, f"{end - 600:.0f},{end:.0f}", "long")
    titles = list(given.values())
    assert len(titles) == len(board) and not any("rate, window" in t for t in titles)
    assert f"{PANELS['throughput'].title} (tok/s)" in titles
