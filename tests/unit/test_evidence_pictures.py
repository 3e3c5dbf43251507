"""PNG boards a person reads at a glance (issue 22 item 4), and EVIDENCE.md's honest quantiles
(issue 19 item 2): what the pictures and the report show, from the functions that decide it."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt

from dashboards.catalogue import ENGINE_COLORS, PANELS
from exporter.evidence import render
from exporter.evidence.report import QueryEvidence, _query_lines, below_first_bucket


def _series(name: str, values: list[float], ref: str = "A") -> dict:
    return {"name": name, "times": [1000.0 + 5 * i for i in range(len(values))], "values": values, "ref": ref}


def test_many_reasons_become_the_top_few_and_other_reasons() -> None:
    reasons = [_series(f"vllm reason{i}", [float(i)] * 4) for i in range(12)]  # reason0 is zero throughout
    shown = render.top_series(reasons)
    assert [s["name"] for s in shown[:-1]] == [f"vllm reason{i}" for i in (11, 10, 9, 8, 7)]
    other = shown[-1]
    assert other["name"] == "other reasons (6)" and other["values"] == [float(sum(range(1, 7)))] * 4
    # few enough: all shown, the all-zero ones left out
    assert [s["name"] for s in render.top_series(reasons[:4])] == ["vllm reason3", "vllm reason2", "vllm reason1"]


def test_each_series_of_a_reason_panel_gets_its_own_colour_and_none_is_an_engines() -> None:
    panel = PANELS["failure_ratio"]
    names = [f"{e} {r}" for e in ENGINE_COLORS for r in ("empty_text", "timeout", "http_status")]
    colors = render._colors(panel, [_series(n, [1.0]) for n in names])
    assert len(set(colors.values())) == len(names)
    assert not set(colors.values()) & set(ENGINE_COLORS.values())


def test_flat_series_get_an_axis_that_shows_them_flat() -> None:
    assert render.flat_limits([0.0, 0.0, math.nan], from_zero=False) == (0.0, 1.0)
    assert render.flat_limits([2.0, 2.0], from_zero=False) == (0.0, 2.5)
    assert render.flat_limits([124.0, 124.7], from_zero=True) == (0.0, 124.7 * 1.08)
    assert render.flat_limits([1.0, 3.0], from_zero=False) is None  # matplotlib's own axis


def test_the_timing_error_has_an_axis_of_its_own_in_ms() -> None:
    panel = PANELS["proxy_timing_error"]
    fig = plt.figure()
    ax = fig.add_axes((0.1, 0.1, 0.6, 0.8))
    series = [_series("loop lag P99 p:1", [0.0004, 0.0006], "A"), _series("vllm timing error P95", [0.1, 0.3], "B"),
              _series("vllm proxy TTFT P95", [10.0, 12.0], "D")]
    left, right = render._timeseries(ax, panel, series, 1.0)
    assert [ln.get_label() for ln in left.get_lines() if not ln.get_label().startswith("_")] == ["vllm proxy TTFT P95"]
    drawn = {ln.get_label(): list(ln.get_ydata()) for ln in right.get_lines() if not ln.get_label().startswith("_")}
    assert drawn == {"loop lag P99 p:1": [0.4, 0.6], "vllm timing error P95": [100.0, 300.0]}  # in ms
    assert right.get_ylabel() == "timing error (ms)" and right.get_ylim()[0] == 0
    assert any(ln.get_ydata()[0] == 1.0 for ln in right.get_lines())  # the 1 ms threshold, on the ms axis
    plt.close(fig)


def test_evidence_marks_a_quantile_in_the_first_bucket() -> None:
    ev = QueryEvidence("C", "histogram_quantile(0.95, ...)", "vllm queue time P95", first_bucket=0.3)
    ev.series = [{"name": "vllm queue time P95", "labels": {}, "times": [1.0, 2.0], "values": [0.285, 0.29]}]
    ev.points, ev.in_first_bucket = 2, 2
    text = "\n".join(_query_lines(ev))
    assert "vllm queue time P95 below the first bucket bound (0.3 s)" in text and "0.29" not in text
    assert below_first_bucket(0.3) == "below the first bucket bound (0.3 s)"
    ev.series[0]["values"] = [0.285, 0.9]
    assert "vllm queue time P95 0.9" in "\n".join(_query_lines(ev))
