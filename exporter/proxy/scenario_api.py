"""``POST /-/scenario``: set or clear the active scenario round (SPEC section 2)."""

from __future__ import annotations

from aiohttp import web

from .exchange import json_error
from .scenarios import MAX_ROUND
from .state import STATE

__all__ = ["scenario_handler"]


async def scenario_handler(request: web.Request) -> web.Response:
    state = request.app[STATE]
    try:
        doc = await request.json()
    except (ValueError, UnicodeDecodeError):
        return json_error(400, "body must be JSON: {\"scenario\": NAME, \"round\": N}", "invalid_request")
    if not isinstance(doc, dict):
        return json_error(400, "body must be a JSON object", "invalid_request")
    name, rnd, engine = doc.get("scenario"), doc.get("round", 0), doc.get("engine")
    if name is not None and (not isinstance(name, str) or not name):
        return json_error(400, "scenario must be a non-empty string or null", "invalid_request")
    if type(rnd) is not int or not 0 <= rnd <= MAX_ROUND:
        return json_error(400, f"round must be an integer 0..{MAX_ROUND}", "invalid_request")
    if engine is not None and state.config.engine(str(engine)) is None:
        return json_error(400, "unknown engine", "invalid_request")
    engines = state.scenarios.set(name, rnd, engine)
    label = None if name is None else state.scenarios.label(name)
    return web.json_response({"scenario": label, "round": rnd, "engines": engines})
