#!/usr/bin/env bash
# CI: llama.cpp as a language-model runtime (edgekit/llm/llama_cpp.py, export_gguf.py, the agent's llama.cpp
# decoder). llama-cpp-python 0.3.36 ships as source only and vendors llama.cpp: this step builds llama.cpp from
# that sdist once (CPU, Release, -march=native; libllama/libggml*, llama-quantize, llama-bench, llama-perplexity,
# llama-imatrix; a few minutes on 2 cores) into ~/.cache/edgekit/llama.cpp/<version>-<arch>/, outside the clone,
# and installs the Python binding into .venv from the same sdist without a second native build
# (CMAKE_ARGS=-DLLAMA_BUILD=OFF; the binding loads the cached libllama.so through LLAMA_CPP_LIB_PATH).
# Idempotent: a complete cached build and an installed binding make it a few seconds.
# EDGEKIT_LLAMACPP_INSTALL_ONLY=1: install only; otherwise the `llamacpp`-marked tests run after it, and every
# one of them must run (a missing build must not pass as green).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
[ -x "$PY" ] || bash .ci/install.sh

# a compiler and cmake: from Debian when missing and this is root (CI machines are), else say what to install
need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
{ command -v g++ >/dev/null 2>&1 || command -v c++ >/dev/null 2>&1; } || need+=(build-essential)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "llama.cpp step: apt-get install ${need[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "llama.cpp step: needs ${need[*]} (apt-get install ${need[*]}, or pip install cmake)"; exit 1
  fi
fi

t0=$(date +%s)
"$PY" -m edgekit.llm.llama_cpp "$@"
echo "llama.cpp step: ready in $(( $(date +%s) - t0 )) s"

[ "${EDGEKIT_LLAMACPP_INSTALL_ONLY:-0}" = 1 ] && exit 0
# the arm64 twin's test cross-builds llama.cpp for the Pi 5 (~100 s cold, cached beside the host build) unless the
# background build in .ci/run did (`--board rpi5`), and provisions it on the twin (~40 s)
exec bash .ci/pytest_step.sh llamacpp "llamacpp" -p no:cacheprovider tests/unit/test_llm_llamacpp.py \
  tests/integration/test_llamacpp_arm64.py
