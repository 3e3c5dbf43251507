"""A real SGLang (0.5.23, run on the CPU) for the tests: the product's harness
(``exporter/harness/real_sglang.py``; the tiny model is ``exporter/harness/tiny_model.py``'s), and
what only pytest needs of it: :func:`require_sglang`.
"""

from __future__ import annotations

from exporter.harness.real_sglang import (
    DETOKENIZER,
    INSTALL_SCRIPT,
    SCHEDULER,
    SGLANG_ENV,
    SglangServer,
    bench_serving,
    bench_serving_argv,
    build_model,
    sglang_bin,
    sglang_missing,
    venv_dir,
)

from tests.helpers import skip_or_fail

__all__ = ["INSTALL_SCRIPT", "SGLANG_ENV", "SCHEDULER", "DETOKENIZER", "venv_dir", "sglang_bin", "sglang_missing",
           "require_sglang", "build_model", "SglangServer", "bench_serving_argv", "bench_serving"]


def require_sglang() -> None:
    """Skip without a working SGLang venv, unless CI demands one (LLMBENCH_REQUIRE_SGLANG=1)."""
    skip_or_fail(sglang_missing(), "LLMBENCH_REQUIRE_SGLANG")
