#!/usr/bin/env bash
# CI: the direct PyTorch -> LiteRT route (edgekit/convert/torch_to_tflite.py, the `litert-torch` package).
# litert-torch cannot go into the main venv: it pins typing-extensions<4.13 (via xdsl), which drags pydantic
# down from what the rest of the stack installs. So it gets its own venv (default .venv-litert, or
# $EDGEKIT_LITERT_VENV) with edgekit, the TFLite extra and litert-torch, and this step runs the litert-torch
# tests there. It fails if they are skipped (a missing litert-torch must not pass as green).
# Re-running is cheap: a stamp skips the install when pyproject.toml and this script are unchanged (.ci/run
# installs it in the background during the slow step; this step then only runs the tests).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PY="${EDGEKIT_PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV="${EDGEKIT_LITERT_VENV:-$ROOT/.venv-litert}"
STAMP="$VENV/.edgekit-litert-stamp"
LOG="$VENV/.edgekit-litert-install.log"
WANT="$(cat pyproject.toml .ci/litert_torch.sh | sha256sum | cut -d' ' -f1)"

if ! { [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; }; then
  t0=$(date +%s)
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  : > "$LOG"
  pipi() { "$VENV/bin/pip" install --disable-pip-version-check "$@" >>"$LOG" 2>&1 || { tail -40 "$LOG"; echo "litert-torch step: pip install $* failed (log: $LOG)"; exit 1; }; }
  pipi --upgrade pip
  # the CPU build of torch first (a plain `torch` requirement pulls a multi-GB CUDA build)
  pipi "torch==2.13.0"
  pipi -e ".[tflite,dev,litert-torch]"
  echo "litert-torch step: installed in $(( $(date +%s) - t0 )) s"
  echo "$WANT" > "$STAMP"
fi
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
from edgekit.convert.torch_to_tflite import available
assert available(), "litert_torch does not import in this venv"
print("litert-torch step: litert-torch", md.version("litert-torch"), "torch", md.version("torch"),
      "ai-edge-litert", md.version("ai-edge-litert"))
EOF

# EDGEKIT_LITERT_INSTALL_ONLY=1: the venv only (.ci/run installs it in the background during the slow step)
[ "${EDGEKIT_LITERT_INSTALL_ONLY:-0}" = 1 ] && exit 0

# the litert-torch tests (marked `litert_torch`: the main run deselects them)
JUNIT="$VENV/litert-junit.xml"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -m litert_torch tests/integration/test_convert_matrix.py \
  --junitxml="$JUNIT" "$@"
"$VENV/bin/python" .ci/require_all_ran.py litert-torch "$JUNIT"
