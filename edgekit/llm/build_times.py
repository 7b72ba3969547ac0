"""How long each language-model row took to build on this host, kept from earlier runs (issue #45 item 1): the
time budget starts a row only when its predicted build fits, and a measured figure predicts better than the
priors (``race.BUILD_S_PER_MPARAM``). The newest ``KEEP`` builds of a row on this host (hostname, CPU, cores)
for models of about the same size (parameters within a factor of 2: a tiny model's build is mostly fixed cost),
scaled to the model's parameters; a build restored from the build cache is not a build and is not kept.

Location: ``$EDGEKIT_HOME/cache/lm-build-times`` (else ``$XDG_CACHE_HOME/edgekit/lm-build-times``), one JSON file
a host; ``EDGEKIT_NO_CACHE=1`` turns it off."""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import socket
from pathlib import Path
from typing import Any

from ..paths import cache_dir

KEEP = 5


def _disabled() -> bool:
    return os.environ.get("EDGEKIT_NO_CACHE", "").strip() not in ("", "0")


def _file() -> Path:
    ident = {"host": socket.gethostname(), "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir("lm-build-times") / f"{key}.json"


def _read() -> dict[str, Any]:
    try:
        return dict(json.loads(_file().read_text()))
    except (OSError, ValueError):
        return {}


def _row(name: str, params: int) -> str:
    return f"{name}@2^{round(math.log2(max(params, 1)))}"


def record(name: str, seconds: float, params: int) -> None:
    """Keep one build of row ``name`` (``seconds`` for ``params`` parameters)."""
    if _disabled() or params <= 0 or seconds <= 0:
        return
    doc = _read()
    row = _row(name, params)
    doc[row] = [*doc.get(row, []), [round(seconds, 3), params]][-KEEP:]
    f = _file()
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_name(f".{f.name}.{os.getpid()}")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, f)
    except OSError:
        pass


def predicted_seconds(name: str, params: int) -> float | None:
    """The slowest of the row's kept builds on this host for a model of about this size, scaled to ``params``
    (None: none kept): the budget plans for the slow case."""
    if _disabled():
        return None
    kept = _read().get(_row(name, params)) or []
    return max(float(s) * params / max(int(n), 1) for s, n in kept) if kept else None


__all__ = ["predicted_seconds", "record"]
