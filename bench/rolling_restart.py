"""A rolling restart of N proxies under Poisson load: issue 39's evidence (SPEC 14 and 29).

    python bench/rolling_restart.py [--pods 8] [--seconds 65] [--rate 3] [--out DIR]

N simulated engine pods (half ``sim --profile vllm``, half ``--profile sglang``, interleaved, each
with empty 200s, HTTP 500s and missing usage injected by the simulator's fault flags), each with its
own ``serve`` (its own port and records directory; the engine has the same name on every proxy).
One Prometheus (``prometheus/remote-write/prometheus.yml``, the repo's jobs: the proxies under
``llmbench-exporter``) scrapes every proxy and engine each second and remote-writes to
VictoriaMetrics.  A client of this script's own sends Poisson arrivals (``--rate`` per proxy)
through every proxy for ``--seconds``, each request with an ``X-Request-Id`` of its own, and keeps
what each got: a status, the proxy's draining 503, or no answer (a transport error: the port closed
between a proxy's exit and its restart).  While the load flows each proxy in turn gets SIGTERM (to
its main process, as Kubernetes sends it) and is started again with the same config once it
exited: its stop time is SIGTERM to exit, its ready time the new process's start to
``/-/ready`` 200.  The load goes on until every proxy is back and has served a few more seconds.

Then, once Prometheus has scraped every proxy twice after the last answer, over the whole window:

* per engine x outcome x reason, the catalogue's restart-safe exact count
  (:func:`dashboards.catalogue.exact_count`) in Prometheus and in VictoriaMetrics, and what
  ``evidence export``'s exact-count panels show (from each backend): failures per reason from
  "Failures by reason", successes from "Success ratio" and those failures (the boards show no
  success count of their own; the ratio itself is checked against the records' to 1e-9) must equal
  the union of the proxies' records;
* no count series (``llmbench_requests_total``, per label set) ever decreases: the raw samples over
  the window in Prometheus and in VictoriaMetrics, Prometheus' range query at a 1 s step, and the
  export's "Failures by reason" series over its grid;
* every answered request (the client got a status other than the draining 503) has exactly one
  record (matched by ``client_request_id``), and no refused or unanswered request has one.

Prints the tables; exit status 1 when a check fails (2 when the stack could not be set up).  The
machine may be busy: every wait is on a condition with a deadline, none bounds a count.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import math
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dashboards.catalogue import MIXIN, exact_count, expand  # noqa: E402
from exporter.evidence.cli import main as evidence_main  # noqa: E402
from exporter.evidence.promapi import PromError, Prometheus  # noqa: E402
from exporter.harness.endpoints import PATHS, endpoint_body  # noqa: E402
from exporter.harness.load import make_prompt  # noqa: E402
from exporter.harness.stack import (  # noqa: E402
    REPO_FILES,
    Child,
    exporter_argv,
    free_port,
    render_prometheus_config,
    scrapes_since,
    start_prometheus,
    wait_for_scrapes,
    wait_http,
)

SCENARIO = "rolling"
INPUT_WORDS, OUTPUT_TOKENS = 32, 24
FAULTS = ["--fault-empty-text", "0.05", "--fault-http-500", "0.04", "--fault-missing-usage", "0.04"]
REQ = f"llmbench_requests_total{{{MIXIN.job_selector}}}"
LEAD_S, TAIL_S = 5.0, 5.0  # load before the first SIGTERM; load after the last proxy is ready again
STOP_DEADLINE_S = 90.0  # drain_timeout_s 30 + drain_scrape_timeout_s 15, with room
DRAIN_LINE = re.compile(r"drained in ([\d.]+) s; (?:the final counts were read by every scraper in ([\d.]+) s|(.*))")


@dataclass
class Pod:
    index: int
    engine: str
    sim_port: int
    port: int
    out: Path
    child: Child | None = None
    runs: int = 0
    sigterm_unix: float | None = None
    stop_s: float | None = None
    exit_code: int | None = None
    ready_s: float | None = None
    in_flight: int = 0
    drain: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def instance(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def records(self) -> Path:
        return self.out / f"records-{self.index}"

    @property
    def config(self) -> Path:
        return self.out / f"proxy-{self.index}.yaml"

    def start(self) -> float:
        self.runs += 1
        self.child = Child(f"proxy{self.index}.run{self.runs}", exporter_argv("serve", "--config", str(self.config)),
                           self.out / "logs")
        return time.monotonic()


@dataclass
class Sent:
    pod: int
    engine: str
    rid: str
    sent_unix: float
    status: int | None = None
    draining: bool = False  # the proxy's own 503 while it drains
    error: str | None = None

    @property
    def kind(self) -> str:
        if self.status is None:
            return "no answer"
        if self.status == 503 and self.draining:
            return "refused"
        return "answered"


@dataclass
class Site:
    out: Path
    pods: list[Pod] = field(default_factory=list)
    children: list[Child] = field(default_factory=list)
    prom_url: str = ""
    vm_url: str = ""

    def spawn(self, name: str, argv: list[str]) -> Child:
        child = Child(name, argv, self.out / "logs")
        self.children.append(child)
        return child


# -- the stack ----------------------------------------------------------------------------------------


def start_site(site: Site, pods: int) -> None:
    for i in range(1, pods + 1):
        engine = "vllm" if i % 2 else "sglang"
        site.pods.append(Pod(i, engine, free_port(), free_port(), site.out))
    sims = []
    for pod in site.pods:
        sims.append(site.spawn(f"sim{pod.index}-{pod.engine}", exporter_argv(
            "sim", "--profile", pod.engine, "--listen", f"127.0.0.1:{pod.sim_port}", "--speed", "1",
            "--seed", str(pod.index), *FAULTS)))
    for pod, sim in zip(site.pods, sims):
        wait_http(f"http://127.0.0.1:{pod.sim_port}/health", 60, sim)
    for pod in site.pods:
        pod.config.write_text(yaml.safe_dump({
            "listen": pod.instance, "engines": [{"name": pod.engine, "upstream": f"http://127.0.0.1:{pod.sim_port}"}],
            "scenarios": [SCENARIO], "records_dir": str(pod.records), "gpu": "off"}, sort_keys=False))
        pod.start()
    for pod in site.pods:
        assert pod.child is not None
        wait_http(f"{pod.url}/-/ready", 60, pod.child)

    vm_port = free_port()
    vm = site.spawn("victoria-metrics", [
        shutil.which("victoria-metrics") or "victoria-metrics", f"-httpListenAddr=127.0.0.1:{vm_port}",
        f"-storageDataPath={site.out / 'vm-data'}", "-search.latencyOffset=1s", "-search.disableCache"])
    site.vm_url = f"http://127.0.0.1:{vm_port}"
    wait_http(f"{site.vm_url}/health", 60, vm)

    prom_dir = site.out / "prometheus"
    config = render_prometheus_config({
        MIXIN.job: [p.instance for p in site.pods],
        **{e: [f"127.0.0.1:{p.sim_port}" for p in site.pods if p.engine == e] for e in ("vllm", "sglang")},
    }, prom_dir, template=REPO_FILES / "prometheus" / "remote-write" / "prometheus.yml", scrape_interval="1s")
    doc = yaml.safe_load(config.read_text(encoding="utf-8"))
    doc["remote_write"][0]["url"] = f"{site.vm_url}/api/v1/write"
    doc["remote_write"][0]["queue_config"]["batch_send_deadline"] = "1s"
    config.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    port = free_port()
    site.children.append(start_prometheus(config, prom_dir / "data", port, site.out / "logs"))
    site.prom_url = f"http://127.0.0.1:{port}"
    wait_for_scrapes(site.prom_url, 2 * pods, timeout_s=120)


def stop_site(site: Site) -> None:
    """The proxies first, all at once, while Prometheus still scrapes them (their drains end at once);
    then the rest."""
    live = [p.child for p in site.pods if p.child is not None and p.child.proc.poll() is None]
    for child in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    for child in live:
        with contextlib.suppress(Exception):
            child.proc.wait(max(0.1, deadline - time.monotonic()))
        child.stop(5)
    for child in reversed(site.children):
        child.stop(10)


# -- the load and the restarts --------------------------------------------------------------------------


async def send(session: aiohttp.ClientSession, pod: Pod, rng: random.Random, sent: list[Sent]) -> None:
    rid = f"p{pod.index}-{uuid.uuid4().hex}"
    s = Sent(pod.index, pod.engine, rid, time.time())
    sent.append(s)
    body = json.dumps(endpoint_body("completions", "sim-model", make_prompt(rng, INPUT_WORDS), OUTPUT_TOKENS))
    headers = {"Content-Type": "application/json", "X-Request-Id": rid, "X-Bench-Scenario": SCENARIO,
               "X-Bench-Round": "1"}
    try:
        async with session.post(f"{pod.url}/{pod.engine}{PATHS['completions']}", data=body, headers=headers) as resp:
            data = await resp.read()
            s.status = resp.status
            if resp.status == 503:
                with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
                    err = json.loads(data)["error"]
                    s.draining = err.get("type") == "unavailable" and "draining" in str(err.get("message"))
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        s.status = None
        s.error = type(exc).__name__


async def poisson(pod: Pod, rate: float, stop: asyncio.Event, sent: list[Sent], tasks: list[asyncio.Task[None]]) -> None:
    rng = random.Random(pod.index)
    gaps = random.Random(f"arrivals-{pod.index}")
    timeout = aiohttp.ClientTimeout(total=180, connect=10)
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout)
    try:
        at = time.monotonic()
        while not stop.is_set():
            tasks.append(asyncio.create_task(send(session, pod, rng, sent)))
            at += gaps.expovariate(rate)  # an absolute schedule: a late send does not push back the next
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, at - time.monotonic()))
        await asyncio.gather(*[t for t in tasks if not t.done()], return_exceptions=True)
    finally:
        await session.close()


async def ready(pod: Pod, started: float, session: aiohttp.ClientSession, deadline_s: float = 120.0) -> float:
    while time.monotonic() - started < deadline_s:
        assert pod.child is not None
        if pod.child.proc.poll() is not None:
            raise RuntimeError(f"proxy {pod.index} exited with {pod.child.proc.returncode}: {pod.child.log_path}")
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with session.get(f"{pod.url}/-/ready") as resp:
                if resp.status == 200:
                    return time.monotonic() - started
        await asyncio.sleep(0.02)
    raise TimeoutError(f"proxy {pod.index} not ready {deadline_s:.0f} s after its start")


async def roll(site: Site, seconds: float, sent: list[Sent]) -> None:
    """Each proxy in turn: SIGTERM, its exit, the same config started again, its /-/ready; spread over the
    load, never two at once."""
    n = len(site.pods)
    spacing = max(0.0, (seconds - LEAD_S - TAIL_S) / n)
    t0 = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=1, connect=1)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for k, pod in enumerate(site.pods):
            await asyncio.sleep(max(0.0, t0 + LEAD_S + k * spacing - time.monotonic()))
            assert pod.child is not None
            old = pod.child
            pod.sigterm_unix = time.time()
            pod.in_flight = sum(1 for s in sent if s.pod == pod.index and s.status is None and s.error is None)
            begun = time.monotonic()
            os.kill(old.proc.pid, signal.SIGTERM)
            while old.proc.poll() is None and time.monotonic() - begun < STOP_DEADLINE_S:
                await asyncio.sleep(0.01)
            pod.stop_s = time.monotonic() - begun
            if old.proc.poll() is None:
                old.stop(1)  # SIGKILL after a second SIGTERM: a failed graceful stop
            pod.exit_code = old.stop()
            pod.drain = drain_line(old.log_path)
            pod.ready_s = await ready(pod, pod.start(), session)


def drain_line(log: Path) -> str:
    for line in reversed(log.read_text(errors="replace").splitlines()):
        m = DRAIN_LINE.search(line)
        if m:
            return f"{m.group(1)} / {m.group(2)}" if m.group(2) else f"{m.group(1)} / WARN {m.group(3)[:60]}"
    return "-"


async def drive(site: Site, seconds: float, rate: float) -> list[Sent]:
    sent: list[Sent] = []
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    clients = [asyncio.create_task(poisson(p, rate, stop, sent, tasks)) for p in site.pods]
    t0 = time.monotonic()
    try:
        await roll(site, seconds, sent)
        await asyncio.sleep(max(TAIL_S, t0 + seconds - time.monotonic()))
    finally:
        stop.set()
        await asyncio.gather(*clients)
    return sent


# -- what the stores hold ----------------------------------------------------------------------------------


Key = tuple[str, str, str]  # engine, outcome, reason


def exact(api: Prometheus, start: float, end: float) -> dict[Key, float]:
    expr = f"sum by ({MIXIN.engine_label}, outcome, reason) ({expand(exact_count(REQ), range_s=end - start)})"
    out: dict[Key, float] = {}
    for s in api.query(expr, at=end):
        m, v = s["metric"], float(s["value"][1])
        if v:
            out[(m[MIXIN.engine_label], m["outcome"], m["reason"])] = v
    return out


def wait_vm(site: Site, start: float, end: float, timeout_s: float = 90.0) -> tuple[dict[Key, float], float]:
    """VictoriaMetrics' counts once they equal Prometheus' (remote_write batches), or at the deadline."""
    want = exact(Prometheus(site.prom_url), start, end)
    begun = time.monotonic()
    got: dict[Key, float] = {}
    while time.monotonic() - begun < timeout_s:
        with contextlib.suppress(PromError):
            got = exact(Prometheus(site.vm_url), start, end)
            if got == want:
                break
        time.sleep(0.5)
    return got, time.monotonic() - begun


def decreases(series: list[dict[str, Any]], what: str) -> list[str]:
    out = []
    for s in series:
        values = [(float(t), float(v)) for t, v in s.get("values", []) if v is not None and not math.isnan(float(v))]
        for (_, a), (t1, b) in zip(values, values[1:]):
            if b < a:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s["metric"].items()) if k not in ("__name__", "job"))
                out.append(f"{what}: {{{labels}}} {a:g} -> {b:g} at {t1:.0f}")
    return out


def export(url: str, start: float, end: float, out: Path) -> tuple[int, dict[str, Any], list[str]]:
    """``evidence export`` of the comparison board over the window, at the scrape interval's step (VictoriaMetrics
    reports none; its default, 15 s, would widen a short window's counts): its status, its exact-count panels'
    series (``{panel: [series]}``) and the warning lines it printed."""
    buf_out, buf_err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf_out), contextlib.redirect_stderr(buf_err):
        rc = evidence_main(["export", "--prometheus", url, "--window", f"{start:.0f},{end:.0f}", "--out", str(out),
                            "--boards", "comparison", "--step", "1"])
    (out.parent / f"{out.name}.log").write_text(buf_out.getvalue() + buf_err.getvalue())
    panels = {}
    for key in ("failures_by_reason", "success_ratio"):
        path = out / "data" / "comparison" / f"{key}.json"
        if path.exists():
            panels[key] = [s for q in json.loads(path.read_text())["queries"] for s in q["series"]]
    warnings = [line.strip() for line in (buf_out.getvalue() + buf_err.getvalue()).splitlines() if "warning" in line.lower()]
    return rc, panels, warnings


def export_counts(panels: dict[str, Any], end: float) -> tuple[dict[Key, float], dict[str, float]]:
    """Failures per engine and reason at the window's end; successes from the ratio and those failures."""
    counts: dict[Key, float] = {}
    ratios: dict[str, float] = {}
    for s in panels.get("failures_by_reason", []):
        at_end = {t: v for t, v in s["values"]}.get(end)
        if at_end:
            counts[(s["labels"][MIXIN.engine_label], "failure", s["labels"]["reason"])] = at_end
    for s in panels.get("success_ratio", []):
        at_end = {t: v for t, v in s["values"]}.get(end)
        if at_end is None:
            continue
        engine = s["labels"][MIXIN.engine_label]
        ratios[engine] = at_end
        failed = sum(v for k, v in counts.items() if k[0] == engine)
        if at_end < 1:
            counts[(engine, "success", "none")] = round(at_end * failed / (1 - at_end), 6)
    return counts, ratios


