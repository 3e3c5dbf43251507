"""The load driver's look at its base URL before it sends a benchmark request.

A malformed URL, a refused connection, an unknown host and an HTTP 404 (a wrong path, such
as the proxy without its ``/<engine>`` prefix) each get their own line, instead of a run
whose every request fails the same way.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import aiohttp

from .cliutil import UserError

__all__ = ["check_url_syntax", "check_base_url"]


def check_url_syntax(base_url: str) -> str:
    """The base URL without a trailing slash; a UserError when it is not an http(s) URL."""
    try:
        parts = urlsplit(base_url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as exc:
        raise UserError(f"malformed --base-url {base_url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"malformed --base-url {base_url!r}: expected http://HOST:PORT[/PATH], "
                        "e.g. http://127.0.0.1:9464/vllm")
    if parts.query or parts.fragment:
        raise UserError(f"malformed --base-url {base_url!r}: no query or fragment expected")
    return base_url.rstrip("/")


def _connect_reason(exc: aiohttp.ClientConnectorError) -> str:
    err = exc.os_error
    if isinstance(err, ConnectionRefusedError):
        return "connection refused (is the engine or the proxy running there?)"
    if isinstance(err, socket.gaierror):
        return f"unknown host ({err.strerror or err})"
    return err.strerror or str(err) or type(err).__name__


async def check_base_url(session: aiohttp.ClientSession, base_url: str, timeout_s: float = 10.0) -> str | None:
    """``GET {base}/v1/models``: the first model's id, None when the answer names none.

    Raises UserError for a refused connection, an unknown host, no answer and HTTP 404.
    """
    url = f"{base_url}/v1/models"
    host = urlsplit(base_url).netloc
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status == 404:
                raise UserError(f"HTTP 404 from {url}: is the --base-url path right? Through the proxy it is "
                                "http://HOST:PORT/<engine>; straight to an engine, http://HOST:PORT")
            if resp.status != 200:
                return None  # the request itself will tell; some servers guard /v1/models only
            doc = await resp.json(content_type=None)
    except aiohttp.ClientConnectorError as exc:
        raise UserError(f"cannot connect to {host}: {_connect_reason(exc)}") from None
    except TimeoutError:
        raise UserError(f"no answer from {url} within {timeout_s:g} s") from None
    except aiohttp.ClientError as exc:
        raise UserError(f"{url}: {type(exc).__name__}: {exc}") from None
    except ValueError:
        return None
    try:
        return str(doc["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        return None
