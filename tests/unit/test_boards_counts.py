"""The exact counts, through promtool's PromQL engine: the boards' right across counter resets
(an exporter restart, with and without a stale gap), summed over several proxies; evidence
summarize's histogram P95 from exact bucket counts across a restart; and evidence export's
exact counts of a window shorter than a scrape interval.

The expressions under test are the catalogue's own (``exact_count`` and the panels built on
it); the expected values come from a plain reference computation over the same samples.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from dashboards.catalogue import MIXIN, PANELS, exact_count, expand
from exporter.evidence.counts import covering, exact_counts
from exporter.evidence.summarize import histogram_p95_expr
from exporter.evidence.windows import Window

from tests.helpers import require_prometheus

STEP_S = 5
RANGE_S = 300


def _values(samples: list[float | None | str]) -> str:
    """promtool's notation: ``_`` no sample, ``stale`` a staleness marker (a failed scrape)."""
    return " ".join("_" if v is None else str(v) for v in samples)


def _reference(samples: list[float | None | str]) -> float:
    """Events counted between consecutive samples: the increase, or after a reset the new value;
    a series first seen inside the range started at zero there (its first value counts whole)."""
    seen = [float(v) for v in samples if isinstance(v, (int, float))]
    return sum(b - a if b >= a else b for a, b in zip([0.0, *seen], seen))


def _naive(samples: list[float | None | str]) -> float:
    seen = [float(v) for v in samples if isinstance(v, (int, float))]
    return max(seen) - min(seen)


N = RANGE_S // STEP_S + 1
# Each series is first seen two steps into the range (not on its first step, where Prometheus 2's
# closed and 3's left-open ranges differ).  Proxy a restarts after a stale gap (two failed scrapes);
# proxy b restarts between two scrapes; proxy c, first seen at 10, restarts twice; d is first seen at
# 3 and flat; every series ends with the counter below its peak.
_LATE = [None, None]
SERIES: dict[str, list[float | None | str]] = {
    "a": _LATE + [0, 0, 4, 9, 9, 15, 15, "stale", "stale", 0, 0, 3, 7, 7] + [7] * (N - 16),
    "b": _LATE + [0, 2, 6, 6, 1, 1, 5] + [5] * (N - 9),
    "c": _LATE + [10, 12, 2, 4, 4, 0, 6, 6] + [6] * (N - 10),
    "d": _LATE + [3] * (N - 2),
}


def _proxy_series(metric: str, instance: str, engine: str = "vllm", scenario: str = "short-c8", **extra: str) -> str:
    labels = "".join(f',{k}="{v}"' for k, v in extra.items())
    return (f'{metric}{{{MIXIN.job_selector},instance="{instance}:9464",{MIXIN.engine_label}="{engine}",'
            f'scenario="{scenario}"{labels}}}')


def _promtool_case(expr: str, series: dict[str, list[float | None | str]], engine: str = "vllm") -> dict:
    """The empty-text counter of one proxy per ``series`` key (its instance)."""
    return _case({_proxy_series("llmbench_empty_text_responses_total", inst, engine): vals
                  for inst, vals in series.items()}, expr)


def _case(series: dict[str, list[float | None | str]], expr: str) -> dict:
    return {"interval": f"{STEP_S}s", "_expr": expr,
            "input_series": [{"series": name, "values": _values(vals)} for name, vals in series.items()]}


def _run(tmp_path: Path, cases: list[tuple[str, dict, list[dict]]], eval_time: str = f"{RANGE_S}s"
         ) -> subprocess.CompletedProcess[str]:
    tests = []
    for expr, case, expected in cases:
        case = {k: v for k, v in case.items() if k != "_expr"}
        case["promql_expr_test"] = [{"expr": expr, "eval_time": eval_time, "exp_samples": expected}]
        tests.append(case)
    path = tmp_path / "counts.test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": f"{STEP_S}s", "tests": tests}))
    return subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=60)


