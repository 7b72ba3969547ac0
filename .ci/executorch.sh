#!/usr/bin/env bash
# CI: the ExecuTorch runtime (edgekit/convert/torch_to_executorch.py, the agent's ExecuTorchRunner and its
# XNNPACK thread pool as a search dimension, the `executorch` extra). executorch 1.5.1 installs beside the
# main stack without changing any package in it (it adds pandas, hydra-core, omegaconf, ruamel.yaml,
# pytorch-tokenizers, ... and needs the torchao 0.18 and coremltools 9.0 already there; its binaries link the
# installed torch 2.13 and resolve every symbol), so it goes into the main venv. This step first asks pip what
# the extra would change and refuses if it would touch torch, onnx, onnxruntime, tensorflow, coremltools,
# torchao, numpy or pydantic (.ci/guard_extra.py); then it installs the extra and runs the ExecuTorch tests, failing if any is
# skipped (a missing runtime must not pass as green). Re-running is cheap: a stamp skips the install when
# pyproject.toml and this script are unchanged.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash .ci/install.sh
VENV="$ROOT/.venv"
STAMP="$VENV/.edgekit-executorch-stamp"
LOG="$VENV/.edgekit-executorch-install.log"
WANT="$(cat pyproject.toml .ci/executorch.sh | sha256sum | cut -d' ' -f1)"

if ! { [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; }; then
  t0=$(date +%s)
  : > "$LOG"
  "$VENV/bin/python" .ci/guard_extra.py executorch >>"$LOG" 2>&1 || { tail -5 "$LOG"; echo "executorch step: refused"; exit 1; }
  tail -1 "$LOG"
  "$VENV/bin/pip" install --disable-pip-version-check -e ".[executorch]" >>"$LOG" 2>&1 \
    || { tail -40 "$LOG"; echo "executorch step: pip install failed (log: $LOG)"; exit 1; }
  echo "executorch step: installed in $(( $(date +%s) - t0 )) s"
  echo "$WANT" > "$STAMP"
fi
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
from edgekit.convert.torch_to_executorch import available
assert available(), "executorch does not import in this venv"
print("executorch step: executorch", md.version("executorch"), "torch", md.version("torch"),
      "torchao", md.version("torchao"))
EOF

# test_executorch_arm64.py (emu, root): the host's .pte files on the arm64 twin's aarch64 runtime (torch 2.10.0 +
# executorch 1.1.0, provisioned from a ~214 MB wheelhouse cached in ~/.cache/edgekit); ~6 min. It and every
# other `executorch`-marked test run here, not in the earlier steps, which run before executorch is installed.
# every test marked `executorch` (unit, slow and emulated): the other steps deselect them. On two workers
# (.ci/pytest_step.sh), so the twin's file overlaps the others; JUnit in .ci-results/executorch*.xml.
exec bash .ci/pytest_step.sh executorch executorch "$@"
