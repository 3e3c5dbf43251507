"""The boards' exact counts, through promtool's PromQL engine: right across counter resets
(an exporter restart, with and without a stale gap), summed over several proxies.

The expressions under test are the catalogue's own (``exact_count`` and the panels built on
it); the expected values come from a plain reference computation over the same samples.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from dashboards.catalogue import MIXIN, PANELS, exact_count, expand

from tests.helpers import require_prometheus

STEP_S = 5
RANGE_S = 300


def _values(samples: list[float | None | str]) -> str:
    """promtool's notation: ``_`` no sample, ``stale`` a staleness marker (a failed scrape)."""
    return " ".join("_" if v is None else str(v) for v in samples)


def _reference(samples: list[float | None | str]) -> float:
    """Events counted between consecutive samples: the increase, or after a reset the new value;
    the first sample is the baseline."""
    seen = [float(v) for v in samples if isinstance(v, (int, float))]
    return sum(b - a if b >= a else b for a, b in zip(seen, seen[1:]))


def _naive(samples: list[float | None | str]) -> float:
    seen = [float(v) for v in samples if isinstance(v, (int, float))]
    return max(seen) - min(seen)


N = RANGE_S // STEP_S + 1
# proxy a restarts after a stale gap (two failed scrapes); proxy b restarts between two scrapes;
# proxy c restarts twice; d is flat; every series ends with the counter below its peak.
SERIES: dict[str, list[float | None | str]] = {
    "a": [0, 0, 4, 9, 9, 15, 15, "stale", "stale", 0, 0, 3, 7, 7] + [7] * (N - 14),
    "b": [0, 2, 6, 6, 1, 1, 5] + [5] * (N - 7),
    "c": [10, 12, 2, 4, 4, 0, 6, 6] + [6] * (N - 8),
    "d": [3] * N,
}


def _promtool_case(expr: str, series: dict[str, list[float | None | str]], engine: str = "vllm") -> dict:
    return {
        "interval": f"{STEP_S}s",
        "input_series": [
            {"series": f'llmbench_empty_text_responses_total{{{MIXIN.job_selector},instance="{inst}:9464",'
                       f'{MIXIN.engine_label}="{engine}",scenario="short-c8"}}', "values": _values(vals)}
            for inst, vals in series.items()
        ],
        "promql_expr_test": [],
        "_expr": expr,
    }


def _run(tmp_path: Path, cases: list[tuple[str, dict, list[dict]]]) -> subprocess.CompletedProcess[str]:
    tests = []
    for expr, case, expected in cases:
        case = {k: v for k, v in case.items() if k != "_expr"}
        case["promql_expr_test"] = [{"expr": expr, "eval_time": f"{RANGE_S}s", "exp_samples": expected}]
        tests.append(case)
    path = tmp_path / "counts.test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": f"{STEP_S}s", "tests": tests}))
    return subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=60)


def test_reference_sees_the_resets() -> None:
    # the data is built so that max - min (the boards' old count) is wrong for every restarted proxy
    assert {k: _reference(v) for k, v in SERIES.items()} == {"a": 22, "b": 11, "c": 12, "d": 0}
    assert {k: _naive(v) for k, v in SERIES.items()} == {"a": 15, "b": 6, "c": 12, "d": 0}
    assert _reference(SERIES["c"]) == _naive(SERIES["c"])  # by chance; a and b tell them apart


def test_exact_count_per_series_across_restarts(tmp_path: Path) -> None:
    require_prometheus()
    sel = f"llmbench_empty_text_responses_total{{{MIXIN.job_selector}}}"
    expr = expand(exact_count(sel), range_s=RANGE_S)
    expected = [{"labels": f'{{{MIXIN.job_selector},instance="{inst}:9464",{MIXIN.engine_label}="vllm",'
                           f'scenario="short-c8"}}', "value": _reference(vals)} for inst, vals in SERIES.items()]
    r = _run(tmp_path, [(expr, _promtool_case(expr, SERIES), expected)])
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


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
