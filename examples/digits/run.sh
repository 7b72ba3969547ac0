#!/usr/bin/env bash
# The digits demo end to end on the `local` target: install, train, deploy, gate. No recipe: the short
# search measures fp32 and the target's likeliest winners and ships the one the device proved fastest
# inside the tolerance to examples/digits/out/ship/ (add --recipe examples/digits/recipe.yaml to
# measure the recipe's fixed variants instead).
#   bash examples/digits/run.sh [extra edgekit deploy options]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bash "$ROOT/.ci/install.sh"
cd "$ROOT"
A=examples/digits/artifacts
[ -f "$A/model.pt2" ] || .venv/bin/python examples/digits/train.py --out "$A"
exec .venv/bin/edgekit deploy "$A/model.pt2" --target local \
  --eval-data "$A/eval.npz" --calib-data "$A/calib.npz" --out examples/digits/out "$@"