def test_reference_sees_the_resets() -> None:
    # the data is built so that max - min (the boards' old count) is wrong for every restarted proxy
    assert {k: _reference(v) for k, v in SERIES.items()} == {"a": 22, "b": 11, "c": 22, "d": 3}
    assert {k: _naive(v) for k, v in SERIES.items()} == {"a": 15, "b": 6, "c": 12, "d": 0}


@pytest.mark.slow  # promtool: a process of its own
def test_exact_count_per_series_across_restarts(tmp_path: Path) -> None:
    require_prometheus()
    sel = f"llmbench_empty_text_responses_total{{{MIXIN.job_selector}}}"
    expr = expand(exact_count(sel), range_s=RANGE_S)
    expected = [{"labels": f'{{{MIXIN.job_selector},instance="{inst}:9464",{MIXIN.engine_label}="vllm",'
                           f'scenario="short-c8"}}', "value": _reference(vals)} for inst, vals in SERIES.items()]
    r = _run(tmp_path, [(expr, _promtool_case(expr, SERIES), expected)])
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


@pytest.mark.slow  # promtool: a process of its own
def test_board_panel_sums_the_proxies_exactly(tmp_path: Path) -> None:
    """The empty-text stat panel as Grafana sends it over a 300 s range: one number per engine,
    the sum over four proxies of their resets-aware counts."""
    require_prometheus()
    expr = expand(PANELS["empty_text"].queries[0].expr, range_s=RANGE_S)
    total = sum(_reference(v) for v in SERIES.values())
    expected = [{"labels": f'{{{MIXIN.engine_label}="vllm"}}', "value": total}]
    r = _run(tmp_path, [(expr, _promtool_case(expr, SERIES), expected)])
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    # and the check can fail: the old max - min count is refused
    wrong = [{"labels": f'{{{MIXIN.engine_label}="vllm"}}', "value": sum(_naive(v) for v in SERIES.values())}]
    r = _run(tmp_path, [(expr, _promtool_case(expr, SERIES), wrong)])
    assert r.returncode != 0


# -- evidence summarize's histogram check: the P95 from exact bucket counts ----------------------

# 10 fast requests (<= 0.1 s), the proxy restarts after a stale gap, then 10 slow ones (0.5-1 s)
_FAST = [0, 0, 0, 0, 10, 10, 10, 10, "stale", "stale", 0, 0, 0] + [0] * 8
_SLOW = [0, 0, 0, 0, 10, 10, 10, 10, "stale", "stale", 0, 0, 10] + [10] * 8
BUCKETS: dict[str, list[float | None | str]] = {"0.1": _FAST, "0.5": _FAST, "1": _SLOW, "+Inf": _SLOW}
# exact buckets 10, 10, 20, 20: rank 0.95 * 20 = 19 lies in (0.5, 1], 9 of its 10 requests in
P95_EXACT = 0.5 + (1 - 0.5) * (19 - 10) / (20 - 10)
# max - min sees 10 in every bucket: the P95 would fall in the first one (0.095)
P95_MAX_MINUS_MIN = 0.1 * 0.95


@pytest.mark.slow  # promtool: a process of its own
def test_summarize_histogram_p95_is_right_across_a_restart(tmp_path: Path) -> None:
    require_prometheus()
    metric = "llmbench_e2e_request_latency_seconds"
    series = {_proxy_series(f"{metric}_bucket", "p1", scenario="s", le=le): vals for le, vals in BUCKETS.items()}
    # the records' span: first request at 10 s, last one ended at 62 s; 5 s scrapes
    span = covering(10.0, 62.0, STEP_S)
    assert span.baseline <= 10.0 and span.at >= 62.0 + STEP_S and span.at % STEP_S == 0
    expr = histogram_p95_expr(metric, "vllm", "s", span.range_s)
    assert "exact_count" not in expr and "sum_over_time(" in expr  # the catalogue's expression, expanded
    expected = [{"labels": "{}", "value": P95_EXACT}]
    r = _run(tmp_path, [(expr, _case(series, expr), expected)], eval_time=f"{span.at:.0f}s")
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    # the old query of summarize, max - min of each bucket, answers 0.095 and fails this check
    sel = f'{metric}_bucket{{engine="vllm", scenario="s"}}[{span.range_s}s]'
    old = f"histogram_quantile(0.95, sum by (le) (max_over_time({sel}) - min_over_time({sel})))"
    r = _run(tmp_path, [(old, _case(series, old), expected)], eval_time=f"{span.at:.0f}s")
    assert r.returncode != 0 and f"got: {{}} {P95_MAX_MINUS_MIN:.1E}" in r.stdout + r.stderr


