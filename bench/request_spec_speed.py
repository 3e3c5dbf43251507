"""How long reading a request takes on the proxy's event loop: RequestSpec.from_body against a
full json.loads / orjson.loads of the same body, and inject_usage (SPEC 13).

    python bench/request_spec_speed.py [--repeat 7]

Prints the best of ``--repeat`` runs per body, in milliseconds.  Speed is measured here, never
asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import random
import string
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.core.request import RequestSpec  # noqa: E402
from exporter.core.usage import inject_usage  # noqa: E402

try:
    import orjson
except ImportError:  # pragma: no cover
    orjson = None  # type: ignore[assignment]


def bodies() -> dict[str, bytes]:
    rng = random.Random(1)
    mib20 = 20 << 20
    plain = "".join(rng.choice(string.ascii_letters + " .,\n") for _ in range(1 << 16)) * (mib20 >> 16)
    code = 'print("x", {"a": [1, 2]})\\n ' * (mib20 // 28)
    tail = {"max_tokens": 128, "ignore_eos": True, "stream": True}
    tool = {"type": "function", "function": {"name": "f", "description": "Get the weather.", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}}
    deep = b"[" * 500 + b"]" * 500
    return {
        "1 KiB completions": json.dumps({"model": "m", "prompt": plain[:900], **tail}).encode(),
        "20 MiB prompt, plain text": json.dumps({"model": "m", "prompt": plain, **tail}).encode(),
        "20 MiB prompt, code (quotes)": json.dumps({"model": "m", "prompt": code, **tail}).encode(),
        "20 MiB prompt, all quotes": json.dumps({"model": "m", "prompt": '"' * mib20, **tail}).encode(),
        "20 MiB prompt, all backslashes": json.dumps({"model": "m", "prompt": "\\" * mib20, **tail}).encode(),
        "20 MiB chat, 2,000 messages": json.dumps({"model": "m", "messages": [
            {"role": "user", "content": plain[i * 10_000:(i + 1) * 10_000]} for i in range(2000)], **tail}).encode(),
        "20 MiB chat of code, 2,000": json.dumps({"model": "m", "messages": [
            {"role": "user", "content": code[i * 10_000:(i + 1) * 10_000]} for i in range(2000)], **tail}).encode(),
        "128k token ids": json.dumps({"model": "m", "prompt": [rng.randrange(150_000) for _ in range(128_000)],
                                      **tail}).encode(),
        "20 MiB tools (95k tools)": json.dumps({"model": "m", "tools": [tool] * 95_000, **tail}).encode(),
        "20 MiB nesting 500 deep": b'{"x": [' + b",".join([deep] * 20_000) + b"], " + json.dumps(tail)[1:].encode(),
        "20 MiB of top-level members": b"{" + b'"a":[],' * 3_000_000 + json.dumps(tail)[1:].encode(),
    }


def best_ms(fn: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    repeat = ap.parse_args().repeat
    print(f"{'body':<31} {'bytes':>11} {'from_body':>10} {'json.loads':>11} {'orjson':>9} {'inject':>9}  ms, best of {repeat}")
    for name, body in bodies().items():
        spec = RequestSpec.from_body(body)
        assert spec.stream and spec.expected_tokens == 128, spec
        no_usage = RequestSpec(stream=True)
        row = [best_ms(lambda body=body: RequestSpec.from_body(body), repeat),
               best_ms(lambda body=body: json.loads(body), repeat),
               best_ms(lambda body=body: orjson.loads(body), repeat) if orjson else float("nan"),
               best_ms(lambda body=body, spec=no_usage: inject_usage(body, spec), repeat)]
        print(f"{name:<31} {len(body):>11,} " + " ".join(f"{v:>10.3f}" for v in row))


if __name__ == "__main__":
    main()
