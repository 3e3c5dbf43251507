"""The load driver's look at its base URL before it sends a benchmark request.

A malformed URL, a refused connection, an unknown host and an HTTP 404 (a wrong path, such
as the proxy without its ``/<engine>`` prefix) each get their own line, instead of a run
whose every request fails the same way.

Through the proxy, ``GET /-/scenarios`` lists the scenario names it knows: a name it does
not know would be recorded as ``other`` and mixed with every other unknown name, so such a
run is refused before its first request.  A base URL that is an engine itself skips that
check only when the user says so (``load --no-proxy``).
"""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from .cliutil import UserError

__all__ = ["check_url_syntax", "check_base_url", "check_proxy_scenarios", "NO_PROXY_HINT"]


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


#: how to drive an engine straight, without the proxy
NO_PROXY_HINT = "if --base-url is an engine itself, add --no-proxy (no proxy records, no scenario check)"


async def _scenario_list(session: aiohttp.ClientSession, url: str, timeout_s: float) -> dict[str, Any]:
    """The proxy's answer to ``GET /-/scenarios``; UserError when there is no proxy there."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                raise UserError(f"GET {url}: HTTP {resp.status}, so --base-url does not go through the proxy "
                                f"(or one without a scenario list); {NO_PROXY_HINT}")
            doc = await resp.json(content_type=None)
    except aiohttp.ClientError as exc:
        raise UserError(f"cannot read the proxy's scenario list at {url}: {type(exc).__name__}: {exc}") from None
    except TimeoutError:
        raise UserError(f"no answer from {url} within {timeout_s:g} s") from None
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("scenarios"), list):
        raise UserError(f"GET {url} did not answer the proxy's scenario list; {NO_PROXY_HINT}")
    return doc


async def check_proxy_scenarios(session: aiohttp.ClientSession, proxy_root: str, engine: str | None,
                                names: list[str], timeout_s: float = 10.0) -> None:
    """Raise UserError unless the proxy at ``proxy_root`` knows ``engine`` and every one of
    ``names`` (a name it does not know would be recorded as ``other``)."""
    if engine is None:
        raise UserError(f"--base-url {proxy_root} names no engine, so it does not go through the proxy "
                        f"(http://HOST:PORT/<engine>); {NO_PROXY_HINT}")
    doc = await _scenario_list(session, f"{proxy_root}/-/scenarios", timeout_s)
    known = [str(n) for n in doc["scenarios"]]
    engines = doc.get("engines")
    if isinstance(engines, list) and engine not in engines:
        raise UserError(f"the proxy at {proxy_root} has no engine {engine!r} (it has: {', '.join(map(str, engines))})")
    unknown = [n for n in names if n not in known]
    if unknown:
        what, them = ("scenarios", "them") if len(unknown) > 1 else ("scenario", "it")
        raise UserError(f"the proxy at {proxy_root} does not know the {what} {', '.join(unknown)} (it would "
                        f"record {them} as 'other'): add {them} to scenarios: in its config and restart serve "
                        f"(it knows: {', '.join(known) or 'none'})")
