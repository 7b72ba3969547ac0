"""Checkpoints: written by rank 0 only, atomically (temp file + rename: a kill mid-write leaves the
previous checkpoint intact), read back with ``torch.load(weights_only=True)``.

A checkpoint holds the model and optimizer state, the position in training (epoch = the
DistributedSampler's epoch, and the step inside it), the RNG state, the metrics so far, and a
fingerprint of the settings that must not change on --resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import BadInputError
from ..fsutil import atomic_path

CHECKPOINT = "last.pt"
# Settings that define the trajectory: resuming with another value would silently train something else.
# (The number of processes may change: a global batch holds the same samples at any world size.)
FINGERPRINT_KEYS = ("factory", "batch_size", "lr", "optimizer", "seed", "x_key", "y_key", "input_shape")


def fingerprint(cfg, n_samples: int) -> dict[str, Any]:
    d = cfg.model_dump(mode="json")
    fp = {k: d[k] for k in FINGERPRINT_KEYS}
    fp["n_samples"] = n_samples
    return fp


def save(run_dir: Path, state: dict[str, Any]) -> Path:
    import torch

    dest = Path(run_dir) / CHECKPOINT
    with atomic_path(dest) as tmp:
        torch.save(state, tmp)
    return dest


def load(run_dir: Path) -> dict[str, Any]:
    import torch

    p = Path(run_dir) / CHECKPOINT
    if not p.is_file():
        raise BadInputError(f"--resume: no checkpoint {p} to resume from",
                            hint="run without --resume to start training, or pass --checkpoint-dir of the earlier run")
    try:
        return torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError / RuntimeError: a foreign or damaged file
        raise BadInputError(f"checkpoint {p} cannot be read with torch.load(weights_only=True): "
                            f"{str(exc).splitlines()[0][:200]}",
                            hint="delete it to start over") from exc


def check_compatible(saved: dict[str, Any], now: dict[str, Any], path: Path) -> None:
    for k, v in now.items():
        if saved.get(k) != v:
            raise BadInputError(f"--resume: {k} was {saved.get(k)!r} in the checkpoint {path}, now {v!r}",
                                hint=f"resume with the same {k}, or start a new run with another --checkpoint-dir")
