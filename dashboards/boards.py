"""Grafana dashboards built with grafanalib from the panel catalogue.

grafanalib 0.7.1 is stale, so its output is finished here as plain dicts: a modern
``schemaVersion``, ``maxDataPoints`` well above its default of 100, thresholds and colour
overrides, datasource references to the ``$datasource`` variable, Prometheus annotations.
The generated JSON is committed under ``dashboards/generated/`` and a test keeps it fresh.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import grafanalib.core as g
from grafanalib._gen import DashboardEncoder

from .catalogue import BOARDS, DATASOURCE_UID, ENGINE_COLORS, LINE_STYLES, MIXIN, Board, Panel
from .promql import retarget

__all__ = ["SCHEMA_VERSION", "MAX_DATA_POINTS", "build", "build_all", "write_all", "layout", "row_positions",
           "GENERATED", "ROW_HEIGHT", "drop_nulls"]

SCHEMA_VERSION = 39
MAX_DATA_POINTS = 1500
GENERATED = Path(__file__).resolve().parent / "generated"
DS = {"type": "prometheus", "uid": "${datasource}"}
ROW_HEIGHT = 1
#: Grafana dash patterns of the legend words' line styles (catalogue.LINE_STYLES)
_DASH = {"dash": [10, 10], "dot": [0, 10], "dashdot": [10, 5, 2, 5]}

_PROXY = MIXIN.proxy()
_VARIABLES: dict[str, dict[str, Any]] = {
    "engine": {"query": f"label_values(llmbench_requests_in_flight{_PROXY}, {MIXIN.engine_label})", "label": "Engine"},
    "scenario": {"query": f"label_values(llmbench_requests_total{_PROXY}, scenario)", "label": "Scenario"},
    "instance": {"query": f"label_values(up{_PROXY}, {MIXIN.instance_label})", "label": "Proxy instance"},
    "engine_instance": {"query": f'label_values(up{{job=~"{MIXIN.vllm_job}|{MIXIN.sglang_job}"}}, {MIXIN.instance_label})',
                        "label": "Engine instance"},
    "host": {"query": "query_result(count by (Hostname, hostname) (DCGM_FI_DEV_GPU_UTIL))",
             "regex": '/[Hh]ostname="([^"]+)"/', "label": "Host"},
    "gpu": {"query": "label_values(DCGM_FI_DEV_GPU_UTIL, gpu)", "label": "GPU"},
}


def _variable(name: str) -> g.Template:
    if name == "datasource":
        return g.Template(name="datasource", query="prometheus", type="datasource", label="Data source",
                          default=DATASOURCE_UID, hide=0)
    v = _VARIABLES[name]
    return g.Template(name=name, query=v["query"], dataSource=DS, label=v["label"], includeAll=True,
                      multi=True, allValue=".*", default="$__all", regex=v.get("regex", ""), refresh=2, sort=1)


def _color_overrides(panel: Panel) -> list[dict[str, Any]]:
    """Each engine's series in its colour; on a panel of several series per engine (its failure
    reasons) in shades of it, as the PNG boards draw them."""
    mode = "fixed" if panel.per_engine_colors else \
        "shades" if all(q.legend.startswith(MIXIN.engine_legend) for q in panel.queries) else None
    out = [] if mode is None else [
        {"matcher": {"id": "byRegexp", "options": f"^{engine}.*"},
         "properties": [{"id": "color", "value": {"mode": mode, "fixedColor": color}}]}
        for engine, color in ENGINE_COLORS.items()
    ]
    legends = " ".join(q.legend for q in panel.queries)
    for word, style in LINE_STYLES.items():
        if panel.per_engine_colors and word in legends:
            fill = "dot" if style == "dot" else "dash"
            out.append({"matcher": {"id": "byRegexp", "options": f".*{word}.*"},
                        "properties": [{"id": "custom.lineStyle", "value": {"fill": fill, "dash": _DASH[style]}}]})
    return out + _right_axis(panel)


def _stacking(panel: Panel, custom: dict[str, Any]) -> list[dict[str, Any]]:
    """A stacked panel: each engine's series stacked in a group of its own (in query order), filled."""
    if not panel.stack:
        return []
    custom["stacking"] = {"mode": "normal", "group": "A"}
    custom["fillOpacity"] = 35
    return [{"matcher": {"id": "byRegexp", "options": f"^{engine}.*"},
             "properties": [{"id": "custom.stacking", "value": {"mode": "normal", "group": engine}}]}
            for engine in ENGINE_COLORS]


