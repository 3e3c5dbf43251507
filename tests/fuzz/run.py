"""Run the fuzz campaign of the measuring core for N seconds.

    python tests/fuzz/run.py --seconds 3600             # coverage-guided + grammar, side by side
    python tests/fuzz/run.py --seconds 60 --mode grammar --jobs 4
    python tests/fuzz/run.py --seconds 60 --mode mutate  # the fallback where atheris is missing

``coverage`` runs :func:`targets.check_bytes` under atheris (libFuzzer, coverage-guided) when
it is installed, else under ``mutate``: plain random mutation (bit flips, splices, inserted SSE
tokens) of a seed corpus.  ``grammar`` runs :func:`targets.check_generated`, the
structure-aware differential; ``requests`` runs :func:`targets.check_request_generated`, valid
request bodies in random spellings and encodings against ``json.loads``.  Findings (the failing input and the error) are written to
``--findings``; the executions of each part are printed at the end.  Exit status 1 when
anything was found.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

TOKENS = [b"data:", b"data: ", b"\n", b"\r\n", b"\r", b"\n\n", b":", b"[DONE]", b"event: error\n", b'{"choices":[',
          b'{"text":"a"}', b'"usage":{"prompt_tokens":1,"completion_tokens":18446744073709551616}', b"]}", b"[" * 600,
          b'{"error":{"message":', b"\xef\xbb\xbf", b"\xff", b'"delta":{"content":"x"}', b"}" * 3, b"x" * 300]


def seeds() -> list[bytes]:
    from tests.transcripts import CASES

    return [c.body for c in CASES]


def mutate(rng: random.Random, data: bytes, corpus: list[bytes]) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randrange(1, 6)):
        op = rng.randrange(5)
        pos = rng.randrange(len(buf) + 1)
        if op == 0 and buf:
            buf[min(pos, len(buf) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            buf[pos:pos] = rng.choice(TOKENS)
        elif op == 2 and buf:
            del buf[pos:pos + rng.randrange(1, 32)]
        elif op == 3:
            other = rng.choice(corpus)
            a = rng.randrange(len(other) + 1)
            buf[pos:pos] = other[a:a + rng.randrange(1, 200)]
        else:
            buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8)))
    return bytes(buf[:1 << 16])


def _record(findings: Path, kind: str, data: bytes) -> None:
    findings.mkdir(parents=True, exist_ok=True)
    name = f"{kind}-{os.getpid()}-{time.time_ns()}"
    (findings / f"{name}.bin").write_bytes(data)
    (findings / f"{name}.txt").write_text(traceback.format_exc())


def worker(mode: str, seconds: float, seed: int, findings: Path) -> tuple[int, int]:
    """(executions, findings) of one process running ``mode`` for ``seconds``."""
    from tests.fuzz import targets

    rng = random.Random(seed)
    corpus = seeds()
    end = time.monotonic() + seconds
    runs = found = 0
    while time.monotonic() < end:
        for _ in range(50):
            runs += 1
            if mode in ("grammar", "requests"):
                case = rng.getrandbits(64)
                check = targets.check_generated if mode == "grammar" else targets.check_request_generated
                try:
                    check(random.Random(case))
                except Exception:
                    found += 1
                    _record(findings, mode, str(case).encode())
            else:
                data = mutate(rng, rng.choice(corpus), corpus)
                try:
                    targets.check_bytes(data)
                except Exception:
                    found += 1
                    _record(findings, "mutate", data)
                else:
                    if rng.random() < 0.01 and len(corpus) < 5000:
                        corpus.append(data)
    return runs, found


def atheris_child(argv: list[str]) -> None:
    import atheris

    with atheris.instrument_imports():
        from tests.fuzz import targets
    atheris.Setup(argv, targets.check_bytes)
    atheris.Fuzz()


def run_atheris(seconds: int, findings: Path, jobs: int = 1) -> tuple[int, int]:
    """``jobs`` libFuzzer processes sharing one corpus directory; (executions, findings)."""
    corpus = HERE / "corpus"
    corpus.mkdir(exist_ok=True)
    for i, body in enumerate(seeds()):
        (corpus / f"seed-{i:03d}").write_bytes(body)
    findings.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, __file__, "--atheris-child", f"-max_total_time={seconds}", "-print_final_stats=1",
           "-max_len=65536", "-timeout=10", "-rss_limit_mb=2048", f"-artifact_prefix={findings}/", str(corpus)]
    logs = [findings.parent / f"atheris-{i}.log" for i in range(jobs)]
    procs = []
    for log in logs:
        with log.open("w") as out:
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT))
    codes = [p.wait() for p in procs]
    runs = 0
    for log in logs:
        found = re.search(r"stat::number_of_executed_units:\s*(\d+)", log.read_text(errors="replace"))
        runs += int(found.group(1)) if found else 0
    return runs, sum(1 for c in codes if c != 0)


def have_atheris() -> bool:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--atheris-child":
        atheris_child([sys.argv[0], *sys.argv[2:]])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--mode", choices=["both", "coverage", "grammar", "requests", "mutate"], default="both")
    ap.add_argument("--jobs", type=int, default=1, help="processes for the grammar and mutate parts")
    ap.add_argument("--atheris-jobs", type=int, default=1, help="libFuzzer processes for the coverage part")
    ap.add_argument("--findings", type=Path, default=HERE / "findings")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    coverage = args.mode in ("both", "coverage")
    use_atheris = coverage and have_atheris()
    pool_modes = (["grammar"] if args.mode in ("both", "grammar") else []) + (
        ["requests"] if args.mode in ("both", "requests") else []) + (
        ["mutate"] if args.mode == "mutate" or (coverage and not use_atheris) else [])
    jobs = [(m, args.seconds, seed + i, args.findings) for m in pool_modes for i in range(args.jobs)]
    with multiprocessing.get_context("spawn").Pool(max(1, len(jobs))) as pool:
        pending = pool.starmap_async(worker, jobs)
        atheris_result = run_atheris(args.seconds, args.findings, args.atheris_jobs) if use_atheris else None
        results = pending.get()
    total_found = 0
    print(f"seed {seed}, {args.seconds} s")
    for mode in pool_modes:
        runs = sum(r for (m, *_), (r, _) in zip(jobs, results) if m == mode)
        found = sum(f for (m, *_), (_, f) in zip(jobs, results) if m == mode)
        total_found += found
        print(f"{mode:>9}: {runs:>10,} executions, {found} findings")
    if atheris_result is not None:
        print(f"  atheris: {atheris_result[0]:>10,} executions, {atheris_result[1]} findings "
              f"(logs: {args.findings.parent}/atheris-*.log)")
        total_found += atheris_result[1]
    return 1 if total_found else 0


if __name__ == "__main__":
    sys.exit(main())
