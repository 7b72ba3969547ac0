#!/usr/bin/env bash
# The README's test command: installs what the tests need, then runs the default test suite
# (everything but the slow, emulated-arm64, ExecuTorch, litert-torch and llama.cpp tests, which .ci/run runs in
# their own steps, and the GPU tests, which need a CUDA machine) on two pytest-xdist workers, then the `serial`
# tests alone (.ci/pytest_step.sh; set EDGEKIT_TEST_WORKERS=1 for one process). Extra arguments go to pytest (e.g. a test file).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/.ci/install.sh"
exec bash "$ROOT/.ci/pytest_step.sh" default "not slow and not emu and not executorch and not litert_torch and not llamacpp and not gpu" "$@"