def _legend_regex(legend: str) -> str:
    """A regex for the display names a legend format gives (``{{label}}`` matches anything)."""
    parts = re.split(r"\{\{\s*\w+\s*\}\}", legend)
    return "^" + ".*".join(re.escape(p) for p in parts) + "$"


def _right_axis(panel: Panel) -> list[dict[str, Any]]:
    """The queries marked ``right`` on an axis of their own: its label, placement and soft minimum 0
    (the axis label is part of Grafana's scale key, so they never share the left axis).  Their values
    stay in seconds: Grafana's ``s`` unit prints them as ms (the PNG boards scale them to the unit)."""
    if panel.right_unit is None:
        return []
    label = panel.right_unit[1]
    return [{"matcher": {"id": "byRegexp", "options": _legend_regex(q.legend)},
             "properties": [{"id": "custom.axisPlacement", "value": "right"},
                            {"id": "custom.axisLabel", "value": label},
                            {"id": "custom.axisSoftMin", "value": 0},
                            {"id": "unit", "value": "s"}]}
            for q in panel.queries if q.right]


def _thresholds(panel: Panel) -> dict[str, Any]:
    """Red above each threshold, or, for a ratio that must stay high, red below it."""
    base, over = ("red", "green") if panel.low_is_bad else ("green", "red")
    steps: list[dict[str, Any]] = [{"color": base if panel.thresholds else "green", "value": None}]
    steps += [{"color": over, "value": v} for v in panel.thresholds]
    return {"mode": "absolute", "steps": steps}


def _grafanalib_panel(panel: Panel, pos: g.GridPos) -> g.Panel:
    targets = [g.Target(expr=q.expr, legendFormat=q.legend, refId=q.ref, datasource=DS) for q in panel.queries]
    common: dict[str, Any] = dict(title=panel.title, description=panel.description, dataSource=DS,
                                  targets=targets, gridPos=pos, maxDataPoints=MAX_DATA_POINTS)
    if panel.kind == "stat":
        return g.Stat(format=panel.unit, reduceCalc="lastNotNull", graphMode="none", textMode="value_and_name",
                      colorMode="value", **common)
    return g.TimeSeries(unit=panel.unit, lineWidth=2, fillOpacity=5, showPoints="never", spanNulls=False,
                        legendDisplayMode="table", legendPlacement="bottom", legendCalcs=["lastNotNull", "max"],
                        tooltipMode="multi", **common)


def _row_starts(board: Board) -> dict[str, str]:
    return {r.first: r.title for r in board.rows}


def layout(board: Board) -> list[g.GridPos]:
    """Row-major grid of 24 columns: stat panels in a row above the 2-column time series; a
    board's row heading (:class:`~dashboards.promql.Row`) starts a new grid row of its own."""
    out, x, y, row_h = [], 0, 0, 0
    starts = _row_starts(board)
    for p in board.panels:
        if p.key in starts:
            x, y, row_h = 0, y + row_h + ROW_HEIGHT, 0
        elif x + p.width > 24:
            x, y, row_h = 0, y + row_h, 0
        out.append(g.GridPos(h=p.height, w=p.width, x=x, y=y))
        x += p.width
        row_h = max(row_h, p.height)
    return out


def row_positions(board: Board) -> list[tuple[str, int]]:
    """(title, grid y) of each row heading: just above its first panel."""
    starts = _row_starts(board)
    return [(starts[p.key], pos.y - ROW_HEIGHT) for p, pos in zip(board.panels, layout(board)) if p.key in starts]


def _annotations(board: Board) -> dict[str, Any]:
    """Grafana's built-in annotations, then the board's Prometheus ones: each series' value is
    an event's unix time (``useValueForTime``), so a round shorter than a step still shows; an
    engine's downs and ups are the samples' own times (the regions where it was down)."""
    items: list[dict[str, Any]] = [{
        "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard",
    }]
    items += [{
        "datasource": DS, "enable": True, "hide": False, "iconColor": a.color, "name": a.name, "expr": a.expr,
        "step": "5s", "titleFormat": a.title, "textFormat": a.text,
        "tagKeys": a.tags if a.tags is not None else f"{MIXIN.engine_label},scenario,round",
        "useValueForTime": a.value_is_time,
    } for a in board.annotations]
    return {"list": items}


