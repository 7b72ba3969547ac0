"""``out/ship/``: the file to ship, its lineage and measured figures (ship.json), and the runtime
configuration the measured speed needs (runtime.json: runtime, threads, options)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from .artifact import Artifact
from .fsutil import atomic_path, atomic_write_text
from .report.model import VariantResult


def write_ship(out_dir: Path, v: VariantResult, art: Artifact) -> dict:
    ship_dir = out_dir / "ship"
    ship_dir.mkdir(exist_ok=True)
    dest = ship_dir / f"{v.name}{Path(art.path).suffix}"
    with atomic_path(dest) as tmp:
        shutil.copyfile(art.path, tmp)
    meta = {"variant": v.name, "file": str(dest), "sha256": art.sha256, "format": art.format.value,
            "precision": art.precision, "lineage": art.lineage_dicts(),
            "measured": {"p50_ms": v.latency_ms.p50 if v.latency_ms else None,
                         "accuracy": v.accuracy.value if v.accuracy else None, "accuracy_drop": v.accuracy_drop}}
    atomic_write_text(ship_dir / "ship.json", json.dumps(meta, indent=2))
    # what the application must set for the measured speed: the runtime, its threads and options
    rt = {"runtime": v.runtime.name, "version": v.runtime.version, "threads": v.runtime.threads,
          "options": v.runtime.options or {}, "file": dest.name}
    atomic_write_text(ship_dir / "runtime.json", json.dumps(rt, indent=2))
    return {"file": str(dest), "sha256": art.sha256, "runtime_config": str(ship_dir / "runtime.json")}
