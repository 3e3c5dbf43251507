#!/usr/bin/env bash
# A real AIPerf (from PyPI) in its own venv, for tests/e2e/test_aiperf_trace.py: AIPerf's own
# mooncake_trace loader reads a trace that `evidence trace` wrote.  Cached: a venv whose AIPerf
# already imports is reused.  Prints the venv's path and how long it took.
#
#   LLMBENCH_AIPERF_VENV   where the venv lives (default /tmp/llmbench-aiperf-venv)
set -euo pipefail
venv="${LLMBENCH_AIPERF_VENV:-/tmp/llmbench-aiperf-venv}"
version=0.13.0
export PIP_DISABLE_PIP_VERSION_CHECK=1
start=$(date +%s)

works() {
  [ -x "$venv/bin/python" ] || return 1
  timeout 300 "$venv/bin/python" -c \
    'import importlib.metadata as m, sys; import aiperf.dataset; sys.exit(m.version("aiperf") != sys.argv[1])' \
    "$version" >/dev/null 2>&1
}

if works; then
  echo "aiperf venv $venv: cached, $(( $(date +%s) - start )) s to check"
  exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv"
timeout 1800 "$venv/bin/pip" install -q "aiperf==$version"
works || { echo "aiperf venv $venv: installed, but \`import aiperf.dataset\` fails" >&2; exit 1; }
echo "aiperf venv $venv: aiperf $version installed in $(( $(date +%s) - start )) s"
