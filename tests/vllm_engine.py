"""A real vLLM (the CPU build) for the tests: the product's harness (``exporter/harness/real_vllm.py``,
shared with the benchmarks; the tiny model is ``exporter/harness/tiny_model.py``'s), and what
only pytest needs of it: :func:`require_vllm`.
"""

from __future__ import annotations

from exporter.harness.real_engine import start_proxy
from exporter.harness.real_vllm import (
    INSTALL_SCRIPT,
    MAX_MODEL_LEN,
    VLLM_ENV,
    VllmServer,
    bench_serve,
    bench_serve_argv,
    build_model,
    venv_dir,
    vllm_bin,
    vllm_missing,
)

from tests.helpers import skip_or_fail

__all__ = ["INSTALL_SCRIPT", "MAX_MODEL_LEN", "VLLM_ENV", "venv_dir", "vllm_bin", "vllm_missing", "require_vllm",
           "build_model", "VllmServer", "bench_serve_argv", "bench_serve", "start_proxy"]


def require_vllm() -> None:
    """Skip without a working vLLM venv, unless CI demands one (LLMBENCH_REQUIRE_VLLM=1)."""
    skip_or_fail(vllm_missing(), "LLMBENCH_REQUIRE_VLLM")
