"""Eval and calibration data sets: ``.npz`` files holding ``x`` (inputs as the model takes them)
and ``y`` (integer labels; optional for calibration). Key names are overridable."""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .artifact import IOSpec
from .errors import DataError


@dataclass(frozen=True)
class Dataset:
    path: Path
    xs: tuple[np.ndarray, ...]  # one array per model input, first axis = samples
    y: np.ndarray | None
    x_keys: tuple[str, ...]
    y_key: str | None

    @property
    def n(self) -> int:
        return len(self.xs[0])


def load_npz(path: str | Path, *, x_key: str | tuple[str, ...] = "x", y_key: str | None = "y",
             require_labels: bool = True, role: str = "eval") -> Dataset:
    p = Path(path)
    x_keys = (x_key,) if isinstance(x_key, str) else tuple(x_key)
    if not p.is_file():
        raise DataError(f"{role} data {p} not found", hint=f"pass an .npz file with arrays {list(x_keys)} and '{y_key}'")
    try:
        npz = np.load(p, allow_pickle=False)
        files = list(npz.files)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise DataError(f"{role} data {p} is not a readable .npz file ({exc})",
                        hint="write it with numpy.savez(path, x=inputs, y=labels)") from exc
    missing = [k for k in x_keys if k not in files]
    if missing:
        raise DataError(f"{role} data {p} has no array named {missing[0]!r} (it has {files})",
                        hint=f"rename the array, or pass --x-key with one of {files}")
    y = None
    if y_key and y_key in files:
        y = np.asarray(npz[y_key])
    elif require_labels:
        raise DataError(f"{role} data {p} has no labels array {y_key!r} (it has {files}); accuracy needs labels",
                        hint=f"add y=labels to the .npz, or pass --y-key with one of {files}")
    try:
        xs = tuple(np.asarray(npz[k]) for k in x_keys)
    except ValueError as exc:  # object arrays need pickle: refused
        raise DataError(f"{role} data {p}: {exc}", hint="store plain numeric arrays (no Python objects)") from exc
    n = len(xs[0]) if xs[0].ndim else 0
    if n == 0:
        raise DataError(f"{role} data {p}: array {x_keys[0]!r} holds no samples (shape {xs[0].shape})")
    if any(len(x) != n for x in xs):
        raise DataError(f"{role} data {p}: input arrays have different sample counts")
    if y is not None:
        if y.dtype.kind not in "iu":
            raise DataError(f"{role} data {p}: labels {y_key!r} must be integers, got {y.dtype}",
                            hint="store class indices, e.g. y.astype('int64')")
        if len(y.reshape(len(y), -1)) != n:
            raise DataError(f"{role} data {p}: {len(y)} labels for {n} samples")
    return Dataset(p.resolve(), xs, y, x_keys, y_key if y is not None else None)


def check_fits(ds: Dataset, io: IOSpec, role: str = "eval") -> None:
    """Eval data must match the model's inputs sample for sample (shape without batch, dtype)."""
    if len(ds.xs) != len(io.inputs):
        raise DataError(f"{role} data {ds.path.name} has {len(ds.xs)} input array(s); the model takes {len(io.inputs)} "
                        f"({', '.join(i.name for i in io.inputs)})")
    for x, spec in zip(ds.xs, io.inputs):
        want = tuple(spec.shape[1:])
        got = tuple(x.shape[1:])
        if len(want) != len(got) or any(w is not None and w != g for w, g in zip(want, got)):
            raise DataError(
                f"{role} data {ds.path.name}: samples have shape {got}, the model input '{spec.name}' takes "
                f"{tuple('?' if w is None else w for w in want)} (batch axis first: {tuple(spec.shape)})",
                hint="reshape the data to the model's input layout, e.g. x.reshape(-1, *shape)",
            )
        if np.dtype(spec.dtype) != x.dtype:
            if x.dtype.kind == np.dtype(spec.dtype).kind == "f":
                continue  # float64 data for a float32 model is cast by the agent
            raise DataError(f"{role} data {ds.path.name}: dtype {x.dtype}, model input '{spec.name}' takes {spec.dtype}",
                            hint=f"cast it: x.astype('{spec.dtype}')")
