#!/usr/bin/env bash
# One test step: `bash .ci/pytest_step.sh NAME MARKEXPR [pytest args...]`.
# The tests run on EDGEKIT_TEST_WORKERS pytest-xdist workers (default 2: one per core here), a file per
# worker at a time (--dist loadfile keeps module fixtures built once); most tests wait on subprocesses,
# SSH, namespaces and timers, so two workers take ~0.6x the wall time of one on 2 cores. Tests marked
# `serial` (they assert a speed ratio another test's load would skew) then run alone. Every selected test must
# run or be an allowed skip (.ci/require_all_ran.py); JUnit goes to $EDGEKIT_CI_RESULTS/NAME[-serial].xml.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
name=$1 expr=$2
shift 2
RESULTS="${EDGEKIT_CI_RESULTS:-$ROOT/.ci-results}"
mkdir -p "$RESULTS"
PY="$ROOT/.venv/bin/python"
W="${EDGEKIT_TEST_WORKERS:-2}"
par=(-n "$W" --dist loadfile)
[ "$W" = 0 ] || [ "$W" = 1 ] && par=(-p no:xdist)
rm -f "$RESULTS/$name.xml" "$RESULTS/$name-serial.xml"
rc=0
"$PY" -m pytest -m "($expr) and not serial" -q "${par[@]}" --junitxml="$RESULTS/$name.xml" "$@" || rc=$?
[ "$rc" = 0 ] || [ "$rc" = 5 ] || exit "$rc"   # 5 (none selected) is judged below, with the skips
rc=0
"$PY" -m pytest -m "($expr) and serial" -q -p no:xdist --junitxml="$RESULTS/$name-serial.xml" "$@" || rc=$?
[ "$rc" = 0 ] || [ "$rc" = 5 ] || exit "$rc"
exec "$PY" "$ROOT/.ci/require_all_ran.py" "$name" "$RESULTS/$name.xml" "$RESULTS/$name-serial.xml"
