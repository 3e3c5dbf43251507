"""PNG boards a person reads at a glance (issue 22 item 4), and EVIDENCE.md's honest quantiles
(issue 19 item 2): what the pictures and the report show, from the functions that decide it."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import pytest

from dashboards.catalogue import ENGINE_COLORS, PANELS
from exporter.evidence import render
from exporter.evidence.evidence_md import QueryEvidence, _query_lines, below_first_bucket


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


def _hue(color: str) -> float:
    import colorsys

    return colorsys.rgb_to_hls(*(int(color[i:i + 2], 16) / 255 for i in (1, 3, 5)))[0]


def test_each_series_of_a_reason_panel_gets_its_own_colour_in_its_engines_hue() -> None:
    """Issue 27: the failure-ratio line of one engine was green; an engine's reasons are drawn in
    its colour and shades of it, each its own."""
    panel = PANELS["failure_ratio"]
    assert render._colors(panel, [_series("vllm timeout", [0.02])]) == {"vllm timeout": ENGINE_COLORS["vllm"]}
    names = [f"{e} {r}" for e in ENGINE_COLORS for r in ("empty_text", "timeout", "http_status")]
    colors, styles = render._looks(panel, [_series(n, [1.0]) for n in names])
    assert len(set(colors.values())) == len(names)
    for engine, color in ENGINE_COLORS.items():
        mine = [colors[n] for n in names if n.startswith(engine)]
        assert mine[0] == color and all(abs(_hue(c) - _hue(color)) < 0.02 for c in mine)
        assert len({styles[n] for n in names if n.startswith(engine)}) == 3  # a second cue beside the shade
    # series of no engine (GPUs) keep colours that are no engine's
    gpus = render._colors(PANELS["gpu_util"], [_series(f"host GPU {i}", [1.0]) for i in range(3)])
    assert len(set(gpus.values())) == 3 and not set(gpus.values()) & set(ENGINE_COLORS.values())


def test_flat_series_get_an_axis_that_shows_them_flat() -> None:
    assert render.flat_limits([0.0, 0.0, math.nan], from_zero=False) == (0.0, 1.0)
    assert render.flat_limits([2.0, 2.0], from_zero=False) == (0.0, 2.5)
    assert render.flat_limits([124.0, 124.7], from_zero=True) == (0.0, 124.7 * 1.08)
    assert render.flat_limits([-1.0, 3.0], from_zero=False) is None  # crosses zero: matplotlib's own axis


def test_noise_on_one_or_two_points_is_no_cliff() -> None:
    """Issue 27: 0.320 and 0.325 s on an auto-scaled axis filled the panel's height; an axis from 0
    shows a 1.5 % difference as the 1.5 % it is."""
    assert render.flat_limits([0.320, 0.325], from_zero=False) == (0.0, 0.325 * 1.08)
    assert render.flat_limits([1.0, 3.0], from_zero=False) == (0.0, 3.0 * 1.08)
    assert render.flat_limits([-0.5, -0.4], from_zero=False) == (-0.5 * 1.08, 0.0)
    for key, values in (("ttft_p95", [0.320, 0.325]), ("throughput", [40.0, 41.0]), ("in_flight", [4.0, 4.0, 3.0]),
                        ("engine_kv_cache", [0.121, 0.123])):
        fig = plt.figure()
        ax = fig.add_axes((0.1, 0.1, 0.6, 0.8))
        panel = PANELS[key]
        (scale, _), _, _ = render.panel_units(panel)
        render._timeseries(ax, panel, [_series(f"vllm {key}", values)], scale)
        low, top = ax.get_ylim()
        assert low == 0.0, key
        assert (max(values) - min(values)) * scale / (top - low) <= 0.3, key  # a share of the height, no cliff
        plt.close(fig)


def test_one_point_is_drawn_with_a_marker() -> None:
    fig = plt.figure()
    ax = fig.add_axes((0.1, 0.1, 0.6, 0.8))
    render._timeseries(ax, PANELS["tpot_p95"], [_series("vllm", [0.0251]), _series("sglang", [0.02] * 12)], 1.0)
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert lines["vllm"].get_marker() == "o"  # a line of one point draws nothing
    assert lines["sglang"].get_marker() in (None, "None", "")
    plt.close(fig)


def test_thresholds_are_labelled_and_never_stretch_the_axis() -> None:
    fig = plt.figure()
    ax = fig.add_axes((0.1, 0.1, 0.6, 0.8))
    render._timeseries(ax, PANELS["ttft_p95"], [_series("vllm", [0.320, 0.325])], 1.0, "s")
    assert ax.get_ylim()[1] < 1.0  # the SLO of 3 s does not squash the series to the bottom
    assert "threshold 3 s (above the axis)" in [ln.get_label() for ln in ax.get_lines()]
    plt.close(fig)


def test_the_stat_row_is_filled_not_a_band_of_blank() -> None:
    """Issue 27: two small lines at the top of each stat left a blank band under the stat row."""
    fig = plt.figure(figsize=(4, 2))
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    render._stat(ax, [_series("vllm", [1.0]), _series("sglang", [0.97])], 100.0, "%")
    texts = sorted(ax.texts, key=lambda t: -t.get_position()[1])
    assert [t.get_text() for t in texts] == ["vllm: 100 %", "sglang: 97 %"]
    ys = [t.get_position()[1] for t in texts]
    assert ys[0] >= 0.7 and ys[-1] <= 0.3 and min(t.get_fontsize() for t in texts) >= 14
    plt.close(fig)


def test_the_timing_error_has_an_axis_of_its_own_in_the_same_unit_and_no_bucket_bound_as_a_max() -> None:
    """Issue 27: the panel mixed an axis in s and one in ms, and drew histogram_quantile(1, ...), the
    bound (50 ms) of the bucket that held the max (29 ms in the records), as "max"."""
    panel = PANELS["proxy_timing_error"]
    (scale, unit), right_scale, title_unit = render.panel_units(panel)
    assert (scale, unit) == right_scale == (1000.0, "ms") and title_unit == "ms, both axes"
    fig = plt.figure()
    ax = fig.add_axes((0.1, 0.1, 0.6, 0.8))
    series = [_series("loop lag P99 p:1", [0.0004, 0.0006], "A"), _series("vllm timing error P95", [0.021, 0.024], "B"),
              _series("vllm timing error max", [0.05, 0.05], "C"), _series("vllm proxy TTFT P95", [0.320, 0.325], "D")]
    left, right = render._timeseries(ax, panel, series, scale, unit, right_scale)
    named = [ln for ln in left.get_lines() if not ln.get_label().startswith("_")]
    assert [(ln.get_label(), list(ln.get_ydata())) for ln in named] == [("vllm proxy TTFT P95", [320.0, 325.0])]
    drawn = {ln.get_label(): list(ln.get_ydata()) for ln in right.get_lines() if not ln.get_label().startswith("_")}
    assert drawn["loop lag P99 p:1"] == [0.4, 0.6] and drawn["vllm timing error P95"] == [21.0, 24.0]  # in ms
    assert right.get_ylabel() == "timing error (ms)" and right.get_ylim()[0] == 0
    assert any(ln.get_ydata()[0] == 1.0 for ln in right.get_lines())  # the 1 ms threshold, on the ms axis
    # the bucket bound: never called a max, never setting the axis
    assert not any(label.endswith("max") for label in drawn)
    bound = next(label for label in drawn if label.startswith("vllm timing error max"))
    assert "≤ 50 ms" in bound and "bucket's bound, not a" in bound and "above the axis" in bound
    assert right.get_ylim()[1] == pytest.approx(24.0 * 1.08)  # from the P95 and the loop lag, not the bound's 50
    assert render.is_bucket_bound(panel.queries[2].expr) and not render.is_bucket_bound(panel.queries[1].expr)
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


def _cells(a: float, b: float, small: float, large: float) -> list[dict]:
    return [{"scenario": name, "value_a": v * a, "value_b": v * b, "spread_a": [v * a * 0.98, v * a * 1.02],
             "spread_b": [v * b * 0.98, v * b * 1.02], "verdict": "worse"}
            for name, v in (("short-c4", small), ("long-c4", large))]


def test_compare_two_runs_of_one_engine_in_two_colours() -> None:
    """Issue 27: both runs were drawn in vLLM's orange."""
    from exporter.evidence.compare_plot import metric_figure, run_colors
    from exporter.evidence.noise import METRICS

    a, b = ("before", ("vllm",)), ("after", ("vllm",))
    ca, cb, hatched = run_colors(a, b)
    assert ca == ENGINE_COLORS["vllm"] and cb != ca and hatched
    two = run_colors(("sglang", ("sglang",)), ("vllm", ("vllm",)))
    assert two == (ENGINE_COLORS["sglang"], ENGINE_COLORS["vllm"], False)
    fig = metric_figure(_cells(1.0, 1.1, 0.040, 11.0), METRICS[4], a, b)
    for ax in fig.axes:
        bars = ax.patches
        assert len(bars) == 2 and bars[0].get_facecolor() != bars[1].get_facecolor()
    plt.close(fig)


