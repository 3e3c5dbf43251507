"""``serve``: a supervisor and N worker processes that share the listen socket.

* The supervisor binds the listen socket (a busy port is one clear line, before anything
  starts), then forks N workers that accept on it.  Each worker is the whole measuring proxy
  on its own event loop; the kernel hands each new connection to one of them.
* Metric values live in prometheus_client's multiprocess files (a directory of its own for
  this run).  ``GET /metrics`` on any worker is forwarded over a unix socket to the
  supervisor, which merges every worker's files and renders them: the scrape costs the
  workers' event loops a socket copy, not a render (that was 33 ms of held GIL with
  2 engines x 10 scenarios configured).  This holds for ``--workers 1`` too.
* The GPU collector runs once, in the supervisor.  The scenario state is shared
  (:mod:`exporter.proxy.shared`).  Records: every worker appends whole lines to the same
  ``requests.jsonl`` (one ``write(2)`` per line on an ``O_APPEND`` descriptor).
* Workers die with the supervisor (``PR_SET_PDEATHSIG``): a SIGKILL of ``serve`` stops the
  proxy as a whole.  If a worker dies, the supervisor stops the rest and exits 1.
* SIGTERM (or SIGINT) to the supervisor is a graceful stop (:mod:`exporter.proxy.drain`): it passes
  the signal on, each worker refuses new engine requests and drains its own, and says so on the
  supervisor's socket; the supervisor, which renders every scrape, waits for each scraper's last
  reads, then tells the workers to exit (SIGUSR1) and exits 0.  A second signal stops at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import glob
import logging
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .children import Children, describe_exit
from .config import Config, parse_listen
from .drain import Drained, ScrapeLog, drain_workers, drained_handler, tracked
from .snapshot import final_snapshot, restore, snapshot_forever

__all__ = ["run_supervised", "worker_app", "supervisor_registry", "render_forever"]

log = logging.getLogger("llmbench")

#: on SIGTERM, requests in flight get this long to finish; the rest are recorded as
#: ``proxy_error`` ("the proxy shut down while the request was in flight")
SHUTDOWN_GRACE_S = 5.0
#: the listening socket's queue of connections not yet accepted (a round's burst of new clients)
LISTEN_BACKLOG = 4096
_RUN_PREFIX = "llmbench-serve-"
#: the supervisor's CPU priority, below the workers': a worker woken by a socket preempts a
#: /metrics render at once (the workers are forked before this is set)
SUPERVISOR_NICE = 10


def _run_dir() -> Path:
    """A fresh directory for this run's multiprocess files; those of dead runs are removed."""
    tmp = Path(tempfile.gettempdir())
    for old in tmp.glob(f"{_RUN_PREFIX}*-*"):
        pid = old.name[len(_RUN_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{_RUN_PREFIX}{os.getpid()}-"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    sock.setblocking(False)
    return sock


def _die_with_parent(parent: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols: libc's, no ldconfig run
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the supervisor died before the line above
        os._exit(1)


def _event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed: less of the loop's own work per request and per read."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _worker_main(config: Config, sock: socket.socket, index: int, count: int, run_dir: Path, parent: int,
                 run_id: str) -> None:
    """One worker: the proxy app on the inherited socket, values in the multiprocess files."""
    _die_with_parent(parent)
    os.setpgid(0, 0)  # a signal to serve's process group (Ctrl-C, killpg) reaches the supervisor only
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)
    from .valuefiles import use_multiprocess_values

    use_multiprocess_values()  # before any metric is made

    app = worker_app(config, index, count, run_dir, run_id)
    app.on_startup.append(_freeze_startup_objects)
    loop = _event_loop()
    drain = _drain_once(app, index)
    for sig in (signal.SIGINT, signal.SIGTERM):  # the supervisor's drain: this worker's requests
        loop.add_signal_handler(sig, drain)
    loop.add_signal_handler(signal.SIGUSR1, _stop_once())  # the supervisor's "exit now"
    from .wire.server import run_app

    run_app(app, sock, loop, backlog=LISTEN_BACKLOG, shutdown_timeout=1.0)


def _drain_once(app: Any, index: int) -> Callable[[], None]:
    """The handler of SIGTERM and SIGINT: the first drains this worker's requests (new ones refused) and
    tells the supervisor once they are all finished; any later one is ignored."""
    tasks: list[asyncio.Task[None]] = []

    def drain() -> None:
        if not tasks:
            tasks.append(asyncio.get_running_loop().create_task(_drain_worker(app, index)))

    return drain


async def _drain_worker(app: Any, index: int) -> None:
    import aiohttp

    from .state import METRICS_SESSION, STATE

    await app[STATE].drain_requests()
    with contextlib.suppress(aiohttp.ClientError, OSError):  # a supervisor gone stops this worker anyway
        async with app[METRICS_SESSION].post(f"http://supervisor/-/drained?worker={index}") as resp:
            await resp.read()


def _stop_once() -> Callable[[], None]:
    """The handler of SIGUSR1, the supervisor's "exit now": the first starts the shutdown; any later one is
    ignored (the handlers stay, so no signal ever meets the default action), so a second signal (a
    service manager that signals every process of the group, a Ctrl-C beside the supervisor's
    SIGTERM) cannot break the shutdown that writes the last records.  The supervisor SIGKILLs a
    worker that outlives its stop timeout."""
    from aiohttp.web import GracefulExit

    stopping = False

    def stop() -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            raise GracefulExit()

    return stop


def worker_app(config: Config, index: int, count: int, run_dir: Path, run_id: str) -> Any:
    """Worker ``index`` of ``count``'s proxy app: shared scenario state, /metrics from the
    supervisor's socket in ``run_dir``, the ``run_id`` of this ``serve`` start."""
    from prometheus_client import CollectorRegistry

    from .app import create_app
    from .shared import SharedScenarios
    from .state import STATE, Worker

    worker = Worker(str(index) if count > 1 else None, run_dir / "metrics.sock",
                    SharedScenarios(run_dir / "scenarios.state"), run_id)
    app = create_app(config.model_copy(update={"gpu": "off"}), CollectorRegistry(), worker)
    app[STATE].shutdown_grace_s = SHUTDOWN_GRACE_S
    app.on_startup.append(_warm_up)  # after the upstream pool exists, before the first request
    return app


async def _warm_up(app: Any) -> None:
    from .state import STATE
    from .warmup import warm_up

    state = app[STATE]
    assert state.pool is not None
    await warm_up(state.config, state.pool)


def supervisor_registry(run_dir: Path, shared: Any = None) -> Any:
    """The registry the supervisor renders: every worker's values merged, and the scenario
    info and round gauges from the shared scenario state (``shared``, else opened here)."""
    from prometheus_client import CollectorRegistry

    from .merge import MergedValues
    from .shared import ScenarioInfoCollector, SharedScenarios

    registry = CollectorRegistry()
    registry.register(MergedValues(run_dir))
    registry.register(ScenarioInfoCollector(shared or SharedScenarios(run_dir / "scenarios.state")))
    return registry


async def _freeze_startup_objects(app: object) -> None:
    """Keep the garbage collector off what lives as long as the process (the metric series,
    config, modules: ~57k objects with 2 engines x 10 scenarios).  A full collection over
    them took 33 ms, a stall of the loop and of every timestamp taken behind it."""
    gc.collect()
    gc.freeze()


def _in_flight(run_dir: Path) -> float:
    """All workers' requests in flight (the simulated GPUs follow it)."""
    from prometheus_client.multiprocess import MultiProcessCollector

    files = glob.glob(str(run_dir / "gauge_livesum_*.db"))
    return float(sum(s.value for m in MultiProcessCollector.merge(files) for s in m.samples
                     if s.name == "llmbench_requests_in_flight"))


async def render_forever(config: Config, run_dir: Path, stop: asyncio.Event, nice: int = SUPERVISOR_NICE,
                         run_id: str | None = None, drain: tuple[ScrapeLog, Drained] | None = None) -> None:
    """The supervisor's /metrics on a unix socket until ``stop``: every worker's values,
    merged; the process then runs at ``nice``.  The engine watch runs here, once for all the
    workers (its ``engines.jsonl`` names ``run_id``); the workers forward ``GET /-/engines``.
    ``drain``: where the complete scrapes and the workers' drains are entered."""
    from aiohttp import web

    from .engines import EngineWatch
    from .exposition import metrics_handler, render
    from .gpu import GpuCollector, make_source, poll_forever
    from .metrics import EngineCollector, ProxyInfoCollector
    from .shared import SharedScenarios
    from .shown import ShownSeries, shown_handler
    from .wire.upstream import Pool

    shared = SharedScenarios(run_dir / "scenarios.state")
    registry = supervisor_registry(run_dir, shared)
    watch = EngineWatch(config, run_id)
    registry.register(EngineCollector(watch.rows))
    registry.register(ProxyInfoCollector(watch.proxy))
    tasks = []
    source = make_source(config.gpu, lambda: _in_flight(run_dir))
    if source is not None:
        tasks.append(asyncio.create_task(poll_forever(source, GpuCollector(registry), config.gpu_interval_s)))
    scrapes = drain[0] if drain is not None else ScrapeLog()
    shown = ShownSeries(registry, shared.active_pairs, scrapes.answered)
    app = web.Application()
    app.router.add_get("/metrics", tracked(metrics_handler(shown), scrapes))
    app.router.add_post("/-/shown", shown_handler(shown, scrapes))
    if drain is not None:
        app.router.add_post("/-/drained", drained_handler(drain[1]))
    app.router.add_get("/-/engines", _engines_handler(watch))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    # The first scrape costs what every later one does: imports, parsed file keys, the gzip
    # module are made now, before the socket exists (a worker is ready once it does).
    try:
        render(shown, "application/openmetrics-text; version=1.0.0", "gzip")
    except Exception as exc:  # best effort: a worker may be creating its value files right now
        log.debug("first /metrics render before serving: %s: %s", type(exc).__name__, exc)
    await web.UnixSite(runner, str(run_dir / "metrics.sock")).start()
    with contextlib.suppress(OSError):  # from now on the renderer yields the CPU to the workers
        os.nice(nice)
    pool = Pool(config.timeouts.connect_s)
    watch.start(pool)
    try:
        await stop.wait()
    finally:
        await watch.stop()
        pool.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if source is not None:
            source.close()
        await runner.cleanup()


def _engines_handler(watch: Any) -> Any:
    """``GET /-/engines`` on the supervisor's socket: what its engine watch found."""
    from aiohttp import web

    async def engines(request: Any) -> Any:
        return web.json_response(watch.snapshot())
    return engines


async def _supervise(config: Config, children: Children, run_dir: Path, run_id: str | None = None) -> int:
    """Render /metrics until SIGTERM/SIGINT or a worker's death; return the exit status.  The
    death is learnt as it happens (:class:`Children`), not polled for."""
    from prometheus_client.multiprocess import mark_process_dead

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    dead: list[int] = []

    def died(pid: int, code: int) -> None:
        log.error("worker %d (pid %d) exited (%s): stopping the proxy", children.index[pid], pid, describe_exit(code))
        mark_process_dead(pid, str(run_dir))
        dead.append(pid)
        stop.set()

    scrapes, drained = ScrapeLog(), Drained(children.index.values())
    draining: list[asyncio.Task[None]] = []

    def signalled() -> None:  # the first: a graceful stop; a second: at once
        if draining:
            stop.set()
        else:
            draining.append(loop.create_task(drain_workers(config, children, scrapes, drained, stop)))

    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, signalled)
    renderer = asyncio.create_task(render_forever(config, run_dir, stop, run_id=run_id, drain=(scrapes, drained)))
    snapshots = asyncio.create_task(snapshot_forever(config.records_dir, run_dir, run_id, stop))
    stopped = asyncio.create_task(stop.wait())
    children.on_exit(loop, died)
    try:
        await asyncio.wait((renderer, stopped), return_when=asyncio.FIRST_COMPLETED)
        if renderer.done():
            renderer.result()  # raise what stopped it
        await renderer
    finally:
        children.detach()
        stopped.cancel()
        for task in [*draining, snapshots]:
            task.cancel()
        for sig in signals:
            loop.remove_signal_handler(sig)
    return 1 if dead else 0


