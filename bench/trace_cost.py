"""What the trace capture (config ``trace``) costs per request at 24K input tokens, and whether the
event loop feels it.

A byte-level BPE of 8,192 tokens is trained here on the standard library's source (no model can be
downloaded), or ``--tokenizer PATH`` names a model's; the prompt is other source cut to 24,576 tokens.  Per request (completions and chat):
CPU seconds of the whole capture (JSON parse, chat template, tokenizing, block hashing), wall time,
and the hashing alone.  Then the loop: the largest delay of a 1 ms ticker on an asyncio loop while
32 such prompts are tokenized in the proxy's trace thread, beside the same ticker with nothing else.

    python bench/trace_cost.py [--requests 20] [--block-size 512]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sysconfig
import tempfile
import time
from pathlib import Path

from exporter.proxy.config import Trace
from exporter.proxy.trace import Tracer, block_hashes, run_key

TARGET = 24_576


def build(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = [p.read_text(encoding="utf-8", errors="ignore") for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:120]]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=8192, special_tokens=["<unk>", "<s>", "</s>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    tok.save(str(out / "tokenizer.json"))
    template = "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}<|assistant|>\n"
    (out / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                                           "chat_template": template}))


def prompt_of(tracer: Tracer) -> str:
    text = "\n".join(p.read_text(encoding="utf-8", errors="ignore")
                     for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[-60:])
    offsets = tracer.tokenizer._tok.encode(text, add_special_tokens=False).offsets
    return text[: offsets[TARGET - 1][1]]  # TARGET tokens


def per_request(tracer: Tracer, body: bytes, chat: bool, n: int) -> tuple[float, float, int]:
    cpu, wall = [], []
    for _ in range(n):
        c, w = time.process_time(), time.perf_counter()
        traced = tracer.trace(body, chat)
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return statistics.median(cpu), statistics.median(wall), traced.prefix_tokens or 0


async def worst_tick(tracer: Tracer | None, body: bytes, seconds: float = 3.0) -> float:
    """The largest delay of a 1 ms ticker while 32 prompts are traced (or none)."""
    futures = [tracer.submit(body, False) for _ in range(32)] if tracer is not None else []
    worst, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end and (not futures or not all(f.done() for f in futures)):
        t = time.perf_counter()
        await asyncio.sleep(0.001)
        worst = max(worst, time.perf_counter() - t - 0.001)
    await asyncio.gather(*futures)
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--block-size", type=int, default=512)
    ap.add_argument("--tokenizer", type=Path, help="a model's tokenizer (default: one trained here)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.tokenizer is None:
            build(Path(tmp))
        tracer = Tracer(Trace(tokenizer=args.tokenizer or Path(tmp), block_size=args.block_size), "bench")
        prompt = prompt_of(tracer)
        for chat in (False, True):
            doc = {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
            body = json.dumps({**doc, "max_tokens": 128, "stream": True}).encode()
            cpu, wall, n = per_request(tracer, body, chat, args.requests)
            print(f"{'chat' if chat else 'completions':11} {n:6d} tokens: capture {cpu * 1e3:6.1f} ms CPU, "
                  f"{wall * 1e3:6.1f} ms wall per request (median of {args.requests})")
        ids = list(range(n))
        t = time.process_time()
        for _ in range(100):
            block_hashes(ids, args.block_size, run_key("bench"))
        print(f"hashing alone: {(time.process_time() - t) * 10:.2f} ms CPU per request")
        body = json.dumps({"prompt": prompt, "max_tokens": 128}).encode()
        idle = asyncio.run(worst_tick(None, body))
        busy = asyncio.run(worst_tick(tracer, body))
        print(f"loop: worst 1 ms tick late by {idle * 1e3:.1f} ms idle, {busy * 1e3:.1f} ms while 32 prompts are "
              "traced in the trace thread")
        tracer.close()


if __name__ == "__main__":
    main()
