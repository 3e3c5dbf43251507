"""``/metrics`` answers in the format the scraper asks for, gzipped when it accepts that.

The format is prometheus_client's own negotiation (``choose_encoder``: OpenMetrics when the
``Accept`` header asks for it, else the text format), the compression its ``gzip_accepted``
test of ``Accept-Encoding``; ``name[]`` restricts the answer to those sample names, as
prometheus_client's own handlers do (by the samples collected: the supervisor's collectors
describe no names beforehand, where prometheus_client's restricted registry looks).  The render
and the compression run in a thread so that the loop that serves the answer can run its other
callbacks between the GIL's switches.
gzip level 1: the proxy's page (440 kB, 5,000 series) shrinks to 20 kB for 3 ms of CPU.

One shortcut, exact: prometheus_client's OpenMetrics encoder applies the default
``underscores`` escaping to every sample name character by character (0.26: 69 ms of the
supervisor's CPU for 5,000 series, against 37 ms with ``allow-utf-8``).  Where every name is
a legacy one, that escaping changes nothing, so the same bytes are made with ``allow-utf-8``
escaping (``test_supervisor.py`` holds the two outputs equal).

Families are encoded one by one, and the bytes of each are kept beside the object they were
made from: a collector that answers an unchanged family or series with the same object (the
supervisor's merge, :mod:`exporter.proxy.merge`) has it encoded once, not on every scrape.  The
bytes are the encoder's own: a family's block, and each sample line in it, depends on nothing
else (``test_merge.py`` holds them equal to the encoders' for the whole answer).
"""

from __future__ import annotations

import asyncio
import gzip
import inspect
import re
import struct
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiohttp import hdrs, web
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector

__all__ = ["metrics_response", "metrics_handler", "render", "GZIP_LEVEL"]

GZIP_LEVEL = 1
#: a render that meets a value file mid-creation (a worker starting) is tried this often
RENDER_TRIES = 3
_LEGACY_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_OM_ESCAPING = {"escaping", "version"} <= set(inspect.signature(openmetrics.generate_latest).parameters)
_OM_UNDERSCORES = re.compile(r"application/openmetrics-text; version=([0-9.]+); charset=utf-8; escaping=underscores")


class _Families:
    """Families collected once, for an encoder that collects."""

    def __init__(self, families: Iterable[Any]) -> None:
        self.families = list(families)

    def collect(self) -> list[Any]:
        return self.families


def _named(registry: Collector, names: list[str]) -> _Families:
    """``registry``'s samples named in ``names``, in their families (none: the family is left out)."""
    wanted = frozenset(names)
    kept = []
    for family in registry.collect():
        samples = [s for s in family.samples if s.name in wanted]
        if samples:
            only = Metric(family.name, family.documentation, family.type, family.unit)
            only.samples = samples
            kept.append(only)
    return _Families(kept)


def _legacy(family: Any) -> bool:
    return bool(_LEGACY_NAME.fullmatch(family.name)) and all(
        _LEGACY_NAME.fullmatch(s.name) and all(_LEGACY_NAME.fullmatch(k) for k in s.labels) for s in family.samples)