def build(board: Board) -> dict[str, Any]:
    """One board as Grafana JSON (a dict)."""
    positions = layout(board)
    dash = g.Dashboard(
        title=board.title, uid=board.uid, tags=list(board.tags), timezone="utc", refresh="10s",
        time=g.Time("now-30m", "now"), schemaVersion=SCHEMA_VERSION, editable=True,
        templating=g.Templating([_variable(v) for v in board.variables]),
        panels=[_grafanalib_panel(p, pos) for p, pos in zip(board.panels, positions)],
    ).auto_panel_ids()
    data: dict[str, Any] = json.loads(json.dumps(dash.to_json_data(), cls=DashboardEncoder))
    data.pop("rows", None)
    data["schemaVersion"] = SCHEMA_VERSION
    data["annotations"] = _annotations(board)
    data["graphTooltip"] = 1  # shared crosshair
    for panel, out in zip(board.panels, data["panels"]):
        out["maxDataPoints"] = MAX_DATA_POINTS
        defaults = out["fieldConfig"]["defaults"]
        defaults["thresholds"] = _thresholds(panel)
        defaults["unit"] = panel.unit
        if panel.thresholds and panel.kind == "timeseries":
            defaults["custom"]["thresholdsStyle"] = {"mode": "dashed"}
        if panel.log_scale:
            defaults["custom"]["scaleDistribution"] = {"type": "log", "log": 10}
        if panel.from_zero:
            defaults["min"] = 0
        out["fieldConfig"]["overrides"] = _color_overrides(panel) + _stacking(panel, defaults["custom"])
        out["pluginVersion"] = "10.4.0"
        for key in ("height", "span", "minSpan", "error", "repeat", "repeatDirection", "maxPerRow"):
            out.pop(key, None)
        for target in out["targets"]:
            for key in ("step", "query", "metric", "target"):
                target.pop(key, None)
            target["intervalFactor"] = 1
            target["range"] = True
    for var in data["templating"]["list"]:
        var["regex"] = var.get("regex") or ""
        var["skipUrlSync"] = False
        if var["type"] == "datasource":
            var["current"] = {"selected": True, "text": "Prometheus", "value": DATASOURCE_UID}
        else:
            var["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
    _insert_rows(board, data)
    return drop_nulls(data)


def drop_nulls(value: Any, step: bool = False) -> Any:
    """``value`` without the keys whose value is null: grafanalib writes ``"datasource": null``,
    ``"color": null`` and the like where Grafana's dashboard schema wants an object or nothing, and
    Grafana's own models (its Foundation SDK) refuse them.  A threshold step keeps its
    ``"value": null``: that one is the schema's (the base step, from minus infinity)."""
    if isinstance(value, dict):
        return {k: drop_nulls(v, k == "steps") for k, v in value.items() if v is not None or (step and k == "value")}
    if isinstance(value, list):
        return [drop_nulls(v, step) for v in value]
    return value


def _insert_rows(board: Board, data: dict[str, Any]) -> None:
    """Grafana row panels (the board's headings) before their first panels; ids after the panels'."""
    next_id = max((p["id"] for p in data["panels"]), default=0) + 1
    for title, y in row_positions(board):
        at = next(i for i, p in enumerate(data["panels"]) if p["gridPos"]["y"] > y)
        data["panels"].insert(at, {"type": "row", "title": title, "id": next_id, "collapsed": False, "panels": [],
                                   "gridPos": {"h": ROW_HEIGHT, "w": 24, "x": 0, "y": y}})
        next_id += 1


def build_all(job: str | None = None) -> dict[str, dict[str, Any]]:
    """Every board as Grafana JSON; ``job``: the proxies' Prometheus job (default: the mixin's)."""
    return {name: retarget(build(board), job) for name, board in BOARDS.items()}


def render_json(board: dict[str, Any]) -> str:
    return json.dumps(board, indent=2, sort_keys=True) + "\n"


def write_all(out_dir: Path = GENERATED, job: str | None = None) -> list[Path]:
    """Write ``<name>.json`` per board; returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data in build_all(job).items():
        path = out_dir / f"{name}.json"
        path.write_text(render_json(data), encoding="utf-8")
        paths.append(path)
    return paths
