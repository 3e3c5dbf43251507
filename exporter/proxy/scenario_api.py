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

A round whose (engine, scenario) series ``/metrics`` did not show yet (:mod:`exporter.proxy.shown`)
is set once every scraper that scrapes at an interval has read them at zero, at most
:data:`~exporter.proxy.shown.ANNOUNCE_WAIT_S` later, and answered then: a client that sends the
round's requests after the answer has them all counted from a zero sample, and the round's span
starts after the wait.  ``waited_s`` says how long that took; where the time ran out (or the
supervisor could not say), ``warning`` says so.  Announcements for an engine take their places in
line as they arrive: one that waited is not set for an engine for which a later one came meanwhile
(a clear, say); it is answered 409 when that leaves it no engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from .exchange import json_error
from .scenarios import CLEAR, MAX_NAME, MAX_ROUND, Announced
from .shown import ANNOUNCE_WAIT_S, Pair, read_by_scrapers
from .state import METRICS_SESSION, STATE

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
    name, rnd, engine = doc.get("scenario"), doc.get("round", 0), doc.get("engine")
    label = None if name is None or name in CLEAR else state.scenarios.label(name)
    waited: float = 0.0
    read: bool | None = True
    try:
        ticket = state.scenarios.ticket(engine)  # its place in line: a later one that overtakes it wins
        if label is not None:  # the round's series are read at zero by the scrapers before it is set
            waited, read = await _read_by_scrapers(request, [(e, label) for e in state.scenarios.targets(engine)])
        done: Announced = state.scenarios.announce(name, rnd, engine, ticket)
    except (ValueError, OSError) as exc:  # the shared state could not take it: say so, keep serving
        return json_error(507, f"scenario not set: {exc}", "scenario_state")
    if not done.engines:
        return json_error(409, "a later POST /-/scenario for the same engines came while this one waited for "
                          "the scrapers; that one is set", "superseded")
    if label not in (None, "other") and doc.get("cell"):
        try:
            state.scenarios.note_cell(label, rnd, done.engines, doc["cell"])
        except (ValueError, OSError) as exc:
            return json_error(507, f"cell not noted: {exc}", "scenario_state")
    answer: dict[str, Any] = {"scenario": label, "round": rnd, "engines": done.engines}
    warnings = [done.warning] if done.warning is not None else []
    if label is not None:
        answer["waited_s"] = round(waited, 3)
        if read is None:
            warnings.append("the metrics renderer did not say whether the scrapers read the round's new series: "
                            "a rate over the round's first scrape interval may miss its first requests")
        elif not read:
            warnings.append(f"not every scraper read the round's new series within {ANNOUNCE_WAIT_S:g} s: a rate "
                            "over the round's first scrape interval may miss its first requests")
    if done.superseded:
        warnings.append(f"not set for {', '.join(done.superseded)}: a later POST /-/scenario for it came while "
                        "this one waited")
    if warnings:
        answer["warning"] = "; ".join(warnings)
    return web.json_response(answer)


async def _read_by_scrapers(request: web.Request, pairs: list[Pair]) -> tuple[float, bool | None]:
    """:func:`~exporter.proxy.shown.read_by_scrapers` here, or under ``serve`` by the supervisor, which
    renders every scrape (None: it did not answer)."""
    state = request.app[STATE]
    session = request.app.get(METRICS_SESSION)
    if session is None:
        return await read_by_scrapers(state.shown, state.scrapes, pairs)
    try:
        async with session.post("http://supervisor/-/shown", json={"pairs": pairs},
                                timeout=aiohttp.ClientTimeout(total=ANNOUNCE_WAIT_S + 5)) as resp:
            doc = await resp.json()
        return float(doc["waited_s"]), bool(doc["read"])
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError, TypeError):
        return 0.0, None


async def scenarios_handler(request: web.Request) -> web.Response:
    """Read-only: ``{"scenarios": [configured names], "engines": [names], "run_id": id, "active":
    {engine: {"scenario": NAME, "round": N} or null}}``: ``active`` is what each engine's requests
    without an ``X-Bench-Scenario`` header are labelled with now (every worker sees the same)."""
    state = request.app[STATE]
    return web.json_response({"scenarios": list(state.scenarios.names),
                              "engines": [e.name for e in state.config.engines],
                              "run_id": state.worker.run_id,
                              "active": state.scenarios.announced()})
