#!/usr/bin/env bash
# CI's docs step (issue #38): build the site with warnings as errors (mkdocs build --strict: broken links and
# anchors, pages missing from the nav, docstrings mkdocstrings cannot read), then run every runnable code example of
# README.md and docs/**/*.md (.ci/docs_examples.py; docs/contributing-docs.md says which blocks run). Not --quiet:
# it hides the warnings from --strict, which then passes a broken link.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
SITE="${EDGEKIT_DOCS_SITE:-$(mktemp -d)/site}"
echo "== docs: mkdocs build --strict -> $SITE"
NO_MKDOCS_2_WARNING=1 "$PY" -m mkdocs build --strict --site-dir "$SITE"
# the examples use the digits demo's artifacts, as examples/digits/run.sh makes them
A=examples/digits/artifacts
[ -f "$A/model.pt2" ] || "$PY" examples/digits/train.py --out "$A"
echo "== docs: the examples"
exec "$PY" .ci/docs_examples.py "$@"
