"""A records directory for the report's tests: two engines, two shapes at two concurrencies with
three rounds each, a rate cell, a calibration cell and warm-ups, an empty 200 and a client abort;
the cells announced as ``load`` announces them (``scenarios.jsonl`` lines with ``cell``), the rate
and calibration cells left to a plan file."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

RUN = "20260101T000000Z-abcdef"
T0 = 1_767_225_600.0
#: scenario -> (input, output, concurrency, rate, stage, rounds, requests a round)
CELLS: dict[str, tuple[int, int, int | None, float | None, str, int, int]] = {
    "short-c1": (1024, 128, 1, None, "core", 3, 4),
    "short-c4": (1024, 128, 4, None, "core", 3, 8),
    "long-c4": (8192, 128, 4, None, "core", 3, 8),
    "steady-r2": (1024, 128, None, 2.0, "rate-sweep", 2, 10),
    "probe": (1024, 128, 2, None, "calibration", 1, 5),
}
PLAN = """
stages:
  - name: rate-sweep
    cells:
      - {scenario: steady-r2, input_tokens: 1024, output_tokens: 128, rate: 2.0, requests: 10, rounds: 2}
  - name: calibration
    cells:
      - {scenario: probe, input_tokens: 1024, output_tokens: 128, concurrency: 2, requests: 5}
"""

def _record(rid: str, engine: str, scenario: str, rnd: int, t: float, rng: random.Random,
            reason: str | None = None) -> dict[str, Any]:
    ok = reason is None
    ttft = rng.uniform(0.05, 0.9) * (2.0 if engine == "vllm" else 1.0)
    tpot = rng.uniform(0.008, 0.03)
    aborted = reason == "client_abort"
    return {"id": rid, "run_id": RUN, "engine": engine, "scenario": scenario, "round": rnd, "start_unix": t,
            "outcome": "success" if ok else ("client_abort" if aborted else "failure"), "reason": reason,
            "detail": None, "status": 200, "ttft_s": ttft if ok else None, "tpot_s": tpot if ok else None,
            "e2e_s": ttft + 127 * tpot, "prompt_tokens": 1024, "completion_tokens": None if aborted else 128,
            "expected_tokens": 128, "visible_chars": 0 if reason == "empty_text" else 700, "done": not aborted,
            "timing_uncertainty_s": 0.0005, "slo": {"ttft_s": 3.0, "tpot_s": 0.05}, "client_backpressure_s": 0.0,
            "client_bound": False, "capture": None, "capture_sha256": None}


def _failure(engine: str, scenario: str, rnd: int, i: int) -> str | None:
    if (engine, scenario, rnd, i) == ("vllm", "short-c4", 2, 3):
        return "empty_text"
    if (engine, scenario, rnd, i) == ("sglang", "long-c4", 1, 0):
        return "client_abort"
    return None


def _engine_records(engine: str, t: float, rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float]:
    records, announced = [], []
    for scenario, (inp, out, conc, _rate, stage, rounds, n) in CELLS.items():
        for i in range(2):  # warm-up
            records.append(_record(f"{engine}-w-{scenario}-{i}", engine, "warmup", 0, t, rng))
            t += 0.5
        for rnd in range(1, rounds + 1):
            line: dict[str, Any] = {"run_id": RUN, "unix": t - 0.01, "engines": [engine], "scenario": scenario,
                                    "requested": scenario, "round": rnd}
            if stage == "core":  # load announces its cells; the others are the plan's
                line["cell"] = {"input_tokens": inp, "output_tokens": out, "concurrency": conc, "stage": stage}
            announced.append(line)
            for i in range(n):
                records.append(_record(f"{engine}-{scenario}-{rnd}-{i}", engine, scenario, rnd, t, rng,
                                       _failure(engine, scenario, rnd, i)))
                t += 0.3
            t += 5.0
    return records, announced, t


def write_records(d: Path) -> Path:
    """The records directory ``d`` (made), with engines.jsonl and scenarios.jsonl."""
    rng = random.Random(7)
    d.mkdir(parents=True)
    records, lines, t = [], [], T0
    for engine in ("sglang", "vllm"):
        recs, announced, t = _engine_records(engine, t, rng)
        records += recs
        lines += announced
    (d / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (d / "scenarios.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    ident = [{"event": "start", "run_id": RUN, "unix": T0 - 60, "proxy": {"version": "0.1.0", "config_sha256": "ab" * 32},
              "engines": [{"name": "sglang"}, {"name": "vllm"}]}]
    for engine in ("sglang", "vllm"):
        ident.append({"event": "identity", "run_id": RUN, "engine": engine, "unix": T0 - 59, "kind": engine,
                      "version": "9.9.9", "model": "m", "root": "/w/m", "max_model_len": 4096,
                      "server_args": {"tp_size": 1, "hf_token": "<redacted>"},
                      "upstream": "http://127.0.0.1:1"})
    (d / "engines.jsonl").write_text("".join(json.dumps(x) + "\n" for x in ident))
    return d
