"""Run by AIPerf's venv's Python (``.ci/install-aiperf.sh``), not by pytest: AIPerf's own
``mooncake_trace`` loader reads a trace, as ``aiperf profile --custom-dataset-type mooncake_trace
--input-file TRACE --isl-block-size N --tokenizer DIR`` would, with no engine.

    python tests/aiperf_read_trace.py TRACE TOKENIZER_DIR BLOCK_SIZE

Prints one JSON object: ``loader`` (the loader class AIPerf picked), ``traces`` (each line as AIPerf's
``MooncakeTrace`` model parsed it) and ``turns`` (the requests AIPerf built from them: timestamp,
max_tokens, its conversation's session id and its delay, the prompt's token ids by AIPerf's tokenizer; a
multi-turn trace's lines also give ``session_id`` and ``delay`` as AIPerf parsed them).  Imports only the standard library and
AIPerf: this venv has no ``exporter``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path


def main(trace: str, tokenizer: str, block_size: int) -> None:
    from aiperf.cli_runner import _make_benchmark_run
    from aiperf.common import random_generator
    from aiperf.common.tokenizer import Tokenizer
    from aiperf.config.flags.cli_config import CLIConfig
    from aiperf.config.flags.converter import convert_cli_to_aiperf
    from aiperf.config.loader.plan import build_benchmark_plan
    from aiperf.dataset.composer.custom import CustomDatasetComposer

    cli = CLIConfig(model_names=["tiny"], urls=["http://127.0.0.1:9"], input_file=trace,
                    custom_dataset_type="mooncake_trace", prompt_input_tokens_block_size=block_size,
                    tokenizer=tokenizer)
    plan = build_benchmark_plan(convert_cli_to_aiperf(cli))
    run = _make_benchmark_run(plan.configs[0], artifact_dir=Path(tempfile.mkdtemp()))
    random_generator.init(1)
    tok = Tokenizer.from_pretrained(tokenizer)
    composer = CustomDatasetComposer(run=run, tokenizer=tok)
    conversations = composer.create_dataset()
    loader = composer.loader
    assert loader is not None
    parsed = [t for traces in loader.load_dataset().values() for t in traces]
    out = {
        "loader": type(loader).__name__,
        "block_size": plan.configs[0].datasets[0].block_size,
        "traces": [{"timestamp": t.timestamp, "input_length": t.input_length, "output_length": t.output_length,
                    "hash_ids": t.hash_ids, "session_id": t.session_id, "delay": t.delay} for t in parsed],
        "turns": [{"timestamp": turn.timestamp, "max_tokens": turn.max_tokens, "session_id": c.session_id,
                   "delay": turn.delay, "ids": tok.encode(turn.texts[0].contents[0])}
                  for c in conversations for turn in c.turns],
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
