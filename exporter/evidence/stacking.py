"""A stacked panel's series for the PNG boards: parts of a whole (where TTFT goes), each engine's
parts on top of each other, as Grafana stacks them."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["stacked"]


def stacked(series: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each engine's series (the name's first word) stacked in their order, engine by engine, those
    without a value left out: each point its value plus the top of the engine's series before it at
    that time, that top kept as ``below``."""
    tops: dict[str, dict[float, float]] = {}
    out = []
    for s in sorted(series, key=lambda s: s["name"].split(" ")[0]):  # stable: the parts keep their order
        if all(math.isnan(v) for v in s["values"]):
            continue
        top = tops.setdefault(s["name"].split(" ")[0], {})
        below = [top.get(t, 0.0) for t in s["times"]]
        values = [b + v for b, v in zip(below, s["values"])]  # a gap stays a gap
        top.update((t, v) for t, v in zip(s["times"], values) if not math.isnan(v))
        out.append({**s, "values": values, "below": below})
    return out
