"""The comparison board's "Where TTFT goes": per engine, the exact means of queue, prefill and
outside-the-engine stacked so that they add up to the mean TTFT (Grafana and the PNG board alike),
beside the P95 of each part; the three histograms exist at zero for every scenario of an engine
from the first time it tells its clock, so that a later round shorter than a scrape interval is
counted whole."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pytest

from dashboards.boards import GENERATED
from dashboards.catalogue import BOARDS, ENGINE_COLORS, PANELS
from exporter.evidence import cli as evidence_cli
from exporter.evidence import render
from exporter.evidence.stacking import stacked

HISTOGRAMS = ("llmbench_engine_queue_seconds", "llmbench_engine_prefill_seconds",
              "llmbench_ttft_outside_engine_seconds")


def _series(name: str, values: list[float], ref: str) -> dict[str, Any]:
    return {"name": name, "times": [1000.0 + 5 * i for i in range(len(values))], "values": values, "ref": ref}


def test_the_comparison_board_has_where_ttft_goes() -> None:
    keys = [p.key for p in BOARDS["comparison"].panels]
    assert "ttft_parts" in keys and "ttft_parts_p95" in keys
    means, p95 = PANELS["ttft_parts"], PANELS["ttft_parts_p95"]
    assert means.title == "Where TTFT goes" and means.stack and not p95.stack
    for panel, word in ((means, "mean"), (p95, "P95")):
        assert [q.legend.split(" ", 1)[1] for q in panel.queries] == [f"queue {word}", f"prefill {word}",
                                                                      f"outside engine {word}"]
        for q, metric in zip(panel.queries, HISTOGRAMS):  # bottom to top: queue, prefill, outside
            assert metric in q.expr
    assert all("_sum" in q.expr and "_count" in q.expr for q in means.queries)
    assert all(q.expr.startswith("histogram_quantile(0.95") for q in p95.queries)


def test_grafana_stacks_each_engine_on_its_own_in_its_colour() -> None:
    board = json.loads((GENERATED / "comparison.json").read_text())
    panel = next(p for p in board["panels"] if p.get("title") == "Where TTFT goes")
    assert panel["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    overrides = panel["fieldConfig"]["overrides"]
    for engine, color in ENGINE_COLORS.items():
        mine = [o for o in overrides if o["matcher"]["options"] == f"^{engine}.*"]
        props = {p["id"]: p["value"] for o in mine for p in o["properties"]}
        assert props["custom.stacking"] == {"mode": "normal", "group": engine}
        assert props["color"] == {"mode": "shades", "fixedColor": color}


def test_stacked_puts_each_engines_parts_on_top_of_each_other() -> None:
    nan = math.nan
    series = [_series("vllm queue mean", [0.4, 0.5, nan], "A"), _series("sglang queue mean", [nan] * 3, "A"),
              _series("vllm prefill mean", [0.1, nan, 0.2], "B"), _series("vllm outside engine mean", [0.05] * 3, "C")]
    out = stacked(series)
    assert [s["name"] for s in out] == ["vllm queue mean", "vllm prefill mean", "vllm outside engine mean"]
    queue, prefill, outside = out
    assert prefill["values"][0] == pytest.approx(0.5) and math.isnan(prefill["values"][1])  # a gap stays one
    assert prefill["values"][2] == pytest.approx(0.2) and prefill["below"] == [0.4, 0.5, 0.0]
    assert outside["values"] == pytest.approx([0.55, 0.55, 0.25])  # on the top below it at each time


def test_the_png_board_fills_each_part_and_tops_out_at_the_mean_ttft() -> None:
    fig = plt.figure()
    ax = fig.add_axes((0.1, 0.1, 0.6, 0.8))
    parts = [_series("vllm queue mean", [0.40, 0.45], "A"), _series("vllm prefill mean", [0.06, 0.06], "B"),
             _series("vllm outside engine mean", [0.01, 0.02], "C")]
    render._timeseries(ax, PANELS["ttft_parts"], parts, 1.0, "s")
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert np.asarray(lines["vllm outside engine mean"].get_ydata(), dtype=float).tolist() == pytest.approx([0.47, 0.53])
    assert len(ax.collections) == 3  # one band per part
    colors = render._colors(PANELS["ttft_parts"], parts)
    assert colors["vllm queue mean"] == ENGINE_COLORS["vllm"] and len(set(colors.values())) == 3
    assert ax.get_ylim()[1] >= 0.53
    plt.close(fig)


async def test_no_parts_histograms_before_an_engine_tells_its_clock(proxy_factory: Any) -> None:
    """Few engines tell their own clock: /metrics carries no ~200 series per scenario of zeros
    for those that never do (tests/unit/test_engine_timing.py: they appear, at zero for every
    scenario, when one does)."""
    client = await proxy_factory(1)  # no request: nothing reaches the upstream
    text = await (await client.get("/metrics")).text()
    assert "llmbench_time_to_first_token_seconds_count{" in text  # the page itself is there
    for name in HISTOGRAMS:
        assert f"{name}_count{{" not in text, name


class _Prom:
    """A Prometheus query API that has the three parts' series of vLLM and nothing else."""

    url = "http://prometheus.test"
    header_names: list[str] = []
    extra_params: dict[str, str] = {}
    PARTS = {"llmbench_engine_queue_seconds": 0.4, "llmbench_engine_prefill_seconds": 0.06,
             "llmbench_ttft_outside_engine_seconds": 0.01}

    def backend(self) -> dict[str, Any]:
        return {"name": "Prometheus", "version": "3.1.0", "revision": "test", "how": "status/buildinfo"}

    def buildinfo(self) -> dict[str, Any]:
        return {"version": "3.1.0"}

    def scrape_intervals(self) -> dict[str, float]:
        return {"llmbench-exporter": 5.0}

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        return []

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        value = next((v for name, v in self.PARTS.items() if name in expr), None)
        return [] if value is None else [{"metric": {"engine": "vllm"}, "values": [[start, str(value)],
                                                                                  [end, str(value)]]}]


def test_the_export_explains_the_parts_and_draws_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evidence_cli, "_prom", lambda args: _Prom())
    t0, out = float(int(time.time()) - 3600), tmp_path / "ev"
    assert evidence_cli.main(["export", "--prometheus", _Prom.url, "--window", f"{t0:.0f},{t0 + 600:.0f}",
                              "--out", str(out), "--boards", "comparison"]) == 0
    md = (out / "EVIDENCE.md").read_text()
    section = md[md.index("### Where TTFT goes\n"):md.index("### Where TTFT goes: P95")]
    assert "stacked" in section and "add up to the mean TTFT" in section
    assert "the HTTP server, tokenizing, the hand-offs between the engine's processes, detokenizing, the " \
           "network" in section
    for last in ("vllm queue mean 0.4", "vllm prefill mean 0.06", "vllm outside engine mean 0.01"):
        assert f"Last value: {last}" in section
    rows = (out / "data" / "comparison" / "ttft_parts.csv").read_text()
    assert "vllm queue mean" in rows and (out / "comparison.png").stat().st_size > 10_000
