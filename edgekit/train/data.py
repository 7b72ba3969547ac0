"""Training data: an ``.npz`` (arrays ``x``, ``y``), a folder of ``.npy`` shards (``x*.npy`` with a
matching ``y*.npy`` for each), or Parquet (a file or a folder of files) read with Polars.

Each rank reads only the samples its DistributedSampler hands it: ``.npy`` shards are memory-mapped,
so a data set larger than RAM still trains. Parquet and ``.npz`` are read into memory (Polars is
columnar and fast; for more rows than fit, convert to ``.npy`` shards, see ``edgekit plan``).
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..errors import DataError, require


@dataclass
class TrainData:
    """Indexable samples: ``take(indices) -> (x float32, y int64)``; nothing else is loaded."""

    path: Path
    kind: str  # npz | npy-shards | parquet
    shards_x: list[np.ndarray]  # one array per shard (a single one for npz/parquet); may be memmaps
    shards_y: list[np.ndarray]
    sample_shape: tuple[int, ...]

    def __post_init__(self) -> None:
        self._offsets = np.cumsum([0] + [len(s) for s in self.shards_x])

    @property
    def n(self) -> int:
        return int(self._offsets[-1])

    @property
    def nbytes(self) -> int:
        """Bytes of the inputs and labels as float32 / int64 (what training holds per sample)."""
        return self.n * (int(np.prod(self.sample_shape)) * 4 + 8)

    def take(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        idx = np.asarray(indices, dtype=np.int64)
        if len(self.shards_x) == 1:
            x, y = self.shards_x[0][idx], self.shards_y[0][idx]
        else:
            shard = np.searchsorted(self._offsets, idx, side="right") - 1
            local = idx - self._offsets[shard]
            x = np.stack([self.shards_x[s][i] for s, i in zip(shard, local)])
            y = np.array([self.shards_y[s][i] for s, i in zip(shard, local)])
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(len(idx), *self.sample_shape)
        return x, np.asarray(y, dtype=np.int64).reshape(len(idx))

    def labels(self) -> np.ndarray:
        return np.concatenate([np.asarray(s).reshape(len(s)) for s in self.shards_y])


def _check_xy(path: Path, x: np.ndarray, y: np.ndarray, what: str) -> None:
    if x.ndim == 0 or len(x) == 0:
        raise DataError(f"training data {path}: {what} holds no samples (shape {x.shape})")
    if x.dtype.kind not in "fiub":
        raise DataError(f"training data {path}: {what} inputs have dtype {x.dtype}; training needs numbers",
                        hint="store numeric arrays (float32 preferred)")
    if y.dtype.kind not in "iu":
        raise DataError(f"training data {path}: labels in {what} must be integer class indices, got {y.dtype}",
                        hint="store y.astype('int64')")
    if y.ndim != 1 and not (y.ndim == 2 and y.shape[1] == 1):
        raise DataError(f"training data {path}: labels in {what} have shape {y.shape}; expected one class index "
                        "per sample", hint="store y with shape (N,)")
    if len(y) != len(x):
        raise DataError(f"training data {path}: {what} has {len(x)} inputs but {len(y)} labels")


def _reshape(path: Path, shape: tuple[int, ...], input_shape: Optional[tuple[int, ...]]) -> tuple[int, ...]:
    if input_shape is None:
        return shape
    if int(np.prod(shape)) != int(np.prod(input_shape)):
        raise DataError(f"training data {path}: samples have {int(np.prod(shape))} values {shape}; "
                        f"--input-shape {','.join(map(str, input_shape))} needs {int(np.prod(input_shape))}")
    return tuple(input_shape)


def _load_npz(p: Path, x_key: str, y_key: str, input_shape) -> TrainData:
    try:
        npz = np.load(p, allow_pickle=False)
        files = list(npz.files)
        missing = [k for k in (x_key, y_key) if k not in files]
        if missing:
            raise DataError(f"training data {p} has no array named {missing[0]!r} (it has {files})",
                            hint=f"rename the array, or pass --x-key/--y-key with one of {files}")
        x, y = np.asarray(npz[x_key]), np.asarray(npz[y_key])
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise DataError(f"training data {p} is not a readable .npz file ({exc})",
                        hint="write it with numpy.savez(path, x=inputs, y=labels)") from exc
    _check_xy(p, x, y, f"arrays {x_key!r}/{y_key!r}")
    return TrainData(p, "npz", [x], [y], _reshape(p, tuple(x.shape[1:]), input_shape))


def _load_shards(d: Path, x_key: str, y_key: str, input_shape) -> TrainData:
    xs_files = sorted(d.glob(f"{x_key}*.npy"))
    if not xs_files:
        raise DataError(f"training data folder {d} has no {x_key}*.npy shards (nor Parquet files)",
                        hint=f"write shards as {x_key}_00000.npy + {y_key}_00000.npy, ... or pass a .npz/.parquet")
    xs, ys = [], []
    for fx in xs_files:
        fy = fx.with_name(y_key + fx.name[len(x_key):])
        if not fy.is_file():
            raise DataError(f"training shard {fx.name} in {d} has no labels shard {fy.name}",
                            hint=f"each {x_key}<suffix>.npy needs a {y_key}<suffix>.npy with one label per sample")
        try:
            x = np.load(fx, mmap_mode="r", allow_pickle=False)
            y = np.load(fy, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise DataError(f"training shard {fx.name} or {fy.name} in {d} is not a readable .npy file ({exc})") from exc
        _check_xy(d, x, y, f"shard {fx.name}")
        if xs and x.shape[1:] != xs[0].shape[1:]:
            raise DataError(f"training shard {fx.name} has samples of shape {x.shape[1:]}, "
                            f"{xs_files[0].name} has {xs[0].shape[1:]}")
        xs.append(x)
        ys.append(y)
    return TrainData(d, "npy-shards", xs, ys, _reshape(d, tuple(xs[0].shape[1:]), input_shape))


def _load_parquet(p: Path, files: list[Path], x_key: str, y_key: str, input_shape) -> TrainData:
    pl = require("polars", "train", "reading Parquet training data")
    try:
        df = pl.read_parquet([str(f) for f in files])
    except Exception as exc:  # polars raises ComputeError/OSError/...: all mean "not readable Parquet"
        raise DataError(f"training data {p} is not readable Parquet ({type(exc).__name__}: {exc})") from exc
    if y_key not in df.columns:
        raise DataError(f"Parquet training data {p} has no label column {y_key!r} (columns: {df.columns[:20]})",
                        hint="pass --y-key with the label column's name")
    y = df[y_key].to_numpy()
    if x_key in df.columns and isinstance(df.schema[x_key], (pl.List, pl.Array)):
        try:
            x = np.stack(df[x_key].to_list()).astype(np.float32)
        except ValueError as exc:
            raise DataError(f"Parquet column {x_key!r} in {p} holds lists of different lengths") from exc
    else:
        feats = [c for c in df.columns if c != y_key]
        bad = [c for c in feats if not df.schema[c].is_numeric()]
        if bad:
            raise DataError(f"Parquet training data {p}: feature column {bad[0]!r} is {df.schema[bad[0]]}, not numeric",
                            hint="keep only numeric feature columns and the label column, or put the inputs in one "
                                 f"list column named {x_key!r}")
        if not feats:
            raise DataError(f"Parquet training data {p} has only the label column {y_key!r}")
        x = df.select(feats).to_numpy().astype(np.float32)
    _check_xy(p, x, y, "the table")
    return TrainData(p, "parquet", [x], [y], _reshape(p, tuple(x.shape[1:]), input_shape))


def load_train_data(path: str | Path, *, x_key: str = "x", y_key: str = "y",
                    input_shape: Optional[tuple[int, ...]] = None) -> TrainData:
    p = Path(path)
    if not p.exists():
        raise DataError(f"training data {p} not found",
                        hint="pass an .npz (x, y), a folder of x_*.npy/y_*.npy shards, or a .parquet file/folder")
    if p.is_dir():
        parquet = sorted(p.glob("*.parquet"))
        if parquet:
            return _load_parquet(p, parquet, x_key, y_key, input_shape)
        return _load_shards(p, x_key, y_key, input_shape)
    if p.suffix == ".npz":
        return _load_npz(p, x_key, y_key, input_shape)
    if p.suffix in (".parquet", ".pq"):
        return _load_parquet(p, [p], x_key, y_key, input_shape)
    raise DataError(f"training data {p} has an unknown kind ({p.suffix or 'no suffix'})",
                    hint="pass an .npz (x, y), a folder of x_*.npy/y_*.npy shards, or a .parquet file/folder")
