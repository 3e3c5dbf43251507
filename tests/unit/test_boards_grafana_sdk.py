"""The generated boards against Grafana's own dashboard models (issue 27 item 5).

Grafana does not run here, but its Foundation SDK does: its models are generated from Grafana's
dashboard schema.  grafanalib wrote explicit nulls where the schema wants an object or nothing
(``"datasource": null`` in template variables, ``"color": null`` in field defaults), and every
board failed ``Dashboard.from_json``.  Each committed board is parsed here, with the SDK's panel
and Prometheus query models registered, and what it parses back keeps every panel, query and
override.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import prometheus
from grafana_foundation_sdk.models.dashboard import Dashboard, RowPanel

from dashboards import boards
from dashboards.boards import GENERATED, build_all
from dashboards.catalogue import BOARDS

register_default_plugins()  # panels' options and custom field configs, and Prometheus queries, in their own models

BOARD_FILES = sorted(GENERATED.glob("*.json"))


def _parse(path: Path) -> tuple[dict[str, Any], Dashboard, dict[str, Any]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    dash = Dashboard.from_json(data)
    return data, dash, json.loads(json.dumps(dash, cls=JSONEncoder))


def _panels(board: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(p["type"], p["id"], p["title"], p["gridPos"]) for p in board["panels"]]


def _queries(board: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(p["id"], t["refId"], t["expr"], t["legendFormat"], t["datasource"])
            for p in board["panels"] for t in p.get("targets", [])]


def _overrides(board: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(p["id"], json.dumps(p["fieldConfig"]["overrides"], sort_keys=True))
            for p in board["panels"] if "fieldConfig" in p]


def _nulls(value: Any, where: str = "") -> list[str]:
    if isinstance(value, dict):
        return [f"{where}.{k}" for k, v in value.items() if v is None] + \
            [n for k, v in value.items() for n in _nulls(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [n for v in value for n in _nulls(v, f"{where}[]")]
    return []


def test_every_board_is_there() -> None:
    assert sorted(p.stem for p in BOARD_FILES) == sorted(BOARDS)


@pytest.mark.parametrize("path", BOARD_FILES, ids=lambda p: p.stem)
def test_grafanas_models_parse_the_board_and_keep_every_panel_query_and_override(path: Path) -> None:
    data, dash, back = _parse(path)
    assert _panels(back) == _panels(data) and len(data["panels"]) == len(BOARDS[path.stem].panels) + len(
        BOARDS[path.stem].rows)
    assert _queries(back) == _queries(data) and _queries(data)
    assert _overrides(back) == _overrides(data)
    assert any(overrides != "[]" for _, overrides in _overrides(data)) or path.stem == "gpu"
    # the queries went through Grafana's Prometheus query model, not its bag for unknown ones
    targets = [t for p in dash.panels or [] if not isinstance(p, RowPanel) for t in p.targets or []]
    assert targets and all(isinstance(t, prometheus.Dataquery) for t in targets)
    # each panel's unit, thresholds and floor; the variables' queries; the annotations' queries
    for mine, theirs in zip(data["panels"], back["panels"]):
        if "fieldConfig" in mine:
            for key in ("unit", "thresholds", "min"):
                assert theirs["fieldConfig"]["defaults"].get(key) == mine["fieldConfig"]["defaults"].get(key)
    assert [(v["name"], v.get("query")) for v in back["templating"]["list"]] == \
        [(v["name"], v.get("query")) for v in data["templating"]["list"]]
    assert [(a["name"], a.get("expr")) for a in back["annotations"]["list"]] == \
        [(a["name"], a.get("expr")) for a in data["annotations"]["list"]]


@pytest.mark.parametrize("path", BOARD_FILES, ids=lambda p: p.stem)
def test_no_null_but_the_base_threshold_step(path: Path) -> None:
    """The one null the schema has: a threshold step's value, the base step from minus infinity."""
    nulls = _nulls(json.loads(path.read_text(encoding="utf-8")))
    assert nulls and set(nulls) == {".panels[].fieldConfig.defaults.thresholds.steps[].value"}


def test_drop_nulls() -> None:
    assert boards.drop_nulls({"a": None, "b": [{"c": None, "d": 1}], "steps": [{"value": None, "color": "green"}],
                       "e": {"steps": [{"value": None, "x": None}]}}) == \
        {"b": [{"d": 1}], "steps": [{"value": None, "color": "green"}], "e": {"steps": [{"value": None}]}}
    assert all(not _nulls(b, "") or set(_nulls(b, "")) == {".panels[].fieldConfig.defaults.thresholds.steps[].value"}
               for b in build_all().values())


def test_an_engines_failure_reasons_in_shades_of_its_colour() -> None:
    """Issue 27: the failure-ratio line was green, the first colour of Grafana's palette, not the
    engine's; its reasons are drawn in shades of the engine's colour (Grafana's ``shades`` mode)."""
    from dashboards.catalogue import ENGINE_COLORS

    board = build_all()["comparison"]
    panel = next(p for p in board["panels"] if p["title"] == "Failure ratio by reason")
    colors = {o["matcher"]["options"]: o["properties"][0]["value"] for o in panel["fieldConfig"]["overrides"]
              if o["properties"][0]["id"] == "color"}
    assert colors == {f"^{e}.*": {"mode": "shades", "fixedColor": c} for e, c in ENGINE_COLORS.items()}
