#!/usr/bin/env bash
# A real SGLang (0.5.23 from PyPI, run on the CPU) in its own venv, for tests/e2e/test_sglang_real.py.
# Cached: a venv whose SGLang already imports, with the stand-in below, is reused.
# Prints the venv's path and how long it took.
#
#   LLMBENCH_SGLANG_VENV   where the venv lives (default /tmp/llmbench-sglang-venv)
#
# - SGLang's own pins pull CUDA-only packages, so its runtime packages come first from
#   .ci/sglang-requirements.txt (versions seen working together on these machines), then
#   sglang itself with --no-deps.
# - PyPI has no CPU build of SGLang's kernel library, sgl_kernel (the GPU wheels link libcuda).
#   With SGLANG_USE_CPU_ENGINE=1 SGLang only imports a few names from it at start-up, used by
#   speculative decoding and KV-cache moves, which a plain server never calls.  An import-only
#   stand-in is written into the venv: any name it is asked for is a function that raises
#   NotImplementedError; it registers no torch ops, so SGLang finds no CPU kernels and runs
#   every layer on its plain-torch path.  Everything the proxy talks to stays real: the HTTP
#   server, the tokenizer, scheduler and detokenizer processes, SSE and usage, /metrics.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${LLMBENCH_SGLANG_VENV:-/tmp/llmbench-sglang-venv}"
version=0.5.23
export PIP_DISABLE_PIP_VERSION_CHECK=1 SGLANG_USE_CPU_ENGINE=1 HF_HUB_OFFLINE=1
start=$(date +%s)

stand_in() {
  local site
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  mkdir -p "$site/sgl_kernel"
  cat > "$site/sgl_kernel/__init__.py" <<'EOF'
"""An import-only stand-in for SGLang's kernel library (written by llm-bench-exporter's
.ci/install-sglang.sh): PyPI has no CPU build of it.  Every name is a function that raises
NotImplementedError when called; no torch op is registered."""

__version__ = "0.0.0+llmbench.stand.in"


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name}: not in llm-bench-exporter's CPU stand-in")

    missing.__name__ = missing.__qualname__ = name
    return missing
EOF
}

works() {
  [ -x "$venv/bin/python" ] || return 1
  [ -f "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/sgl_kernel/__init__.py" ] || return 1
  timeout 300 "$venv/bin/python" - "$version" >/dev/null 2>&1 <<'EOF'
import sys
from importlib.metadata import version
assert version("sglang") == sys.argv[1], version("sglang")
import sgl_kernel, sglang.launch_server, sglang.bench_serving  # noqa: E401,F401
EOF
}

if works; then
  echo "sglang venv $venv: cached, $(( $(date +%s) - start )) s to check"
  exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv"
timeout 1800 "$venv/bin/pip" install -q -r .ci/sglang-requirements.txt
timeout 600 "$venv/bin/pip" install -q --no-deps "sglang==$version"
stand_in
works || { echo "sglang venv $venv: installed, but \`import sglang.launch_server\` fails" >&2; exit 1; }
echo "sglang venv $venv: sglang $version installed in $(( $(date +%s) - start )) s ($(du -sh "$venv" | cut -f1))"
