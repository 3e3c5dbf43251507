"""Every board query, annotation, rule and variable selects through the mixin and aggregates
across proxy instances (issue 10 item 1: several proxies, one view)."""

from __future__ import annotations

import re

import yaml

from dashboards.boards import build_all
from dashboards.catalogue import BOARDS, MIXIN, PANELS, ROUND_ANNOTATIONS, expand
from dashboards.rules import RULES_FILE

_AGG = r"(sum|max|min|count)( by \(\))? ?\(\)"
_NUMBER = r"\d+(\.\d+)?"
_OP = r" (/|>|<|\*|-|\+|or|and|unless)( ignoring \(\) group_left| on \(\))? "
_AGGREGATED = re.compile(rf"^({_AGG}|{_NUMBER})({_OP}({_AGG}|{_NUMBER}))*$")
#: the one query that shows each proxy on its own, deliberately: loop lag is per process
PER_INSTANCE = {("proxy_timing_error", "A")}


def _skeleton(expr: str) -> str:
    """``expr`` with everything inside brackets removed: what is left is its top level."""
    out, depth = [], 0
    for ch in expr:
        if ch in "([{":
            if depth == 0:
                out.append(ch)
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                out.append(ch)
        elif depth == 0:
            out.append(ch)
    return "".join(out).replace("[]", "").replace("{}", "")


def _top_level(expr: str) -> str:
    expr = expand(expr, range_s=60).strip()
    if expr.startswith("histogram_quantile("):
        expr = expr[len("histogram_quantile("):-1].split(", ", 1)[1]
    return _skeleton(expr)


def _queries() -> list[tuple[str, str, str]]:
    return [(key, q.ref, q.expr) for key, p in PANELS.items() for q in p.queries]


def test_skeleton_tells_aggregated_from_raw() -> None:
    assert _AGGREGATED.match(_top_level('sum by (engine) (rate(x{a="b"}[1m])) / sum by (engine) (y)'))
    assert _AGGREGATED.match(_top_level('histogram_quantile(0.95, sum by (engine, le) (rate(x_bucket[1m])))'))
    assert not _AGGREGATED.match(_top_level('rate(x{a="b"}[1m])'))
    assert not _AGGREGATED.match(_top_level('sum by (engine) (x) / y{engine="a"}'))
    assert not _AGGREGATED.match(_top_level('histogram_quantile(0.95, rate(x_bucket[1m]))'))
    assert _AGGREGATED.match(_top_level('histogram_quantile(0.95, sum by (engine, le) (rate(x_bucket[1m])) '
                                        'and on (engine) sum by (engine) (rate(x_count[1m])) > 0)'))


def test_every_query_aggregates_across_instances() -> None:
    for key, ref, expr in _queries():
        assert _AGGREGATED.match(_top_level(expr)), (key, ref, expr)
        groupings = re.findall(r"\bby \(([^)]*)\)", expr)  # none: sum(...), one series in all
        keeps_instance = any(MIXIN.instance_label in [g.strip() for g in by.split(",")] for by in groupings)
        assert keeps_instance == ((key, ref) in PER_INSTANCE), (key, ref, expr)
    for a in ROUND_ANNOTATIONS:
        assert _AGGREGATED.match(_top_level(a.expr)), a.name
        assert f"by ({MIXIN.engine_label}, scenario, round)" in a.expr


def test_proxy_series_are_selected_by_the_mixin_job() -> None:
    exprs = [e for _, _, e in _queries()] + [a.expr for a in ROUND_ANNOTATIONS]
    rules = [r["expr"] for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"]]
    variables = [v["query"] for b in build_all().values() for v in b["templating"]["list"] if v["type"] == "query"]
    selectors = [(m.group(1), m.group(2)) for e in exprs + rules + variables
                 for m in re.finditer(r"\b(llmbench_\w+|up)\{([^}]*)\}", e)]
    assert len(selectors) > 30
    engine_servers = f'job=~"{MIXIN.vllm_job}|{MIXIN.sglang_job}"'  # the engine-instance menu
    for name, matchers in selectors:
        assert matchers.startswith(MIXIN.job_selector) or (name, matchers) == ("up", engine_servers), (name, matchers)
    bare = [e for e in exprs + rules if re.search(r"\bllmbench_\w+(\[|\)|\s|$)", e)]
    assert not bare, bare  # no proxy metric without a selector


def test_engine_series_are_selected_by_their_jobs() -> None:
    for key, ref, expr in _queries():
        for m in re.finditer(r"\b(vllm|sglang):\w+\{([^}]*)\}", expr):
            job = MIXIN.vllm_job if m.group(1) == "vllm" else MIXIN.sglang_job
            assert m.group(2).startswith(f'job="{job}"'), (key, ref, m.group(0))
        assert not re.search(r"\b(vllm|sglang):\w+(\[|\)|\s)", expr), (key, ref)
        # SGLang's names by regex, both spellings (sglang:NAME, sglang_NAME), always with its job
        for m in re.finditer(r"\{([^}]*)__name__=~\"([^\"]*)\"", expr):
            assert m.group(2).startswith("sglang[:_]") and f'job="{MIXIN.sglang_job}"' in m.group(1), (key, ref)
        assert not re.search(r"\bsglang:\w+", expr), (key, ref)  # never one spelling alone


def test_engine_grouping_comes_from_the_mixin() -> None:
    for board in BOARDS.values():
        for p in board.panels:
            for q in p.queries:
                if "llmbench_" in q.expr and "by (" in q.expr and p.key != "proxy_timing_error":
                    assert MIXIN.by_engine[:-1] in q.expr, (p.key, q.ref)
                    assert MIXIN.engine_legend in q.legend, (p.key, q.ref)
