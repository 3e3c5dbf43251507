"""The two places where the proxy relies on a library's private behaviour, kept in one module.

Neither library offers a public API for what is done here; each function says why, and
what exactly it relies on.  ``tests/unit/test_internals.py`` exercises exactly these
contracts against the installed aiohttp and prometheus_client (CI runs it at the floors and
at the newest releases), so a release that breaks one turns a named test red instead of
breaking the proxy at run time.

* :func:`redirect_reads` / :func:`restore_reads` (aiohttp): a client response's body reads
  go to a callback, in the protocol callback that received them.  aiohttp's public readers
  (``iter_any``, ``readany``, ``iter_chunked``) wake a coroutine per read; the hop's point is
  to take each read in the callback that received it (:mod:`exporter.proxy.hop`).
  Relied on: ``ClientResponse.content`` is exactly ``aiohttp.streams.StreamReader`` (its
  ``__slots__`` layout lets the instance's class be switched); the HTTP parser (C or Python)
  calls ``feed_data(data)``, ``feed_eof()``, ``set_exception(exc, cause)`` and the
  ``*_http_chunk_receiving`` pair on it; ``StreamReader.feed_eof`` runs the end-of-body
  callbacks that release the connection to the pool.
* :func:`use_multiprocess_values` (prometheus_client): metric values go to the multiprocess
  files.  The documented switch is ``PROMETHEUS_MULTIPROC_DIR`` set before prometheus_client
  is first imported; a forked worker inherits the supervisor's already imported module, so
  the value class is replaced instead.  Relied on: ``values.ValueClass`` is read each time a
  metric child is made, and ``values.MultiProcessValue()`` returns such a class.
"""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp.streams import StreamReader

__all__ = ["ReadSink", "redirect_reads", "restore_reads", "is_redirected", "use_multiprocess_values"]


class ReadSink(Protocol):
    """Where a redirected reader's body goes."""

    def on_data(self, data: bytes) -> None: ...

    def end(self, error: BaseException | None) -> None: ...


_SINKS: dict[int, ReadSink] = {}


class _RedirectedReader(StreamReader):
    """A StreamReader whose reads go to a sink instead of its buffer (same slots: an
    instance's class is switched to this one in place, and back)."""

    __slots__ = ()

    def feed_data(self, data: bytes, *args: Any) -> bool:
        sink = _SINKS.get(id(self))
        if sink is not None and data:
            sink.on_data(data)
        return False  # nothing buffered: never asks the protocol to pause

    def feed_eof(self) -> None:
        StreamReader.feed_eof(self)  # runs aiohttp's end-of-body callbacks (connection release)
        sink = _SINKS.get(id(self))
        if sink is not None:
            sink.end(None)

    def set_exception(self, exc: BaseException, *args: Any) -> None:
        StreamReader.set_exception(self, exc, *args)
        sink = _SINKS.get(id(self))
        if sink is not None:
            sink.end(exc)

    def begin_http_chunk_receiving(self) -> None:
        pass

    def end_http_chunk_receiving(self) -> None:
        pass


def redirect_reads(reader: StreamReader, sink: ReadSink) -> None:
    """From now on each body read of ``reader`` calls ``sink.on_data``; its end or failure
    calls ``sink.end``.  Bytes already buffered stay there (read them with ``read_nowait``
    first)."""
    if type(reader) is not StreamReader:
        raise TypeError(f"cannot redirect the reads of a {type(reader).__name__}")
    _SINKS[id(reader)] = sink
    reader.__class__ = _RedirectedReader


def restore_reads(reader: StreamReader) -> None:
    """Undo :func:`redirect_reads` (a no-op for a reader that was never redirected)."""
    _SINKS.pop(id(reader), None)
    if type(reader) is _RedirectedReader:
        reader.__class__ = StreamReader  # type: ignore[assignment]


def is_redirected(reader: StreamReader) -> bool:
    return type(reader) is _RedirectedReader


def use_multiprocess_values() -> None:
    """Metric children made from now on keep their values in ``PROMETHEUS_MULTIPROC_DIR``'s
    files (call it before any metric of this process is made)."""
    from prometheus_client import values

    values.ValueClass = values.MultiProcessValue()  # this process's own files (its pid)
