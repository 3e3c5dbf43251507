"""``POST /-/scenario``: set or clear the active scenario round; ``GET /-/scenarios``: what
may be set (the configured scenario names and engines), this ``serve`` start's run id, and what
is announced now per engine (``active``).

The body may carry ``"cell"``: the round's parameters as the load driver knows them
(``input_tokens``, ``output_tokens``, ``concurrency`` or ``rate``, ``stage``, ``warmup``),
checked (:func:`check_cell`) and written beside the announcement in ``scenarios.jsonl``, where
``evidence report`` reads what each scenario's cell was.

``{"scenario": null}`` or ``{"scenario": "none"}`` clears; a name longer than
:data:`~exporter.proxy.scenarios.MAX_NAME` characters is refused (400) and never echoed or logged.
A round announced again after it was cleared or replaced in this run is still set (200), and the
answer gains ``"warning"``: its records will be reported as a separate announcement
(:meth:`~exporter.proxy.scenarios.ScenarioBoard.announce`; ``warmup`` and clearing never warn).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from .exchange import json_error
from .scenarios import CLEAR, MAX_NAME, MAX_ROUND, Announced
from .state import STATE

__all__ = ["scenario_handler", "scenarios_handler", "check_request", "check_cell", "CELL_KEYS"]

#: a cell's keys and their checks (a count up to 10**9, a positive finite rate, a short name, a flag)
CELL_KEYS: dict[str, Callable[[Any], bool]] = {
    "input_tokens": lambda v: type(v) is int and 0 < v <= 10**9,
    "output_tokens": lambda v: type(v) is int and 0 < v <= 10**9,
    "concurrency": lambda v: v is None or (type(v) is int and 0 < v <= 10**9),
    "rate": lambda v: v is None or (type(v) in (int, float) and 0 < v < float("inf")),
    "stage": lambda v: v is None or (isinstance(v, str) and 0 < len(v) <= MAX_NAME),
    "warmup": lambda v: type(v) is bool,
}


def check_cell(cell: Any) -> str | None:
    """Why a ``cell`` is refused (never repeating the input), or None."""
    if not isinstance(cell, dict):
        return "cell must be a JSON object"
    unknown = [k for k in cell if k not in CELL_KEYS]
    if unknown:
        return f"cell: {len(unknown)} unknown key(s); known: {', '.join(CELL_KEYS)}"
    bad = [k for k, v in cell.items() if not CELL_KEYS[k](v)]
    return f"cell: {', '.join(bad)}: not a valid value" if bad else None


def check_request(doc: Any, engine_known: Callable[[str], bool]) -> str | None:
    """Why a ``/-/scenario`` body is refused (a message that never repeats the input), or None."""
    if not isinstance(doc, dict):
        return "body must be a JSON object"
    name, rnd, engine = doc.get("scenario"), doc.get("round", 0), doc.get("engine")
    if name is not None and (not isinstance(name, str) or not name):
        return "scenario must be a non-empty string, or null (or \"none\") to clear"
    if isinstance(name, str) and len(name) > MAX_NAME:
        return f"scenario name longer than {MAX_NAME} characters"
    if type(rnd) is not int or not 0 <= rnd <= MAX_ROUND:
        return f"round must be an integer 0..{MAX_ROUND}"
    if engine is not None and not (isinstance(engine, str) and engine_known(engine)):
        return "unknown engine"
    if "cell" in doc and doc["cell"] is not None:
        return check_cell(doc["cell"])
    return None


async def scenario_handler(request: web.Request) -> web.Response:
    state = request.app[STATE]
    try:
        doc = await request.json()
    except (ValueError, UnicodeDecodeError):
        return json_error(400, "body must be JSON: {\"scenario\": NAME, \"round\": N}", "invalid_request")
    problem = check_request(doc, lambda e: state.config.engine(e) is not None)
    if problem is not None:
        return json_error(400, problem, "invalid_request")
    name, rnd = doc.get("scenario"), doc.get("round", 0)
    try:
        done: Announced = state.scenarios.announce(name, rnd, doc.get("engine"))
    except (ValueError, OSError) as exc:  # the shared state could not take it: say so, keep serving
        return json_error(507, f"scenario not set: {exc}", "scenario_state")
    label = None if name is None or name in CLEAR else state.scenarios.label(name)
    if label not in (None, "other") and doc.get("cell"):
        try:
            state.scenarios.note_cell(label, rnd, done.engines, doc["cell"])
        except (ValueError, OSError) as exc:
            return json_error(507, f"cell not noted: {exc}", "scenario_state")
    answer: dict[str, Any] = {"scenario": label, "round": rnd, "engines": done.engines}
    if done.warning is not None:
        answer["warning"] = done.warning
    return web.json_response(answer)


async def scenarios_handler(request: web.Request) -> web.Response:
    """Read-only: ``{"scenarios": [configured names], "engines": [names], "run_id": id, "active":
    {engine: {"scenario": NAME, "round": N} or null}}``: ``active`` is what each engine's requests
    without an ``X-Bench-Scenario`` header are labelled with now (every worker sees the same)."""
    state = request.app[STATE]
    return web.json_response({"scenarios": list(state.scenarios.names),
                              "engines": [e.name for e in state.config.engines],
                              "run_id": state.worker.run_id,
                              "active": state.scenarios.announced()})
