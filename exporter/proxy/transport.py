"""What an aiohttp client exception means for the verdict.

Shared by the proxy and the load driver, so both name the same failure the same way.
"""

from __future__ import annotations

import aiohttp

__all__ = ["transport_reason"]


def transport_reason(exc: BaseException) -> str | None:
    """``connect_error``, ``timeout`` or ``upstream_disconnect``; None for anything else.

    A connect timeout is a connect error: the request never reached the engine.
    """
    if isinstance(exc, (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)):
        return "connect_error"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, (aiohttp.ClientError, OSError)):
        return "upstream_disconnect"
    return None
