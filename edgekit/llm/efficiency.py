"""Each row's measured effective bandwidth on a device, kept from earlier runs (issue #45 item 2): the figure
``predict.py`` divides by. A device cost table like the measurement cache: keyed by the device's fingerprint
(target, hostname, machine id, CPU, architecture, cores), the row, its runtime's version on the device and
the threads it ran at;
a figure measured on a busy device (other processes above ``measure.stats.BUSY_OTHER_CPU`` of its CPU) is not
stored. The newest ``KEEP`` figures of a row's newest runtime version are its history; their spread is the
prediction's uncertainty.

Location: ``$EDGEKIT_HOME/cache/lm-efficiency`` (else ``$XDG_CACHE_HOME/edgekit/lm-efficiency``), one JSON file
a device; ``EDGEKIT_NO_CACHE=1`` turns it off."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from ..measure.stats import BUSY_OTHER_CPU
from ..paths import cache_dir

KEEP = 8
ONE_FIGURE_SPREAD = 1.25  # one quiet measurement: the run-to-run drift of a shared host, and the model's shape
MIN_SPREAD = 1.15


def disabled() -> bool:
    return os.environ.get("EDGEKIT_NO_CACHE", "").strip() not in ("", "0")


def device_key(target: str, doc: dict[str, Any]) -> str:
    """The device's fingerprint from an agent result document's ``device`` facts."""
    facts = doc.get("device") or {}
    ident = {"target": target, **{k: facts.get(k) for k in ("hostname", "machine_id", "cpu", "arch", "cores")}}
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _file(key: str) -> Path:
    return cache_dir("lm-efficiency") / f"{key}.json"


def _read(key: str) -> dict[str, Any]:
    try:
        return dict(json.loads(_file(key).read_text()))
    except (OSError, ValueError):
        return {}


def busy(device_state: dict[str, Any]) -> bool:
    share = (device_state or {}).get("other_cpu_fraction")
    return isinstance(share, (int, float)) and share > BUSY_OTHER_CPU


def record(
    key: str, name: str, version: str | None, gbps: float, device_state: dict[str, Any], threads: int | None = None
) -> bool:
    """Keep a measured effective bandwidth; False (nothing kept) on a busy device or with the cache off."""
    if disabled() or busy(device_state) or not gbps > 0:
        return False
    doc = _read(key)
    rows = doc.setdefault("rows", {})
    figure = {"gbps": round(gbps, 4), "at": round(time.time(), 1), "threads": threads}
    rows.setdefault(f"{name}@{version}", []).append(figure)
    rows[f"{name}@{version}"] = rows[f"{name}@{version}"][-KEEP:]
    f = _file(key)
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_name(f".{f.name}.{os.getpid()}")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, f)
    except OSError:
        return False
    return True


def history(key: str | None, threads: int | None = None) -> dict[str, tuple[float, float]]:
    """{row: (median GB/s, spread)} of the device's newest runtime version of each row (at ``threads``, when
    given)."""
    if key is None or disabled():
        return {}
    newest: dict[str, tuple[float, list[float]]] = {}
    for row_version, all_figures in (_read(key).get("rows") or {}).items():
        name = row_version.rsplit("@", 1)[0]
        figures = [f for f in all_figures if threads is None or f.get("threads") in (None, threads)]
        at = max((f.get("at", 0) for f in figures), default=0)
        if figures and (name not in newest or at > newest[name][0]):
            newest[name] = (at, [float(f["gbps"]) for f in figures])
    out = {}
    for name, (_at, vals) in newest.items():
        vals = sorted(vals)
        med = vals[len(vals) // 2]
        spread = ONE_FIGURE_SPREAD if len(vals) == 1 else max(MIN_SPREAD, vals[-1] / med, med / vals[0])
        out[name] = (med, spread)
    return out


__all__ = ["device_key", "history", "record", "busy"]
