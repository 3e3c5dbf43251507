"""The supervisor's merge of every worker's value files, with what does not change kept.

prometheus_client's ``MultiProcessCollector`` re-reads every file, JSON-parses every key and
merges every series on each scrape: 220 ms of CPU with 8,400 series (2 engines x 18 scenarios),
nearly all of it for series whose values did not move since the last scrape (during a run, one
scenario's series move at a time).  A value file only ever grows and a key never moves once
written, so :class:`MergedValues` keeps:

* per file, the entries parsed so far (key and value offset): a scrape reads each file's bytes
  once, parses only the entries added since, and unpacks the values at their known offsets;
* per series (a family's samples that merge together: one label set, all workers' values, a
  histogram's buckets, sum and count), the merged samples of the last scrape: a series whose
  raw samples are the same is not merged again; the others are merged by prometheus_client's
  own code (:func:`exporter.proxy.valuefiles.accumulate`), one series at a time;
* :mod:`exporter.proxy.exposition` keeps each series' encoded bytes beside the token of its
  merge, so an unchanged series is not encoded again either.

Families come in the order of the files and of their keys, as prometheus_client's; inside a
family the samples of one series stay together (prometheus_client 0.26's order; 0.22 put every
histogram's ``_sum`` first).  ``tests/unit/test_merge.py`` holds the merged samples equal to
prometheus_client's and the encoded bytes equal to its encoders' for the same families.
"""

from __future__ import annotations

import glob
import os
import threading
from typing import Any

from prometheus_client.metrics_core import Metric

from .valuefiles import VALUES, accumulate, parse_key, read_entries

__all__ = ["MergedValues", "MergedFamily", "Series"]

Labels = tuple[tuple[str, str], ...]
#: gauge modes whose merge drops the worker's pid (one series for all workers)
_PID_DROPPED = frozenset({"min", "livemin", "max", "livemax", "sum", "livesum", "mostrecent", "livemostrecent"})


class Series:
    """One series' merged samples; a new object whenever they changed."""

    __slots__ = ("raw", "samples")

    def __init__(self, raw: list[tuple[Any, ...]], samples: list[Any]) -> None:
        self.raw = raw
        self.samples = samples


class MergedFamily(Metric):
    """A merged family, with its series in order (for an encoder that keeps their bytes)."""

    series: list[tuple[Labels, Series]]


class _File:
    """One value file's entries parsed so far: (metric name, help, sample name, labels as
    sampled, series key, value offset)."""

    __slots__ = ("inode", "end", "entries")

    def __init__(self, inode: int) -> None:
        self.inode = inode
        self.end = 8
        self.entries: list[tuple[str, str, str, Labels, Labels, int]] = []


class _Family:
    __slots__ = ("typ", "help", "mode", "series", "merged")

    def __init__(self, typ: str, help_text: str) -> None:
        self.typ = typ
        self.help = help_text
        self.mode: str | None = None
        self.series: dict[Labels, list[tuple[Any, ...]]] = {}
        self.merged: MergedFamily | None = None


class MergedValues:
    """A collector of ``path``'s value files, answering the samples ``MultiProcessCollector(path)``
    answers."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._files: dict[str, _File] = {}
        self._series: dict[tuple[str, Labels], Series] = {}
        self._families: dict[str, _Family] = {}
        self._lock = threading.Lock()  # renders run in threads; two scrapes may overlap
        self.merges = 0  # series merged anew so far (tests read it)

    def collect(self) -> list[Any]:
        with self._lock:
            return [self._family(name, family) for name, family in self._read_all().items()]

    def _read_all(self) -> dict[str, _Family]:
        families: dict[str, _Family] = {}
        unpack = VALUES.unpack_from
        for path in glob.glob(os.path.join(self.path, "*.db")):
            parts = os.path.basename(path).split("_")
            typ = parts[0]
            try:
                entries, data = self._read(path, typ, parts)
            except FileNotFoundError:
                if typ == "gauge" and parts[1].startswith("live"):
                    continue  # a dead worker's live gauge, removed since the glob
                raise
            gauge = typ == "gauge"
            for metric_name, help_text, name, labels, key, pos in entries:
                family = families.get(metric_name)
                if family is None:
                    family = families[metric_name] = _Family(typ, help_text)
                value, timestamp = unpack(data, pos)
                if gauge:
                    family.mode = parts[1]
                sample = (name, labels, value, timestamp if gauge else None)
                series = family.series.get(key)
                if series is None:
                    family.series[key] = [sample]
                else:
                    series.append(sample)
        return families

    def _read(self, path: str, typ: str, parts: list[str]) -> tuple[list[tuple[str, str, str, Labels, Labels, int]], bytes]:
        with open(path, "rb") as f:
            inode = os.fstat(f.fileno()).st_ino
            data = f.read()
        known = self._files.get(path)
        if known is None or known.inode != inode or known.end > len(data):
            known = self._files[path] = _File(inode)  # new, or replaced: from the start
        gauge = typ == "gauge"
        pid = ("pid", parts[2][:-3]) if gauge else None
        keep_pid = gauge and parts[1] not in _PID_DROPPED
        added = []
        end = known.end
        for raw_key, pos in read_entries(data, known.end):  # only what was added since the last scrape
            metric_name, name, labels, help_text = parse_key(raw_key)
            sampled = labels + (pid,) if pid is not None else labels
            if typ == "histogram":
                key = tuple(label for label in labels if label[0] != "le")
            else:
                key = sampled if keep_pid else labels
            added.append((metric_name, help_text, name, sampled, key, pos))
            end = pos + 16
        known.entries.extend(added)  # only once the whole file was read: a torn one adds nothing
        known.end = end
        return known.entries, data

    def _family(self, metric_name: str, family: _Family) -> MergedFamily:
        last = self._families.get(metric_name)
        same_kind = last is not None and (last.typ, last.help, last.mode) == (family.typ, family.help, family.mode)
        series: list[tuple[Labels, Series]] = []
        changed = not same_kind or last is None or last.series.keys() != family.series.keys()
        for key, raw in family.series.items():
            cached = self._series.get((metric_name, key)) if same_kind else None
            if cached is None or cached.raw != raw:
                cached = self._series[(metric_name, key)] = Series(raw, self._merge(metric_name, family, raw))
                changed = True
            series.append((key, cached))
        if not changed and last is not None and last.merged is not None:
            return last.merged
        merged = MergedFamily(metric_name, family.help, family.typ)
        merged.samples = [s for _, one in series for s in one.samples]
        merged.series = series
        family.merged = merged
        self._families[metric_name] = family
        return merged

    def _merge(self, metric_name: str, family: _Family, raw: list[tuple[Any, ...]]) -> list[Any]:
        """One series built as ``MultiProcessCollector._read_metrics`` builds its family, then merged."""
        self.merges += 1
        metric = Metric(metric_name, family.help, family.typ)
        if family.mode is not None:
            metric._multiprocess_mode = family.mode  # type: ignore[attr-defined]
            for name, labels, value, timestamp in raw:
                metric.add_sample(name, labels, value, timestamp)
        else:
            for name, labels, value, _ in raw:
                metric.add_sample(name, labels, value)
        return list(accumulate(metric).samples)