def export_decreases(panels: dict[str, Any], what: str) -> list[str]:
    return decreases([{"metric": s["labels"], "values": s["values"]} for s in panels.get("failures_by_reason", [])], what)


# -- the run ---------------------------------------------------------------------------------------------------


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{int(v)}" if float(v) == int(v) else f"{v:.3f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=8, help="engine pods, each with its own proxy (default 8; even)")
    ap.add_argument("--seconds", type=float, default=65.0, help="seconds of load at least (default 65)")
    ap.add_argument("--rate", type=float, default=3.0, help="Poisson arrivals per second per proxy (default 3)")
    ap.add_argument("--out", type=Path, help="working directory (default: a new one under /tmp, kept)")
    args = ap.parse_args()
    if args.pods < 2 or args.pods % 2:
        ap.error("--pods: an even number, at least 2")
    missing = [b for b in ("prometheus", "victoria-metrics") if shutil.which(b) is None]
    if missing:
        print(f"{', '.join(missing)} not installed (apt-get install -y --no-install-recommends prometheus "
              "victoria-metrics)", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="llmbench-rolling-"))
    out.mkdir(parents=True, exist_ok=True)
    site = Site(out)
    try:
        try:
            start_site(site, args.pods)
        except (RuntimeError, TimeoutError, OSError) as exc:
            print(f"the stack did not start: {exc} (logs: {out / 'logs'})", file=sys.stderr)
            return 2
        start = math.floor(time.time())
        t_load = time.monotonic()
        sent = asyncio.run(drive(site, args.seconds, args.rate))
        load_s = time.monotonic() - t_load
        done = time.time()
        # two complete scrapes of every proxy that began after the last answer: the window ends on the later
        end = math.ceil(max(scrapes_since(site.prom_url, p.instance, done, 2, timeout_s=90.0) for p in site.pods))
        time.sleep(max(0.0, end + 1.5 - time.time()))  # VictoriaMetrics hides the newest second
        return report(site, sent, start, end, load_s)
    finally:
        stop_site(site)
        print(f"\nworking directory (logs, records, exports): {out}")