def run_supervised(config: Config, workers: int) -> int:
    """Bind, fork the workers, render /metrics until stopped; the exit status."""
    host, port = parse_listen(config.listen)
    sock = _bind(host, port)  # OSError: the caller prints one line
    run_dir = _run_dir()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(run_dir)
    from . import app, gpu, shared  # noqa: F401  imported once, before the fork: quicker starts
    from .shared import SharedScenarios
    from .state import new_run_id

    SharedScenarios.create(run_dir / "scenarios.state").close()
    run_id = new_run_id()  # one for every worker of this start
    log.info("%s", restore(config.records_dir, run_dir))  # before the first worker: its counts continue
    pids: dict[int, int] = {}
    children: Children | None = None
    parent = os.getpid()
    try:
        for index in range(workers):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - runs in the child
                code = 0
                try:
                    _worker_main(config, sock, index, workers, run_dir, parent, run_id)
                except KeyboardInterrupt:
                    pass
                except BaseException:
                    log.exception("worker %d failed", index)
                    code = 1
                finally:
                    os._exit(code)
            pids[pid] = index
        sock.close()
        children = Children(pids)  # its reaper threads start after the last fork
        log.info("proxy on http://%s:%d (%d worker%s), engines: %s", host, port, workers,
                 "s" if workers > 1 else "", ", ".join(f"{e.name} -> {e.display_url}" for e in config.engines))
        return _run(config, children, run_dir, run_id)
    finally:
        # SIGUSR1: the workers exit (after a drain, nothing is left in flight; else as aiohttp's shutdown allows)
        (children or Children(pids)).stop(SHUTDOWN_GRACE_S + 5.0, signal.SIGUSR1)
        final_snapshot(config.records_dir, run_dir, run_id)  # every worker gone: the counts as they ended
        shutil.rmtree(run_dir, ignore_errors=True)


def _run(config: Config, children: Children, run_dir: Path, run_id: str | None = None) -> int:
    loop = _event_loop()
    try:
        return loop.run_until_complete(_supervise(config, children, run_dir, run_id))
    finally:
        loop.close()