class _Encoding:
    """One content type's encoder, with the bytes of what it encoded last: per family (beside
    the family object they were made from) and, for the supervisor's merged families
    (:mod:`exporter.proxy.merge`), per series (beside the series' merge token).  An unchanged
    family or series is then not encoded again; the bytes are the encoder's own, since each
    family's block, and each sample line in it, depends on nothing else."""

    def __init__(self, encoder: Callable[[Any], bytes], content_type: str) -> None:
        self.encoder = encoder
        self.version: str | None = None
        if _OM_ESCAPING:
            asked = _OM_UNDERSCORES.fullmatch(content_type)
            self.version = asked.group(1) if asked else "1.0.0" if content_type == openmetrics.CONTENT_TYPE_LATEST else None
        self.eof = content_type.startswith("application/openmetrics-text")
        self.families: dict[str, tuple[Any, bytes]] = {}
        self.series: dict[tuple[str, Any], tuple[Any, bytes]] = {}
        self.heads: dict[tuple[str, str, str], bytes] = {}

    def whole(self, family: Any) -> bytes:
        """One family's bytes, as they stand in the whole answer (an OpenMetrics one without
        the ``# EOF`` that ends every answer)."""
        if self.version is not None and _legacy(family):
            out = bytes(openmetrics.generate_latest(_Families([family]), escaping=openmetrics.ALLOWUTF8,
                                                    version=self.version))
        else:
            out = bytes(self.encoder(_Families([family])))
        if self.eof:
            assert out.endswith(_EOF), "an OpenMetrics answer ends with # EOF"
            out = out[:-len(_EOF)]
        return out

    def family(self, family: Any) -> bytes:
        hit = self.families.get(family.name)
        if hit is not None and hit[0] is family:
            return hit[1]
        series = getattr(family, "series", None)
        out = self.whole(family) if series is None else self._by_series(family, series)
        self.families[family.name] = (family, out)
        return out

    def _by_series(self, family: Any, series: list[tuple[Any, Any]]) -> bytes:
        kind = (family.name, family.documentation, family.type)
        head = self.heads.get(kind)
        if head is None:
            head = self.heads[kind] = self.whole(Metric(*kind))
        parts = [head]
        for key, one in series:
            hit = self.series.get((family.name, key))
            if hit is None or hit[0] is not one:
                alone = Metric(*kind)
                alone.samples = one.samples
                out = self.whole(alone)
                if not out.startswith(head):  # pragma: no cover - no encoder does this today
                    return self.whole(family)
                hit = self.series[(family.name, key)] = (one, out[len(head):])
            parts.append(hit[1])
        return b"".join(parts)


_ENCODINGS: dict[str, _Encoding] = {}
_EOF = b"# EOF\n"


def _encode(registry: Collector, encoder: Callable[[Any], bytes], content_type: str, kept: bool = True) -> bytes:
    """``encoder``'s bytes for ``registry``, family by family (the OpenMetrics shortcut where
    it gives the same bytes; what is unchanged since the last answer, its bytes of then).  Not
    ``kept``: a part of the page (``name[]``), encoded without taking the whole page's bytes' place."""
    encoding = _ENCODINGS.get(content_type)  # the content type names the encoder
    if encoding is None:
        encoding = _ENCODINGS[content_type] = _Encoding(encoder, content_type)
    encode = encoding.family if kept else encoding.whole
    parts = [encode(family) for family in registry.collect()]
    if encoding.eof:
        parts.append(_EOF)
    return b"".join(parts)


def render(registry: Collector, accept: str, accept_encoding: str, names: list[str] | None = None
           ) -> tuple[bytes, dict[str, str]]:
    """The body and headers of a /metrics answer."""
    encoder, content_type = choose_encoder(accept)
    if names:
        registry = _named(registry, names)
    body = _encode(registry, encoder, content_type, kept=not names)
    headers: dict[str, str] = {hdrs.CONTENT_TYPE: content_type}
    if gzip_accepted(accept_encoding):
        body = gzip.compress(body, compresslevel=GZIP_LEVEL)
        headers[hdrs.CONTENT_ENCODING] = "gzip"
    return body, headers


async def metrics_response(request: web.Request, registry: Collector) -> web.Response:
    accept = ",".join(request.headers.getall(hdrs.ACCEPT, []))
    accept_encoding = ",".join(request.headers.getall(hdrs.ACCEPT_ENCODING, []))
    names = request.query.getall("name[]", [])
    for attempt in range(RENDER_TRIES):
        try:
            body, headers = await asyncio.to_thread(render, registry, accept, accept_encoding, names)
            return web.Response(body=body, headers=headers)
        except struct.error:  # a worker's value file read while it was being created: gone in a moment
            if attempt + 1 == RENDER_TRIES:
                return web.Response(status=503, text="metrics files are being created; scrape again\n")
            await asyncio.sleep(0.05)
    raise AssertionError("unreachable")


def metrics_handler(registry: Collector) -> Callable[[web.Request], Awaitable[web.Response]]:
    """An aiohttp handler answering /metrics from ``registry``."""

    async def handler(request: web.Request) -> web.Response:
        return await metrics_response(request, registry)

    return handler
