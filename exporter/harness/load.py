"""The load driver: closed-loop (concurrency) and open-loop (Poisson rate) benchmark rounds.

It judges every response with :mod:`exporter.core.analysis`, the same core the proxy uses, so
the driver and the proxy agree on TTFT, TPOT, E2E and success.  Each request carries
``X-Bench-Scenario``, ``X-Bench-Round`` and ``X-Request-Id``; before each round the driver
announces the scenario to the proxy (``POST /-/scenario``) when the base URL goes through
one, so the boards can show scenario windows; a run that ends mid-round (interrupted, or an
error) clears what it announced on its way out (:meth:`Driver.clear_announcement`).  A request
the proxy answers itself (HTTP 502/504 for an engine it could not reach) keeps the proxy's
verdict beside the client's: ``proxy_reason`` (``connect_error``, ``timeout``, ...).

Every record also says when the request was due and how late it went out (``intended_start_unix``,
``schedule_lag_s``): open loop, an absolute Poisson schedule from the round's start or a replayed trace's
timestamps (:mod:`.replay`); closed loop, when its worker was free.  Open-loop records add
``e2e_from_intended_s``, the E2E from when the request was due (what coordinated omission hides).
A prompt is ``input_tokens`` words, or with the engine's tokenizer exactly that many of its tokens
(:meth:`.replay.Replays.prompt`); the summary keeps, per cell, the prompt length the engine counted
beside the asked one (:func:`.tables.add_prompt_lengths`).  The command line is :mod:`.load_cli`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from exporter.core.analysis import REASONS, RequestSpec, StreamAnalyzer
from exporter.core.content import is_event_stream
from exporter.proxy.records import JsonlWriter
from exporter.proxy.wire.errors import transport_reason

from .announce import post_scenario
from .endpoints import PATHS, endpoint_body
from .plan import WARMUP, Cell, Plan, PlanError, Stage, load_plan
from .preflight import check_base_url, check_proxy_scenarios
from .progress import Progress
from .replay import Prompts, Replays
from .runner import run_plan
from .sessions import Turn, replay_sessions, run_sessions
from .tables import add_prompt_lengths, write_tables

if TYPE_CHECKING:
    from exporter.proxy.prompttokens import PromptTokenizer

__all__ = ["Cell", "Stage", "Plan", "PlanError", "Driver", "load_plan", "make_prompt", "proxy_verdict", "PROMPT_WORDS"]

_VOCAB = (
    "time person year way day thing man world life hand part child eye woman place work week case "
    "point government company number group problem fact water room mother area money story month "
    "lot right study book job word business issue side kind head house service friend father power "
    "hour game line end member law car city community name president team minute idea kid body "
    "information back parent face others level office door health art war history party result "
    "change morning reason research girl guy moment air teacher force education"
).split()


PROMPT_WORDS = tuple(_VOCAB)  # the words of the driver's prompts (sim_vocab's model tokenizer names them)


def make_prompt(rng: random.Random, words: int) -> str:
    """``words`` random words: exactly ``words`` tokens for the simulated engines."""
    return " ".join(rng.choice(_VOCAB) for _ in range(words))


class Driver:
    """Sends benchmark requests to one OpenAI base URL and keeps their records."""

    def __init__(self, base_url: str, out_dir: Path | None = None, *, model: str | None = None,
                 seed: int = 0, label: str | None = None, timeout_s: float = 3600.0,
                 check_url: bool = False, progress_stream: TextIO | None = None,
                 progress_clock: Callable[[], float] = time.monotonic,
                 clock: Callable[[], float] = time.monotonic,
                 connector: Callable[[], aiohttp.BaseConnector] | None = None,
                 tokenizer: PromptTokenizer | None = None, endpoint: str = "completions") -> None:
        self.base_url = base_url.rstrip("/")
        self.endpoint = endpoint  # load --endpoint (chat: or a cell's chat); :mod:`.endpoints`
        parts = urlsplit(self.base_url)
        segs = [s for s in parts.path.split("/") if s]
        self.engine = segs[-1] if segs else None
        root_path = "/".join(segs[:-1])
        self.proxy_root = urlunsplit((parts.scheme, parts.netloc, "/" + root_path if root_path else "", "", ""))
        self.label = label or self.engine or parts.netloc
        self.model = model
        self.rng = random.Random(seed)  # the prompts' words
        #: the prompts (:mod:`.replay`), framed to the engine's exact lengths with its tokenizer (``load --tokenizer``)
        self.replays = Replays(seed, make_prompt, _VOCAB, tokenizer)
        self.arrivals = random.Random(f"arrivals-{seed}")  # the Poisson gaps, apart from the prompts
        self.out_dir = out_dir
        self.records = JsonlWriter(out_dir / "requests.jsonl") if out_dir else None
        self.timeout_s = timeout_s
        self.session: aiohttp.ClientSession | None = None
        self.first_error: str | None = None  # "reason: detail" of the first failed request
        self.check_url = check_url  # check the base URL before the first request (the CLI does)
        self.progress_stream = progress_stream  # None: stderr
        self.progress_clock = progress_clock
        #: the requests' stamps and the schedule's (a test runs the driver on a virtual clock,
        #: the event loop's, and over a connector of its own)
        self.clock = clock
        self._connector = connector or (lambda: aiohttp.TCPConnector(limit=0))
        self._progress: Progress | None = None  # the running cell's
        self._announced = False  # a scenario announced to the proxy and not cleared yet
        self.cleared: str | None = None  # how the last announcement was cleared at the end (a line)

    async def __aenter__(self) -> Driver:
        self.session = aiohttp.ClientSession(
            connector=self._connector(), auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=self.timeout_s, connect=10),
        )
        try:
            if self.check_url:
                await self.preflight()
            elif self.model is None:
                self.model = await self._discover_model()
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.session is not None:
            await self.clear_announcement()  # interrupted (SIGINT, SIGTERM) or failed mid-round
            await self.session.close()
        if self.records is not None:
            self.records.close()

    async def preflight(self) -> None:
        """Check the base URL before the first request (a UserError tells what is wrong);
        take the model name from its /v1/models when none was given."""
        assert self.session is not None
        found = await check_base_url(self.session, self.base_url)
        if self.model is None:
            self.model = found or "default"

    async def _discover_model(self) -> str:
        assert self.session is not None
        try:
            async with self.session.get(f"{self.base_url}/v1/models") as r:
                doc = await r.json(content_type=None)
                return str(doc["data"][0]["id"])
        except (aiohttp.ClientError, ValueError, KeyError, IndexError, TypeError, TimeoutError):
            return "default"

    async def check_scenarios(self, names: list[str]) -> None:
        """Refuse (UserError) to run when the proxy would record any of ``names`` as ``other``;
        the base URL must then be the proxy's ``http://HOST:PORT/<engine>``."""
        assert self.session is not None
        await check_proxy_scenarios(self.session, self.proxy_root, self.engine, names)

    def write_to(self, out_dir: Path) -> None:
        """Keep the records and tables in ``out_dir`` from now on (the CLI sets it once its
        checks have passed, so that a refused run leaves the directory as it was)."""
        if self.records is not None:
            self.records.close()
        self.out_dir = out_dir
        self.records = JsonlWriter(out_dir / "requests.jsonl")

    def direct(self) -> None:
        """The base URL is an engine itself: no proxy to announce rounds to."""
        self.engine = None

    async def announce(self, scenario: str | None, round_: int, cell: dict[str, Any] | None = None) -> None:
        """Tell the proxy which scenario round is running, and what its cell is (input and output
        tokens, concurrency or rate, the stage: ``evidence report`` pivots by them); a direct engine
        ignores this."""
        if self.engine is None or self.session is None:
            return
        if scenario is not None:
            self._announced = True  # from now on, even if the answer is lost
        body: dict[str, Any] = {"scenario": scenario, "round": round_, "engine": self.engine}
        if cell is not None:
            body["cell"] = cell
        status = await post_scenario(self.session, self.proxy_root, body, self.progress_stream)
        if scenario is None and status == 200:
            self._announced = False

    async def clear_announcement(self) -> None:
        """Clear the scenario this driver announced and did not clear (a run interrupted mid-round),
        so that the next client's requests are not labelled with it; :attr:`cleared` says how it went."""
        if not self._announced or self.engine is None or self.session is None or self.session.closed:
            return
        await self.announce(None, 0)
        self.cleared = ("the scenario it announced is cleared" if not self._announced else
                        f"could not clear the scenario it announced: POST {self.proxy_root}/-/scenario "
                        f"{{\"scenario\": null, \"engine\": \"{self.engine}\"}} by hand")

    def body(self, cell: Cell, given: tuple[str, int] | None = None) -> dict[str, Any]:
        """A request of ``cell`` (its prompt: :meth:`.replay.Replays.prompt`), or ``given`` (prompt, max_tokens) by a trace."""
        prompt, max_tokens = given if given is not None else (
            self.replays.prompt(self.rng, cell.input_tokens, cell.chat), cell.output_tokens)
        return endpoint_body("chat" if cell.chat else self.endpoint, self.model, prompt, max_tokens)

    async def one(self, cell: Cell, scenario: str, round_: int, due: Due | None = None,
                  open_loop: bool = False, turn: Turn | None = None,
                  given: tuple[str, int] | None = None) -> dict[str, Any]:
        """Send one request; return its record, judged by the shared core.  ``due``: when it
        was meant to go out (the schedule's time, open loop; its worker free, closed loop);
        ``turn``: a session's turn (:mod:`.sessions`), its body, headers and answer."""
        assert self.session is not None
        body = json.dumps(self.body(cell, given) if turn is None else turn.body).encode()
        endpoint = "chat" if cell.chat or turn is not None else self.endpoint
        spec = RequestSpec.from_body(body, endpoint)
        rid = uuid.uuid4().hex
        path = PATHS[endpoint]
        headers = {"Content-Type": "application/json", "X-Bench-Scenario": scenario,
                   "X-Bench-Round": str(round_), "X-Request-Id": rid, **(turn.headers if turn else {})}
        wall = time.time()
        t0 = self.clock()
        analyzer: StreamAnalyzer | None = None
        proxy_id = None
        error = detail = None
        refused = bytearray()  # the start of a non-200 body: the proxy says its own verdict there
        try:
            async with self.session.post(self.base_url + path, data=body, headers=headers) as resp:
                proxy_id = resp.headers.get("X-LLMBench-Request-Id")
                streaming = is_event_stream(resp.headers.get("Content-Type"), spec.stream)
                analyzer = StreamAnalyzer(t0, resp.status, spec, streaming=streaming)
                async for chunk in resp.content.iter_any():
                    analyzer.feed(chunk, self.clock())
                    if turn is not None:
                        turn.answer.feed(chunk)
                    if resp.status != 200 and len(refused) < _ERROR_BODY:
                        refused += chunk[:_ERROR_BODY - len(refused)]
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            error = transport_reason(exc)
            detail = (f"no complete response within {self.timeout_s} s" if error == "timeout"
                      else f"{type(exc).__name__}: {exc}")
        if analyzer is None:
            analyzer = StreamAnalyzer(t0, None, spec, streaming=True)
        result = analyzer.finish(self.clock(), error, detail)
        record = {"id": rid, "proxy_id": proxy_id, "engine": self.label, "scenario": scenario,
                  "round": round_, **(turn.fields if turn else {}), "start_unix": round(wall, 6), **result.as_dict(),
                  **_schedule(wall, t0, due, result.e2e_s, open_loop)}
        said = proxy_verdict(result.status, bytes(refused)) if result.reason == "http_status" else None
        if said is not None:  # the proxy answered for an engine it could not use: its record's reason
            record["proxy_reason"], message = said
            record["detail"] = f"HTTP {result.status} from the proxy, whose record says {said[0]}: {message}"
        if self.records is not None:
            self.records.write(record)
        if self.first_error is None and result.outcome != "success":
            self.first_error = (f"{said[0]}: {said[1]} (the proxy's record; HTTP {result.status} here)" if said else
                                f"{result.reason}: {result.detail}" if result.detail else str(result.reason))
        return record

    @contextlib.asynccontextmanager
    async def showing(self, label: str, planned: int, warmup: int = 0) -> AsyncIterator[Progress]:
        """Progress of ``planned`` requests on stderr while the block runs (see
        :mod:`exporter.harness.progress`), a line at least every 10 s off a terminal."""
        progress = Progress(f"{self.label} {label}", planned, stream=self.progress_stream,
                            clock=self.progress_clock, warmup=warmup)
        outer, self._progress = self._progress, progress

        async def beat() -> None:
            while True:
                await asyncio.sleep(1.0)
                progress.heartbeat()

        task = asyncio.create_task(beat())
        try:
            yield progress
        finally:
            task.cancel()
            progress.close()
            self._progress = outer

    async def run_round(self, cell: Cell, scenario: str, round_: int, n: int) -> tuple[list[dict[str, Any]], float]:
        """``n`` requests at the cell's load level; returns (records, duration in seconds)."""
        if self._progress is None:  # a round run on its own, not within a plan's cell
            async with self.showing(f"{scenario}#{round_}", n) as progress:
                return await self._round(cell, scenario, round_, n, progress)
        self._progress.warming = scenario == WARMUP  # counted apart: the tables leave warm-ups out
        self._progress.stage = "warm-up" if scenario == WARMUP else f"round {round_}/{cell.rounds}"
        return await self._round(cell, scenario, round_, n, self._progress)

    async def _round(self, cell: Cell, scenario: str, round_: int, n: int,
                     progress: Progress) -> tuple[list[dict[str, Any]], float]:
        records: list[dict[str, Any]] = []
        traced = [] if cell.trace is None else self.replays.lines(cell.trace)[:n]
        sessions = cell.trace is not None and self.replays.has_sessions(cell.trace, n) and scenario != WARMUP
        prompts = None if cell.trace is None else self.replays.prompts(  # read and framed before the clock starts
            cell.trace, cell.chat or sessions, cell.block_size, f"{scenario}/{round_}")
        self.replays.ready(cell.chat, cell.sessions is not None, cell.trace)  # a plan cell's framing, before it too
        wall0, start = time.time(), self.clock()  # one anchor: the due times keep their spacing
        open_loop = cell.concurrency is None  # Poisson arrivals, or a trace's own

        async def send(at: float, given: tuple[str, int] | None = None) -> None:
            rec = await self.one(cell, scenario, round_, Due(at, wall0 + (at - start)), open_loop, given=given)
            records.append(rec)
            progress.tick(rec["outcome"] == "success")

        async def send_turn(turn: Turn, ready: float) -> dict[str, Any]:  # a session cell's (:mod:`.sessions`)
            rec = await self.one(cell, scenario, round_, Due(ready, wall0 + (ready - start)), turn=turn)
            progress.tick(rec["outcome"] == "success")
            return rec

        if sessions and prompts is not None:  # a trace with sessions (AIPerf's multi-turn lines), as sessions
            records = await replay_sessions(traced, prompts.text, round_, cell.speedup, send_turn, self.model,
                                            self.clock, start)
            return records, self.clock() - start
        if cell.sessions is not None and scenario != WARMUP:  # warm-ups are single chat requests
            records = await run_sessions(cell, round_, send_turn, lambda k: self.replays.words(self.rng, k), self.model,
                                         self.clock)
            return records, self.clock() - start
        if cell.concurrency is not None:
            remaining = iter(range(n))

            async def worker() -> None:
                ready = start  # a closed loop's request is due when its worker is free
                for _ in remaining:
                    await send(ready)
                    ready = self.clock()

            await asyncio.gather(*(worker() for _ in range(min(cell.concurrency, n))))
        else:
            tasks = []
            for i, (at, given) in enumerate(self._arrivals(cell, n, start, prompts)):
                if i:  # an absolute schedule: a late send does not push back the next
                    await asyncio.sleep(max(0.0, at - self.clock()))
                tasks.append(asyncio.create_task(send(at, given)))
            await asyncio.gather(*tasks)
        return records, self.clock() - start

    def _arrivals(self, cell: Cell, n: int, start: float,
                  prompts: Prompts | None) -> Iterator[tuple[float, tuple[str, int] | None]]:
        """When each open-loop request is due: Poisson arrivals at the cell's rate, or a trace's own
        timestamps over ``speedup``, each with its prompt and max_tokens (:mod:`.replay`)."""
        if cell.trace is None or prompts is None:
            assert cell.rate is not None
            at = start
            for i in range(n):
                at += self.arrivals.expovariate(cell.rate) if i else 0.0
                yield at, None
            return
        for i, line in enumerate(self.replays.lines(cell.trace)[:n]):
            yield start + line.offset_s / cell.speedup, (prompts.text(line, i), line.output_length)

    async def run_plan(self, plan: Plan) -> dict[str, Any]:
        """Every stage in order (see :mod:`exporter.harness.runner`); writes the tables to
        ``out_dir`` when there is one and returns the summary."""
        summary = await run_plan(self, plan)
        summary["first_error"] = self.first_error
        add_prompt_lengths(summary, self.replays.asked, self.replays.tokenizer is not None)
        if self.out_dir is not None:
            write_tables(self.out_dir, summary)
        return summary


