#!/usr/bin/env bash
# Install everything edgekit and its tests need, idempotently: system packages, the venv, the stack.
# Used by the README's commands and by .ci/run. Re-running is cheap (a stamp skips finished steps).
set -euo pipefail
# -P: the real checkout even when reached through a link to .ci/ (the docs step runs the README's commands in a
# scratch folder of links), so `pip install -e .` always installs this checkout
ROOT="$(cd -P "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# System packages for the real-device tests (sshd, the adb client, qemu for the arm64 twin, chromium
# for the HTML report check and the browser target; cmake, ninja and a compiler build llama.cpp for
# .ci/llama_cpp.sh; the aarch64 cross compiler builds it for the arm64 twin). Only installed when we are root and apt is there.
APT_PACKAGES="openssh-server iproute2 nftables adb qemu-user-static binfmt-support debootstrap chromium espeak-ng cmake ninja-build build-essential g++-aarch64-linux-gnu"
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  missing=""
  for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  if [ -n "$missing" ]; then
    echo "edgekit install: apt packages:$missing"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  fi
fi

# The browser target's web runtimes (device_agents/browser: ONNX Runtime Web, pinned by its package-lock.json)
# come from the npm registry here, at setup, never at run time; Node.js and npm from apt where missing.
BROWSER="$ROOT/device_agents/browser"
if ! command -v npm >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "edgekit install: apt packages: nodejs npm"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
if command -v npm >/dev/null 2>&1; then
  BWANT="$(sha256sum < "$BROWSER/package-lock.json" | cut -d' ' -f1)"
  if [ "$(cat "$BROWSER/node_modules/.edgekit-stamp" 2>/dev/null)" != "$BWANT" ]; then
    (cd "$BROWSER" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null) \
      || { echo "edgekit install: npm ci in $BROWSER failed"; exit 1; }
    echo "$BWANT" > "$BROWSER/node_modules/.edgekit-stamp"
  fi
else
  echo "edgekit install: npm not found: the browser target's runtimes are not installed (install Node.js and npm)"
fi

PY="${EDGEKIT_PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV="$ROOT/.venv"
STAMP="$VENV/.edgekit-install-stamp"
WANT="$(cat pyproject.toml .ci/install.sh | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
LOG="$VENV/.edgekit-install.log"
pipi() { "$VENV/bin/pip" install --disable-pip-version-check "$@" >>"$LOG" 2>&1 || { tail -40 "$LOG"; echo "edgekit install: pip install $* failed (log: $LOG)"; exit 1; }; }
: > "$LOG"
pipi --upgrade pip
# The CPU build of torch first: a plain `torch` requirement would pull a multi-GB CUDA build.
pipi "torch==2.13.0"
# lab: labgrid (its coordinator and client) for the shared-lab tests; kept out of `all` (see pyproject.toml).
# docs: mkdocs and its plugins for CI's docs step (.ci/docs.sh), pinned.
# `all` without OpenVINO's and NCNN's extras first; then pip is asked what those two would change, and the
# install refuses if they would move torch, onnx, numpy or another package the stack was checked against
# (.ci/guard_extra.py: a new openvino/nncf/ncnn/pnnx release pinning another numpy fails here, by name)
GUARDED_EXTRAS="openvino,ncnn"
BASE="$("$VENV/bin/python" -c 'import re, sys, tomllib
all_ = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["all"][0]
print(",".join(e for e in re.search(r"\[(.*)\]", all_).group(1).split(",") if e not in sys.argv[1].split(",")))' "$GUARDED_EXTRAS")"
pipi -e ".[$BASE,dev,docs,lab]"
"$VENV/bin/python" .ci/guard_extra.py "$GUARDED_EXTRAS" >>"$LOG" 2>&1 || { tail -5 "$LOG"; exit 1; }
tail -1 "$LOG"
pipi -e ".[all,dev,docs,lab]"
"$VENV/bin/python" -c "import edgekit, torch, onnxruntime; print('edgekit install: ok (torch', torch.__version__, ')')"
echo "$WANT" > "$STAMP"
