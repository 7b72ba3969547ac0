#!/usr/bin/env bash
# The digits demo end to end on the `local` target: install, train, deploy, gate.
#   bash examples/digits/run.sh [extra edgekit deploy options]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bash "$ROOT/.ci/install.sh"
cd "$ROOT"
A=examples/digits/artifacts
[ -f "$A/model.pt2" ] || .venv/bin/python examples/digits/train.py --out "$A"
exec .venv/bin/edgekit deploy "$A/model.pt2" --target local \
  --eval-data "$A/eval.npz" --calib-data "$A/calib.npz" \
  --recipe examples/digits/recipe.yaml --out examples/digits/out "$@"