def test_compare_every_cell_shows_in_the_tables_units() -> None:
    """Issue 27: one linear axis for cells of 40 ms and 11 s made the small one vanish, and the PNGs
    were in seconds where compare.md is in ms (and % for ratios)."""
    from exporter.evidence.compare_plot import metric_figure
    from exporter.evidence.noise import METRICS, human

    ttft = next(m for m in METRICS if m.key == "ttft_p95_s")
    rows = _cells(1.0, 1.1, 0.040, 11.0)
    fig = metric_figure(rows, ttft, ("sglang", ("sglang",)), ("vllm", ("vllm",)))
    assert len(fig.axes) == 2
    for ax, row in zip(fig.axes, rows):
        heights = [p.get_height() for p in ax.patches]
        assert heights == pytest.approx([row["value_a"] * 1000, row["value_b"] * 1000])  # ms, as compare.md
        low, top = ax.get_ylim()
        assert low == 0 and max(heights) / top >= 0.75  # the cell fills its own axis from 0
        printed = [t.get_text() for t in ax.texts]
        assert printed == [f"{human('ttft_p95_s', row['value_a'])} ms", f"{human('ttft_p95_s', row['value_b'])} ms"]
    assert fig.axes[0].get_ylabel() == "ms" and "TTFT P95 (ms;" in fig.get_suptitle()
    plt.close(fig)
    ratio = next(m for m in METRICS if m.key == "success_ratio")
    fig = metric_figure([{**rows[0], "value_a": 1.0, "value_b": 0.875, "spread_a": None, "spread_b": None}], ratio,
                        ("a", ("vllm",)), ("b", ("vllm",)))
    assert [p.get_height() for p in fig.axes[0].patches] == pytest.approx([100.0, 87.5])
    assert fig.axes[0].get_ylabel() == "%" and [t.get_text() for t in fig.axes[0].texts] == ["100.0%", "87.5%"]
    plt.close(fig)


def test_a_two_axis_title_names_only_the_units_it_has() -> None:
    """Counts on both axes (decode stalls per second beside requests) have no unit to name: the
    title says none, not "( left,  right)"."""
    from exporter.evidence.render import panel_title

    assert panel_title(PANELS["decode_stalls"]) == PANELS["decode_stalls"].title
    assert panel_title(PANELS["proxy_timing_error"]).endswith("(ms, both axes)")