# -- evidence export: a window shorter than the scrape interval -----------------------------------

@pytest.mark.slow  # promtool: a process of its own
def test_a_short_window_counts_from_the_scrapes_around_it(tmp_path: Path) -> None:
    """A 2 s window between two 5 s scrapes: counted inside, the panel has no series; widened to
    the scrape before its start and a scrape after its end, it counts the 4 requests."""
    require_prometheus()
    #         ... 145  150  155  160  165  (s)
    values = [0] * 20 + [3] * 10 + [10, 14, 14, 20] + [20] * 10
    series = {_proxy_series("llmbench_empty_text_responses_total", "p1"): values}
    expr = PANELS["empty_text"].queries[0].expr
    start, end = 151.0, 153.0
    inside = expand(expr, range_s=end - start)
    r = _run(tmp_path, [(inside, _case(series, inside), [])], eval_time=f"{end:.0f}s")
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr  # no series at all
    span = exact_counts(Window(start, end, "test"), STEP_S, now=end + 60).span
    assert span is not None and (span.at, span.range_s) == (160.0, 9)
    widened = expand(expr, range_s=span.range_s)
    expected = [{"labels": f'{{{MIXIN.engine_label}="vllm"}}', "value": 14 - 10}]
    r = _run(tmp_path, [(widened, _case(series, widened), expected)], eval_time=f"{span.at:.0f}s")
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    # a window of two scrape intervals is counted inside it
    assert exact_counts(Window(start, start + 2 * STEP_S, "test"), STEP_S).span is None


# -- a series first seen inside the window (issue 19 items 4 and 10) -------------------------------

def _goodput_series(met: list[float | None | str], ok: list[float | None | str]) -> dict[str, list[float | None | str]]:
    return {_proxy_series("llmbench_slo_requests_total", "p1", result="met"): met,
            _proxy_series("llmbench_requests_total", "p1", outcome="success", reason="none"): ok}


@pytest.mark.slow  # promtool: a process of its own
def test_goodput_counts_requests_that_finished_before_prometheus_started(tmp_path: Path) -> None:
    """Prometheus starts 20 s before the end of a 120 s window, after the proxy has finished 8
    requests (4 met the SLO); 3 more finish, 2 of them met: 6 of 11.  The first sample is where
    each counter is first seen, so it counts whole; the old count took it as the baseline and
    said 2 of 3.  With a single scrape inside the window it said nothing at all (no series)."""
    require_prometheus()
    expr = PANELS["goodput_ratio"].queries[0].expr
    window = 120
    lead = [None] * ((RANGE_S - 20) // STEP_S)
    cases = {"several scrapes": (_goodput_series(lead + [4, 4, 4, 6, 6], lead + [8, 8, 8, 11, 11]), 6 / 11),
             "one scrape": (_goodput_series(lead[:-3] + [4], lead[:-3] + [8]), 4 / 8)}
    for name, (series, ratio) in cases.items():
        got = expand(expr, range_s=window)
        expected = [{"labels": f'{{{MIXIN.engine_label}="vllm"}}', "value": ratio}]
        r = _run(tmp_path, [(got, _case(series, got), expected)])
        assert r.returncode == 0 and "SUCCESS" in r.stdout, (name, r.stdout + r.stderr)