#: bytes of a non-200 body kept to read the proxy's verdict from
_ERROR_BODY = 4096
#: the proxy's error ``type`` for a timed-out upstream, and the record's reason for it
_PROXY_TYPES = {"upstream_timeout": "timeout"}


def proxy_verdict(status: int | None, body: bytes) -> tuple[str, str] | None:
    """(reason, message) of a proxy's JSON error answer (``{"error": {"type": REASON, "message": ...}}``,
    HTTP 502 or 504 for an engine it could not reach), where its type is a failure reason of the
    records (``connect_error``, ``timeout``, ...); None for any other answer."""
    if status not in (502, 504) or not body:
        return None
    try:
        doc = json.loads(body)
        kind, message = doc["error"]["type"], doc["error"].get("message") or ""
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    reason = _PROXY_TYPES.get(str(kind), str(kind))
    return (reason, str(message)[:200]) if reason in REASONS and reason != "http_status" else None


@dataclass(frozen=True, slots=True)
class Due:
    """When a request was meant to go out: monotonic seconds, and the same instant in unix time."""

    monotonic: float
    unix: float


def _schedule(wall: float, t0: float, due: Due | None, e2e_s: float | None, open_loop: bool) -> dict[str, Any]:
    """The load driver's own schedule: when the request was due, how late it went out, and
    (open loop) its E2E counted from when it was due, the coordinated-omission view."""
    lag = max(0.0, t0 - due.monotonic) if due is not None else 0.0
    from_intended = e2e_s + lag if open_loop and e2e_s is not None else None
    return {"intended_start_unix": round(due.unix if due is not None else wall, 6), "schedule_lag_s": round(lag, 6),
            "e2e_from_intended_s": None if from_intended is None else round(from_intended, 6)}
