"""The one place where the proxy relies on libraries' behaviour beyond their documented API:
aiohttp's server-side response writer and prometheus_client's multiprocess values.

No library offers a public API for what is done here; each item says why, and exactly what is
relied on.  ``tests/unit/test_internals.py`` exercises each contract by name against the installed
releases (CI runs it at the floor and at the newest release), so a release that breaks one turns
a named test red instead of breaking the proxy at run time.

aiohttp (the relay, :mod:`exporter.proxy.relay`):

* :func:`write_body`: after ``StreamResponse.prepare()`` and ``StreamWriter.send_headers()``,
  the relay writes body bytes straight to the client's transport, in HTTP/1.1 chunk framing when
  the writer's ``chunked`` is set, and ends the body with ``StreamResponse.write_eof(rest)``.
  Relied on: ``send_headers()`` writes the buffered head to the transport at once; ``chunked``
  says whether the writer frames the body; ``write_eof`` writes ``rest`` as one chunk and then
  the last chunk (``0\r\n\r\n``), whatever went to the transport beneath it.  Why: the
  writer's ``write`` coroutine is a layer (its own framing, size accounting, a drain check) on
  every read of every stream, where the relay needs one ``transport.write``.
* :func:`client_writing_paused`: the client connection's protocol (``request.protocol``, a
  ``BaseProtocol``) tells whether the transport called its ``pause_writing``
  (``writing_paused``), and ``StreamWriter.drain()`` returns when it called ``resume_writing``
  (or raises ``ConnectionError`` when the connection was lost).  Why: aiohttp offers no callback
  for its flow control; the relay's back-pressure episodes are exactly those two events.

prometheus_client:

* :func:`use_multiprocess_values` (prometheus_client): metric values go to the multiprocess
  files.  The documented switch is ``PROMETHEUS_MULTIPROC_DIR`` set before prometheus_client
  is first imported; a forked worker inherits the supervisor's already imported module, so
  the value class is replaced instead.  Relied on: ``values.ValueClass`` is read each time a
  metric child is made, and ``values.MultiProcessValue()`` returns such a class.
* :func:`read_entries` and :func:`accumulate` (prometheus_client's multiprocess mode): the
  supervisor's merge of the workers' value files keeps what it parsed between scrapes
  (:mod:`exporter.proxy.merge`); ``MultiProcessCollector`` re-reads and re-parses everything.
  Relied on: a value file's layout (``mmap_dict``: a 4-byte ``used`` size, then entries of a
  4-byte key length, the UTF-8 JSON key padded to 8 bytes, two doubles); the key's JSON
  ``[metric name, sample name, labels, help]``; and ``MultiProcessCollector._accumulate_metrics``,
  the merge of one family's raw samples (``_multiprocess_mode`` set on gauges).
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Iterator
from typing import Any

from aiohttp import web

__all__ = ["write_body", "client_writing_paused", "use_multiprocess_values", "read_entries", "parse_key",
           "accumulate", "VALUES"]

_INT = struct.Struct("i")


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


#: a value and its timestamp, at an entry's value offset
VALUES = struct.Struct("dd")


def read_entries(data: bytes, start: int) -> Iterator[tuple[str, int]]:
    """The entries of a value file's bytes from offset ``start`` (8 for the first): each key
    and the offset of its two doubles; the last one yielded ends at ``offset + 16``.  Raises
    ``struct.error`` on a file too short to hold its own size (being created), as
    prometheus_client does."""
    used = _INT.unpack_from(data, 0)[0]
    pos = start
    while pos < used:
        length = _INT.unpack_from(data, pos)[0]
        if length + pos > used:
            raise RuntimeError("Read beyond file size detected, file is corrupted.")
        pos += 4
        key = data[pos:pos + length].decode("utf-8")
        pos += length + (8 - (length + 4) % 8)
        if pos + 16 > len(data):
            raise struct.error("value file shorter than its entries")
        yield key, pos
        pos += 16


def parse_key(key: str) -> tuple[str, str, tuple[tuple[str, str], ...], str]:
    """(metric name, sample name, sorted label pairs, help) of a value file's key."""
    metric_name, name, labels, help_text = json.loads(key)
    return metric_name, name, tuple(sorted(labels.items())), help_text


def accumulate(metric: Any) -> Any:
    """One family's raw samples merged as ``MultiProcessCollector`` merges them."""
    from prometheus_client.multiprocess import MultiProcessCollector

    (merged,) = MultiProcessCollector._accumulate_metrics({metric.name: metric}, True)
    return merged


def use_multiprocess_values() -> None:
    """Metric children made from now on keep their values in ``PROMETHEUS_MULTIPROC_DIR``'s
    files (call it before any metric of this process is made)."""
    from prometheus_client import values

    values.ValueClass = values.MultiProcessValue()  # this process's own files (its pid)
