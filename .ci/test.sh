#!/usr/bin/env bash
# The README's test command: installs what the tests need, then runs the default test suite
# (everything but the slow, emulated-arm64, ExecuTorch and litert-torch tests, which .ci/run runs in their
# own steps).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/.ci/install.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m pytest -m "not slow and not emu and not executorch and not litert_torch" -q "$@"
