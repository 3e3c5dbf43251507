"""Who the engines are, and whether they are up: a light probe beside the measured path.

One background task per engine (started with the app, or once in ``serve``'s supervisor for
all its workers) asks the engine, through the proxy's own upstream client
(:mod:`exporter.proxy.wire.upstream`), but never on a measured request's way:

* ``GET /health`` at most once a second: an answer below 500 is up; a refused or broken
  connection, a 5xx or no answer within :data:`HEALTH_TIMEOUT_S` is down, so an engine that
  stops answering reads down within 5 s.  Once an engine is known to be SGLang, ``GET /ready``
  instead: SGLang's ``/health`` runs a one-token generation through its scheduler (and waits a
  second for it), a request of the proxy's own in the batch it measures; ``/ready`` answers from
  the server's state (503 while starting or shutting down).  An SGLang without ``/ready`` (404)
  is probed on ``/health`` again.  What ``/ready`` cannot see: a scheduler that hangs while the
  HTTP server answers reads up until SGLang's own watchdog (``--watchdog-timeout``, 300 s by
  default) stops the server; its requests meanwhile fail as timeouts in the records;
* what it is, at start and whenever it comes back after being down: SGLang answers
  ``GET /server_info`` (``/get_server_info`` in older builds: its version and every server
  argument) and ``GET /model_info``; vLLM ``GET /version`` (and, started with
  ``VLLM_SERVER_DEV_MODE=1``, its whole config on ``/server_info``); both ``GET /v1/models``
  (``id``, ``root``, ``max_model_len``).  An engine that answers neither is ``unknown``;
* the time to ready of a start the proxy saw (down, then up): from the engine's own
  ``process_start_time_seconds`` (its ``/metrics``) when that process started after the proxy
  last saw it up, else from the first probe that found it down.

Every argument whose name's last word is ``key``, ``token``, ``secret``, ``password`` or
``credential(s)`` (``api_key``, ``hf_token``, ``apiKey``) is ``"<redacted>"`` (:func:`redact`)
before it is kept; ``max_total_tokens``, ``prefill_per_token_s``, ``tokenizer_path`` are kept.
Each change (an identity, a down, an up) is one line of ``engines.jsonl`` beside
``scenarios.jsonl``, with the run's id.  ``GET /-/engines`` answers :meth:`EngineWatch.snapshot`; the metrics are
:class:`exporter.proxy.metrics.EngineCollector`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from yarl import URL

from exporter import __version__
from exporter.core.timefmt import iso

from .config import Config
from .records import JsonlWriter
from .wire.upstream import Pool, origin_of, request_head

__all__ = ["EngineWatch", "EngineView", "redact", "REDACTED", "PROBE_USER_AGENT", "PROBE_INTERVAL_S",
           "HEALTH_TIMEOUT_S", "LOG_NAME", "identity_of"]

log = logging.getLogger("llmbench.engines")

PROBE_INTERVAL_S = 1.0
#: a probe with no answer by then reads down: at most 1 s between probes + this < 5 s
HEALTH_TIMEOUT_S = 3.5
IDENTITY_TIMEOUT_S = 10.0
#: the probes' User-Agent: an engine's access log (and a test's upstream) can tell them apart
PROBE_USER_AGENT = f"llm-bench-exporter/{__version__} engine-probe"
_HEADERS = ((b"User-Agent", PROBE_USER_AGENT.encode()), (b"Accept", b"application/json"))
REDACTED = "<redacted>"
#: a name's words: split at anything but letters and digits, and before a capital (``apiKey``)
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_SECRET_WORDS = frozenset({"key", "keys", "secret", "secrets", "password", "passwd", "passphrase", "credential",
                           "credentials"})
_SECRET_ENDINGS = ("token", "key", "secret", "password")
#: secret wherever they stand in a name (never token or key: ``prefill_per_token_s`` is a timing)
_ALWAYS_SECRET = frozenset({"secret", "secrets", "password", "passwd", "passphrase", "credential", "credentials"})
_START = re.compile(rb"^process_start_time_seconds(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.MULTILINE)
#: the file beside ``scenarios.jsonl``
LOG_NAME = "engines.jsonl"
#: what names an engine's identity (a change of any is a new ``identity`` line)
IDENTITY_KEYS = ("kind", "version", "model", "root", "max_model_len", "server_args", "model_info")


def is_secret_name(name: str) -> bool:
    """Whether an argument's name says it holds a secret: its last word (any case; words split at
    ``_``, ``-`` and before a capital) is key, secret, password or credentials, or ends in token,
    key, secret or password (``hf_token``, ``authToken``, ``privatekey``, ``ssl_keyfile_password``);
    ``max_total_tokens``, ``prefill_per_token_s`` and ``tokenizer_path`` are not: a word inside the
    name says what it counts or times, not what it holds.  Secret, password and credentials hide a
    name wherever they stand in it (``secret_sauce``)."""
    words = [w.lower() for w in _WORD.findall(name)]
    last = words[-1] if words else ""
    return last in _SECRET_WORDS or last.endswith(_SECRET_ENDINGS) or any(w in _ALWAYS_SECRET for w in words)


def redact(value: Any) -> Any:
    """``value`` with every argument whose name says it is a secret (:func:`is_secret_name`)
    replaced by ``"<redacted>"``, at any depth; in a list of command-line words
    (``["--api-key", "x"]`` or ``"--api-key=x"``) the value that follows such a flag too."""
    if isinstance(value, dict):
        return {k: REDACTED if is_secret_name(str(k)) else redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        out: list[Any] = []
        hide_next = False
        for item in value:
            if hide_next:
                out.append(REDACTED)
                hide_next = False
            elif isinstance(item, str) and item.startswith("-") and is_secret_name(item.split("=", 1)[0]):
                hide_next = "=" not in item
                out.append(item.split("=", 1)[0] + "=" + REDACTED if "=" in item else item)
            else:
                out.append(redact(item))
        return out
    return value


@dataclass
class EngineView:
    """What the proxy knows of one engine (``GET /-/engines`` shows it)."""

    name: str
    upstream: str
    base_url: str = field(repr=False)
    up: bool = False
    kind: str = "unknown"
    version: str | None = None
    model: str | None = None
    root: str | None = None
    max_model_len: int | None = None
    server_args: dict[str, Any] | None = None
    model_info: dict[str, Any] | None = None
    ready_at: float | None = None  # when the proxy saw it up (this time)
    checked_at: float | None = None  # the last health probe
    identified_at: float | None = None
    down_since: float | None = None  # the first probe that found it down (this time)
    last_up_at: float | None = None  # the last probe that found it up
    time_to_ready_s: float | None = None  # of the last start the proxy saw
    ready_from: str | None = None  # "process_start" or "down_seen"
    restarts: int = 0  # down, then up again, seen by the proxy
    detail: str | None = None  # why the last probe found it down
    health_path: str = field(default="/health", repr=False)  # "/ready" once known as an SGLang that has it

    def public(self) -> dict[str, Any]:
        keys = ("name", "upstream", "up", "kind", "version", "model", "root", "max_model_len", "server_args",
                "model_info", "ready_at", "checked_at", "down_since", "time_to_ready_s", "ready_from", "restarts",
                "detail")
        return {k: getattr(self, k) for k in keys}

    def identity(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in IDENTITY_KEYS}


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _is_sglang(info: Any) -> bool:
    return isinstance(info, dict) and isinstance(info.get("version"), str) and (
        "model_path" in info or "tp_size" in info)


def _first_model(models: Any) -> dict[str, Any]:
    data = models.get("data") if isinstance(models, dict) else None
    first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
    return first


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def identity_of(server_info: Any, version: Any, models: Any, model_info: Any) -> dict[str, Any]:
    """The identity in the engines' answers (each None where it did not answer in JSON):
    ``server_info`` (``/server_info`` or ``/get_server_info``), ``version`` (``/version``),
    ``models`` (``/v1/models``), ``model_info`` (``/model_info``); redacted."""
    first = _first_model(models)
    out: dict[str, Any] = {"kind": "unknown", "version": None, "model": first.get("id"), "root": first.get("root"),
                           "max_model_len": _int(first.get("max_model_len")), "server_args": None,
                           "model_info": None}
    if _is_sglang(server_info):
        args = {k: v for k, v in server_info.items() if k not in ("version", "internal_states")}
        out.update(kind="sglang", version=server_info["version"], server_args=redact(args),
                   model_info=redact(model_info) if isinstance(model_info, dict) else None)
        out["model"] = out["model"] or args.get("served_model_name") or args.get("model_path")
        out["root"] = args.get("model_path") or out["root"]  # its /v1/models says the served name again
        out["max_model_len"] = out["max_model_len"] or _int(args.get("context_length"))
    elif isinstance(version, dict) and isinstance(version.get("version"), str):
        out.update(kind="vllm", version=version["version"])
        if isinstance(server_info, dict) and "vllm_config" in server_info:  # VLLM_SERVER_DEV_MODE=1
            out["server_args"] = redact({"vllm_config": server_info["vllm_config"]})
    for key in ("model", "root"):
        if not isinstance(out[key], str):
            out[key] = None
    return out


class EngineWatch:
    """The probes of every configured engine, their state, and ``engines.jsonl``.

    ``run_id`` None: no ``engines.jsonl`` (no run to name)."""

    def __init__(self, config: Config, run_id: str | None, interval_s: float = PROBE_INTERVAL_S) -> None:
        self.config = config
        self.run_id = run_id
        self.interval_s = interval_s
        self.views = {e.name: EngineView(e.name, e.display_url, e.base_url) for e in config.engines}
        self.pool: Pool | None = None
        self._log: JsonlWriter | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._identified: set[str] = set()  # engines with an identity line in this run
        self._to_ask: set[str] = set()  # engines up and not asked yet what they are (since they came up)
        self._jobs: dict[str, asyncio.Task[None]] = {}  # per engine: asking it what it is
        self._refine: dict[str, tuple[float, float | None]] = {}  # a start to time: (ready, last up before)

    # -- life cycle ------------------------------------------------------------------------

    def start(self, pool: Pool) -> None:
        """One probe task per engine on ``pool``; the run's first line of ``engines.jsonl``."""
        self.pool = pool
        if self.run_id is not None:
            self._log = JsonlWriter(self.config.records_dir / LOG_NAME)
            self._write("start", None, engines=[{"name": v.name, "upstream": v.upstream} for v in self.views.values()],
                        proxy=self.proxy())
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._watch(v), name=f"engine-watch-{v.name}") for v in self.views.values()]

    async def stop(self) -> None:
        tasks = [*self._tasks, *self._jobs.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks, self._jobs = [], {}
        if self._log is not None:
            self._log.close()
            self._log = None

    # -- what it knows -----------------------------------------------------------------------

    def proxy(self) -> dict[str, Any]:
        return {"version": __version__, "config_sha256": self.config.config_sha256, "run_id": self.run_id}

    def rows(self) -> list[dict[str, Any]]:
        """Every view's fields (the metrics read them)."""
        return [vars(v) for v in self.views.values()]

    def snapshot(self) -> dict[str, Any]:
        """``GET /-/engines``: every engine's view, the proxy's version, config hash and run."""
        return {"engines": [v.public() for v in self.views.values()], "proxy": self.proxy(), "run_id": self.run_id}

    # -- the probes --------------------------------------------------------------------------

    async def _watch(self, view: EngineView) -> None:
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            try:
                await self.probe(view)
            except asyncio.CancelledError:
                raise
            except Exception:  # never let one odd answer stop the watch
                log.exception("engine %s: probe failed", view.name)
            await asyncio.sleep(max(0.0, self.interval_s - (loop.time() - began)))

    async def probe(self, view: EngineView) -> None:
        """One health probe; on a change of state, what follows from it.  Asking the engine what
        it is runs beside the probes (a slow answer never holds up the next health probe)."""
        status, detail = await self._health(view)
        now = time.time()
        view.checked_at = round(now, 3)
        if status is not None and status < 500:
            if not view.up:
                self._went_up(view, now)
            view.last_up_at = now
            job = self._jobs.get(view.name)
            if view.name in self._to_ask and (job is None or job.done()):
                self._jobs[view.name] = asyncio.get_running_loop().create_task(self._ask(view, now))
        elif view.up or view.down_since is None:
            self._went_down(view, now, detail if status is None else f"HTTP {status} on {view.health_path}")

    async def get(self, view: EngineView, path: str, timeout_s: float = IDENTITY_TIMEOUT_S) -> tuple[int, bytes] | None:
        """``GET path`` on the engine: (status, body), or None with no answer."""
        status, body = await self._fetch(view, path, timeout_s)
        return None if status is None or not isinstance(body, bytes) else (status, body)

    async def _fetch(self, view: EngineView, path: str, timeout_s: float) -> tuple[int | None, bytes | str]:
        """(status, body) of ``GET path`` through the proxy's upstream pool, or (None, why not)."""
        assert self.pool is not None, "the watch has not started"
        url = URL(view.base_url + path)
        try:
            async with asyncio.timeout(timeout_s):
                resp = await self.pool.request(origin_of(url), request_head("GET", url, _HEADERS, 0), b"")
                try:
                    body = await resp.read()
                finally:
                    resp.release()
        except TimeoutError:
            return None, f"no answer to {url.path} within {timeout_s:g} s"
        except OSError as exc:  # UpstreamConnectError and UpstreamClosed are OSErrors
            return None, f"{type(exc).__name__}: {exc}"
        return resp.status, body

    async def _health(self, view: EngineView) -> tuple[int | None, str | None]:
        status, body = await self._fetch(view, view.health_path, HEALTH_TIMEOUT_S)
        if status == 404 and view.health_path != "/health":  # an SGLang older than /ready
            view.health_path = "/health"
            status, body = await self._fetch(view, view.health_path, HEALTH_TIMEOUT_S)
        return status, body if isinstance(body, str) else None

    async def _json_get(self, view: EngineView, path: str, answered: list[bool]) -> Any:
        """The JSON of a 200 answer to ``GET path`` (None otherwise); ``answered`` notes any answer."""
        got = await self.get(view, path)
        answered.append(got is not None)
        return _json(got[1]) if got is not None and got[0] == 200 else None

    async def _ask(self, view: EngineView, now: float) -> None:
        try:
            await self._identify(view, now)
        except asyncio.CancelledError:
            raise
        except Exception:  # an answer of a shape nobody foresaw: asked again at the next probe
            log.exception("engine %s: asking what it is failed", view.name)

    async def _identify(self, view: EngineView, now: float) -> None:
        answered: list[bool] = []
        info = await self._json_get(view, "/server_info?config_format=json", answered)
        if not _is_sglang(info):
            older = await self._json_get(view, "/get_server_info", answered)
            info = older if _is_sglang(older) else info
        sglang = _is_sglang(info)
        version = None if sglang else await self._json_get(view, "/version", answered)
        model_info = await self._json_get(view, "/model_info", answered) if sglang else None
        models = await self._json_get(view, "/v1/models", answered)
        if not any(answered):
            return  # gone again: asked again at the next probe that finds it up
        found = identity_of(info, version, models, model_info)
        changed = found != view.identity() or view.name not in self._identified
        for key, value in found.items():
            setattr(view, key, value)
        view.health_path = "/ready" if view.kind == "sglang" else "/health"
        view.identified_at = now
        self._identified.add(view.name)
        self._to_ask.discard(view.name)
        if changed:
            self._write("identity", view, upstream=view.upstream, **found)
            log.info("engine %s is %s %s, model %s", view.name, view.kind, view.version or "(no version)",
                     view.model or "(none)")
        refine = self._refine.pop(view.name, None)
        if refine is not None:
            await self._ready_from_process(view, *refine)

    def _went_up(self, view: EngineView, now: float) -> None:
        seen_down = view.down_since is not None
        view.up, view.ready_at, view.detail = True, round(now, 3), None
        self._to_ask.add(view.name)  # its last identity stays shown until it has answered again
        if seen_down:
            view.restarts += 1 if view.last_up_at is not None else 0
            view.time_to_ready_s, view.ready_from = round(now - float(view.down_since or now), 3), "down_seen"
            self._refine[view.name] = (now, view.last_up_at)
        view.down_since = None
        self._write("up", view, ready_at=view.ready_at, seen_down=seen_down, time_to_ready_s=view.time_to_ready_s,
                    ready_from=view.ready_from if seen_down else None)
        log.info("engine %s is up%s", view.name,
                 f" (ready {view.time_to_ready_s:.1f} s after the proxy saw it down)" if seen_down else "")

    def _went_down(self, view: EngineView, now: float, detail: str | None) -> None:
        view.up, view.down_since, view.detail = False, round(now, 3), detail
        view.time_to_ready_s = view.ready_from = None
        job = self._jobs.pop(view.name, None)
        if job is not None:
            job.cancel()  # what it would learn is of the engine that just went away
        self._refine.pop(view.name, None)
        self._write("down", view, detail=detail)
        log.warning("engine %s is down: %s", view.name, detail)

    async def _ready_from_process(self, view: EngineView, ready: float, last_up: float | None) -> None:
        got = await self.get(view, "/metrics")
        m = _START.search(got[1]) if got is not None and got[0] == 200 else None
        if m is None:
            return
        started = float(m.group(1))
        if not started <= ready or (last_up is not None and started <= last_up) or view.ready_at != round(ready, 3):
            return  # the process is older than the last time it was up: no start of ours to time
        view.time_to_ready_s, view.ready_from = round(ready - started, 3), "process_start"
        self._write("ready", view, time_to_ready_s=view.time_to_ready_s, ready_from="process_start",
                    process_start=started)

    def _write(self, event: str, view: EngineView | None, **fields: Any) -> None:
        if self._log is None:
            return
        now = time.time()
        line: dict[str, Any] = {"event": event, "run_id": self.run_id, "time": iso(now, ms=True), "unix": round(now, 3)}
        if view is not None:
            line["engine"] = view.name
        try:
            self._log.write({**line, **fields})
        except (OSError, ValueError) as exc:  # a full disk must not stop the watch
            log.warning("%s: %s", self.config.records_dir / LOG_NAME, exc)
