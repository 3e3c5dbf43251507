"""The client's half of the wire beneath aiohttp's server-side response writer: the one place the
relay relies on aiohttp's behaviour beyond its documented API.

No public API offers what is done here; each item says why, and exactly what is relied on.
``tests/unit/test_internals.py`` exercises each contract by name against the installed releases
(CI runs it at the floor and at the newest release), so a release that breaks one turns a named
test red instead of breaking the proxy at run time.

* :func:`write_body`: after ``StreamResponse.prepare()`` and ``StreamWriter.send_headers()``,
  the relay writes body bytes straight to the client's transport, in HTTP/1.1 chunk framing when
  the writer's ``chunked`` is set, and ends the body with ``StreamResponse.write_eof(rest)``.
  Relied on: ``send_headers()`` writes the buffered head to the transport at once (where
  ``prepare()`` has not already: the relay corks the client's socket before ``prepare()``, so
  the head leaves with the reads that came with it, :func:`exporter.proxy.wire.clientsock.cork`); ``chunked``
  says whether the writer frames the body; ``write_eof`` writes ``rest`` as one chunk and then
  the last chunk (``0\\r\\n\\r\\n``), whatever went to the transport beneath it.  Why: the
  writer's ``write`` coroutine is a layer (its own framing, size accounting, a drain check) on
  every read of every stream, where the relay needs one ``transport.write``.
* :func:`client_writing_paused`: the client connection's protocol (``request.protocol``, a
  ``BaseProtocol``) tells whether the transport called its ``pause_writing``
  (``writing_paused``), and ``StreamWriter.drain()`` returns when it called ``resume_writing``
  (or raises ``ConnectionError`` when the connection was lost).  Why: aiohttp offers no callback
  for its flow control; the relay's back-pressure episodes are exactly those two events.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

__all__ = ["write_body", "client_writing_paused"]


def write_body(client: asyncio.Transport, out: bytes, chunked: bool) -> None:
    """Body bytes to the client's transport beneath aiohttp's writer, framed as it would."""
    if not out:
        return
    if client.is_closing():
        raise ConnectionResetError("the client closed the connection")
    if not chunked:
        client.write(out)
    elif len(out) < 16384:
        client.write(b"%x\r\n%b\r\n" % (len(out), out))
    else:  # large reads: no copy
        client.writelines((b"%x\r\n" % len(out), out, b"\r\n"))


def client_writing_paused(request: web.BaseRequest) -> bool:
    """The client's transport asked its protocol to stop writing (its buffer is past high water)."""
    return bool(request.protocol.writing_paused)
