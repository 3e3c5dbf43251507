"""What a transport failure means for the verdict.

Shared by the proxy (its own upstream client, :mod:`exporter.proxy.wire.upstream`) and the load
driver (aiohttp's client), so both name the same failure the same way.
"""

from __future__ import annotations

import aiohttp

__all__ = ["transport_reason", "UpstreamConnectError", "UpstreamClosed"]


class UpstreamConnectError(ConnectionError):
    """No connection to the engine could be opened: the request never reached it."""


class UpstreamClosed(ConnectionError):
    """The engine's connection broke, or its answer could not be parsed as HTTP/1.1."""


def transport_reason(exc: BaseException) -> str | None:
    """``connect_error``, ``timeout`` or ``upstream_disconnect``; None for anything else.

    A connect timeout is a connect error: the request never reached the engine.
    """
    if isinstance(exc, (UpstreamConnectError, aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)):
        return "connect_error"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, (aiohttp.ClientError, OSError)):
        return "upstream_disconnect"
    return None