def report(site: Site, sent: list[Sent], start: float, end: float, load_s: float) -> int:
    failed: list[str] = []
    prom, vm = Prometheus(site.prom_url), Prometheus(site.vm_url)
    records: list[dict[str, Any]] = []
    for pod in site.pods:
        path = pod.records / "requests.jsonl"
        records += [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []

    print(f"\nwindow {start:.0f}..{end:.0f} ({end - start:.0f} s), load {load_s:.1f} s, {len(site.pods)} proxies, "
          f"scrapes every 1 s, count_step {MIXIN.count_step}\n")
    print("proxy engine  SIGTERM(+s)  in flight  stop s  exit  ready s  drain s / last reads s  refused  no answer")
    by_pod: defaultdict[int, Counter[str]] = defaultdict(Counter)
    for s in sent:
        by_pod[s.pod][s.kind] += 1
    for pod in site.pods:
        print(f"{pod.index:>5} {pod.engine:<7} {'-' if pod.sigterm_unix is None else f'{pod.sigterm_unix - start:.1f}':>11}"
              f"  {pod.in_flight:>9}  {fmt(None if pod.stop_s is None else round(pod.stop_s, 3)):>6}  {fmt(pod.exit_code):>4}"
              f"  {fmt(None if pod.ready_s is None else round(pod.ready_s, 3)):>7}  {pod.drain:>22}"
              f"  {by_pod[pod.index]['refused']:>7}  {by_pod[pod.index]['no answer']:>9}")
        if pod.exit_code != 0 or pod.ready_s is None:
            failed.append(f"proxy {pod.index}: exit {pod.exit_code}, ready {pod.ready_s}")
    stops = [p.stop_s for p in site.pods if p.stop_s is not None]
    readies = [p.ready_s for p in site.pods if p.ready_s is not None]
    if stops and readies:
        print(f"stop: max {max(stops):.3f} s; ready: max {max(readies):.3f} s")

    want = Counter((r["engine"], r["outcome"], r.get("reason") or "none") for r in records)
    in_prom = exact(prom, start, end)
    in_vm, vm_wait = wait_vm(site, start, end)
    exports = {}
    for name, url in (("prom", site.prom_url), ("vm", site.vm_url)):
        rc, panels, warnings = export(url, start, end, site.out / f"export-{name}")
        counts, ratios = export_counts(panels, end)
        exports[name] = (rc, panels, warnings, counts, ratios)
        if rc != 0:
            failed.append(f"evidence export from {name}: status {rc}")
    print(f"\nper engine x outcome x reason (exact counts over the window; VictoriaMetrics caught up in {vm_wait:.1f} s;"
          " the export's success row is its success ratio times its failures over their complement)\n")
    print(f"{'engine':<7} {'outcome':<8} {'reason':<15} {'records':>8} {'prometheus':>10} {'victoria':>9} "
          f"{'export(prom)':>12} {'export(vm)':>10}")
    keys = sorted(set(want) | set(in_prom) | set(in_vm) | set(exports["prom"][3]) | set(exports["vm"][3]))
    for k in keys:
        row = [want.get(k, 0), in_prom.get(k, 0), in_vm.get(k, 0), exports["prom"][3].get(k), exports["vm"][3].get(k)]
        export_due = k[1] in ("success", "failure")  # the panels hold no client_abort count
        bad = len({row[0], row[1], row[2]}) > 1 or (export_due and (row[3] != row[0] or row[4] != row[0]))
        print(f"{k[0]:<7} {k[1]:<8} {k[2]:<15} {row[0]:>8} {fmt(row[1]):>10} {fmt(row[2]):>9} {fmt(row[3]):>12} "
              f"{fmt(row[4]):>10}{'  <- differs' if bad else ''}")
        if bad:
            failed.append(f"counts of {k}: records {row[0]}, prometheus {row[1]}, victoria {row[2]}, "
                          f"export {row[3]} / {row[4]}")
    print(f"{'total':<32} {sum(want.values()):>8} {fmt(sum(in_prom.values())):>10} {fmt(sum(in_vm.values())):>9}")
    for name in ("prom", "vm"):
        ratios = exports[name][4]
        for engine in sorted({r["engine"] for r in records}):
            ok = sum(v for k, v in want.items() if k[0] == engine and k[1] == "success")
            judged = sum(v for k, v in want.items() if k[0] == engine and k[1] != "client_abort")
            got = ratios.get(engine)
            if got is None or abs(got - ok / judged) > 1e-9:
                failed.append(f"export({name}) success ratio of {engine}: {got} against the records' {ok / judged}")
    for name in ("prom", "vm"):
        for w in exports[name][2]:
            print(f"export({name}) said: {w}")

    raw = f"{REQ}[{end - start:.0f}s]"
    found = (decreases(prom.query(raw, at=end), "prometheus raw")
             + decreases(prom.query_range(REQ, start, end, 1), "prometheus 1 s range query")
             + decreases(vm.query(raw, at=end), "victoria raw")
             + export_decreases(exports["prom"][1], "export(prom) failures_by_reason")
             + export_decreases(exports["vm"][1], "export(vm) failures_by_reason"))
    n_series = len(prom.query(raw, at=end))
    print(f"\ndecreases in {n_series} count series (raw samples in Prometheus and VictoriaMetrics, Prometheus' 1 s "
          f"range query, the exports' failures_by_reason): {len(found)}")
    for line in found[:40]:
        print(f"  {line}")
    if found:
        failed.append(f"{len(found)} decreases")

    kinds = Counter(s.kind for s in sent)
    by_rid = Counter(r.get("client_request_id") for r in records)
    answered = {s.rid for s in sent if s.kind == "answered"}
    refused = {s.rid for s in sent if s.kind == "refused"}
    unanswered = {s.rid for s in sent if s.kind == "no answer"}
    not_one = sorted(rid for rid in answered if by_rid[rid] != 1)
    refused_recorded = sorted(rid for rid in refused if by_rid[rid])
    unanswered_recorded = sorted(rid for rid in unanswered if by_rid[rid])
    strangers = sorted(str(rid) for rid in by_rid if rid not in answered | refused | unanswered)
    statuses = Counter(s.status for s in sent if s.kind == "answered")
    errors = Counter(s.error for s in sent if s.kind == "no answer")
    other_503 = sum(1 for s in sent if s.status == 503 and not s.draining)
    refused_counted = sum(float(s["value"][1]) for s in prom.query(
        f"sum({expand(exact_count(f'llmbench_requests_refused_total{{{MIXIN.job_selector}}}'), range_s=end - start)})",
        at=end))
    run_ids = prom.query(f"count by (instance) (count by (instance, run_id) "
                         f"(last_over_time(llmbench_proxy_info{{{MIXIN.job_selector}}}[{end - start:.0f}s])))", at=end)
    print(f"\nclients sent {len(sent)}: answered {kinds['answered']} (HTTP {dict(sorted(statuses.items()))}), "
          f"refused {kinds['refused']} (503 while draining; llmbench_requests_refused_total counted {refused_counted:g}), "
          f"no answer {kinds['no answer']} ({dict(errors)}); other 503s {other_503}")
    print(f"records {len(records)}; answered with exactly one record {len(answered) - len(not_one)} of {len(answered)}; "
          f"refused with a record {len(refused_recorded)}; unanswered with a record {len(unanswered_recorded)}; "
          f"records of no request sent {len(strangers)}")
    print("run ids per proxy (llmbench_proxy_info): "
          + ", ".join(f"{s['metric']['instance'].rpartition(':')[2]}={s['value'][1]}" for s in
                      sorted(run_ids, key=lambda s: s["metric"]["instance"])))
    for what, rids in (("answered without exactly one record", not_one), ("refused with a record", refused_recorded),
                       ("unanswered with a record", unanswered_recorded), ("records of no request sent", strangers)):
        if rids:
            failed.append(f"{len(rids)} {what}: {rids[:5]}")
    if other_503:
        failed.append(f"{other_503} 503s that were not the proxy's draining refusal")

    print("\nchecks: " + ("all passed" if not failed else f"{len(failed)} FAILED"))
    for line in failed:
        print(f"  FAILED {line}")
    (site.out / "sent.jsonl").write_text("".join(json.dumps(s.__dict__) + "\n" for s in sent))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
