"""prometheus_client's multiprocess value files, as the serve process's supervisor and workers use
them: the one place the exporter relies on prometheus_client's behaviour beyond its documented API.

No public API offers what is done here; each item says why, and exactly what is relied on.
``tests/unit/test_internals.py`` exercises each contract by name against the installed release
(CI runs it at the floor and at the newest release), so a release that breaks one turns a named
test red instead of breaking the exporter at run time.  (The relay's contracts with aiohttp's
writer are :mod:`exporter.proxy.wire.writer`'s.)

* :func:`use_multiprocess_values`: metric values go to the multiprocess files.  The documented
  switch is ``PROMETHEUS_MULTIPROC_DIR`` set before prometheus_client is first imported; a forked
  worker inherits the supervisor's already imported module, so the value class is replaced
  instead.  Relied on: ``values.ValueClass`` is read each time a metric child is made, and
  ``values.MultiProcessValue()`` returns such a class.
* :func:`read_entries` and :func:`accumulate` (multiprocess mode): the supervisor's merge of the
  workers' value files keeps what it parsed between scrapes (:mod:`exporter.proxy.merge`);
  ``MultiProcessCollector`` re-reads and re-parses everything.  Relied on: a value file's layout
  (``mmap_dict``: a 4-byte ``used`` size, then entries of a 4-byte key length, the UTF-8 JSON key
  padded to 8 bytes, two doubles); the key's JSON ``[metric name, sample name, labels, help]``;
  and ``MultiProcessCollector._accumulate_metrics``, the merge of one family's raw samples
  (``_multiprocess_mode`` set on gauges).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import Any

__all__ = ["use_multiprocess_values", "read_entries", "parse_key", "accumulate", "VALUES"]

_INT = struct.Struct("i")


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
