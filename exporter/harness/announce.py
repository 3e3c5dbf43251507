"""The load driver's announcements to the proxy (``POST /-/scenario``).

An announcement that does not reach the proxy is not an error of the run: the driver goes on,
and says at the end whether it could clear what it announced.  The proxy's answer may carry a
``warning`` (a round announced again in the same run, whose records will be kept apart): it is
passed on as a ``warning:`` line, so that the user sees it before the report does.  The first round
of a scenario is answered only once the proxy's scrapers have read its series at zero (up to 20 s,
``exporter.proxy.shown``): hence the answer's generous time limit.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

import aiohttp

__all__ = ["post_scenario"]


async def post_scenario(session: aiohttp.ClientSession, proxy_root: str, body: dict[str, Any],
                        stream: TextIO | None = None, timeout_s: float = 30.0) -> int | None:
    """POST ``body`` to the proxy's ``/-/scenario``: the answer's status, None when none came;
    the proxy's ``warning``, if any, goes to ``stream`` (default stderr)."""
    try:
        async with session.post(f"{proxy_root}/-/scenario", json=body,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            answer = await r.json(content_type=None) if r.status == 200 else None
            status = r.status
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    if isinstance(answer, dict) and answer.get("warning"):
        print(f"warning: the proxy says: {answer['warning']}", file=stream or sys.stderr)
    return status
