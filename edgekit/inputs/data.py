"""Eval, calibration and training data sets: ``.npz`` files holding the model's inputs and labels.

Inputs: one array per model input, batch axis first. ``x`` for a one-input model; for several
inputs either name the arrays like the model's inputs (``input_ids``, ``attention_mask``: matched by
name, in the model's order) or list them with ``--x-key input_ids,attention_mask``. Labels (``y``,
``--y-key``) are whatever the metric reads: class indices (N,), class maps (N, H, W), boxes
(N, M, 5), targets of an output's shape; optional for calibration and for metrics that compare
with the float model."""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..artifact import IOSpec
from ..errors import DataError
from .stateful import missing_inputs_hint


@dataclass(frozen=True)
class Dataset:
    path: Path
    xs: tuple[np.ndarray, ...]  # one array per model input, first axis = samples
    y: np.ndarray | None
    x_keys: tuple[str, ...]
    y_key: str | None
    # True when no input key was given and the file has no ``x``: the arrays must be named like the
    # model's inputs (checked by align_to_model once the model is known)
    by_name: bool = False
    sample: dict | None = None  # set by take_subset(): {"n", "of", "seed", "stratified"}
    # a folder of .npy shards: per shard, array name -> file (sent to the device as they are)
    shards: tuple[dict[str, Path], ...] | None = None
    # 0-d arrays of the file, by name: constant inputs when named like a model input (edgekit/inputs/stateful.py)
    constants: dict[str, np.ndarray] | None = None
    # how the model's other inputs are fed besides these arrays (constants, carried state): a
    # stateful.Stream, set by prepare_run once the model is known; None: the data feeds every input
    stream: Any = None
    # shards at several sample shapes (text lines of several widths): one Bucket per shape, the most
    # common first; ``xs``/``y`` are then bucket 0's (what calibration, export and parity run on), and
    # the eval pass scores every bucket (edgekit/metrics/evaluate.py). None: one shape.
    buckets: tuple["Bucket", ...] | None = None

    @property
    def n(self) -> int:
        """Samples in ``xs`` (bucket 0's when the data has several shapes: see :attr:`total`)."""
        return len(self.xs[0])

    @property
    def shards_per_bucket(self) -> list[int] | None:
        """How many of ``shards`` (in bucket order) each shape bucket holds; None for one shape."""
        return [len(b.shards) for b in self.buckets] if self.buckets else None

    @property
    def total(self) -> int:
        """Every sample of the set, all shape buckets together."""
        return sum(b.n for b in self.buckets) if self.buckets else self.n


@dataclass(frozen=True)
class Bucket:
    """The shards of an eval set whose samples share one shape (per input)."""

    shapes: tuple[tuple[int, ...], ...]  # per input, the sample shape (no batch axis)
    shard_ids: tuple[int, ...]
    xs: tuple[np.ndarray, ...]
    y: np.ndarray | None
    shards: tuple[dict[str, Path], ...]

    @property
    def n(self) -> int:
        return len(self.xs[0])

    def describe(self) -> str:
        return " ".join(str(s) for s in self.shapes) + f" ({self.n} samples)"


def parse_keys(x_key: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...] | None:
    """``"a,b"`` / ``("a", "b")`` -> ("a", "b"); None -> None (match the model's input names)."""
    if x_key is None:
        return None
    keys = tuple(k.strip() for k in (x_key.split(",") if isinstance(x_key, str) else x_key))
    if not keys or any(not k for k in keys):
        raise DataError(f"--x-key {x_key!r} names no array", hint="e.g. --x-key x, or --x-key input_ids,attention_mask")
    return keys


def load_npz(path: str | Path, *, x_key: str | tuple[str, ...] | None = "x", y_key: str | None = "y",
             require_labels: bool = True, role: str = "eval") -> Dataset:
    """Load an .npz (or a folder of .npy shards, see :func:`load_shards`). ``x_key="x"`` (the default)
    on data without an ``x`` array takes every array but the labels, to be matched to the model's input
    names by :func:`align_to_model`."""
    p = Path(path)
    if p.is_dir():
        return load_shards(p, x_key=x_key, y_key=y_key, require_labels=require_labels, role=role)
    x_keys = parse_keys(x_key)
    if not p.is_file():
        raise DataError(f"{role} data {p} not found", hint=f"pass an .npz file with arrays {list(x_keys)} and '{y_key}'")
    try:
        npz = np.load(p, allow_pickle=False)
        files = list(npz.files)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise DataError(f"{role} data {p} is not a readable .npz file ({exc})",
                        hint="write it with numpy.savez(path, x=inputs, y=labels)") from exc
    constants = _scalars(npz, [f for f in files if f != y_key and f not in (x_keys or ())])
    by_name = x_keys in (("x",), None) and "x" not in files
    if by_name:  # arrays named like the model's inputs (0-d ones are constants: see Dataset.constants)
        x_keys = tuple(f for f in files if f != y_key and f not in constants)
        if not x_keys:
            raise DataError(f"{role} data {p} holds no input arrays (it has {files})",
                            hint="save the inputs as x=..., or under the model's input names")
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
    scalar = next((k for k, x in zip(x_keys, xs) if x.ndim == 0), None)
    if scalar is not None:
        raise DataError(f"{role} data {p}: array {scalar!r} is a scalar (0-d), not one array per sample",
                        hint=f"a constant input is fed with every sample: leave it out of --x-key (a 0-d array named "
                        f"like the input is read as one), or pass --const {scalar}=VALUE")
    n = len(xs[0]) if xs[0].ndim else 0
    if n == 0:
        raise DataError(f"{role} data {p}: array {x_keys[0]!r} holds no samples (shape {xs[0].shape})")
    if any(len(x) != n for x in xs):
        raise DataError(f"{role} data {p}: input arrays have different sample counts")
    if y is not None:
        if y.dtype.kind not in "iufb" or y.ndim == 0:
            raise DataError(f"{role} data {p}: labels {y_key!r} must be a numeric array with a sample axis, "
                            f"got {y.dtype} {y.shape}", hint="store class indices, e.g. y.astype('int64'), or targets")
        if len(y) != n:
            raise DataError(f"{role} data {p}: {len(y)} labels for {n} samples (labels are batch-first like the inputs)")
    return Dataset(p.resolve(), xs, y, x_keys, y_key if y is not None else None, by_name, constants=constants)


def _scalars(npz, keys: list[str]) -> dict[str, np.ndarray]:
    """The 0-d arrays among ``keys`` (read from each array's header, so a large array is never loaded here)."""
    out = {}
    for k in keys:
        try:
            with npz.zip.open(f"{k}.npy") as fh:
                version = np.lib.format.read_magic(fh)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape = read(fh)[0]
        except (OSError, ValueError, KeyError):
            continue
        if shape == ():
            out[k] = np.asarray(npz[k])
    return out


_SHARD = re.compile(r"^(?P<key>.+?)(?:\.(?P<idx>\d+))?\.npy$")


def load_shards(p: Path, *, x_key, y_key, require_labels: bool, role: str) -> Dataset:
    """A folder of ``KEY.npy`` files, or shards ``KEY.00000.npy``, ``KEY.00001.npy``... (the same
    shard numbers for every array; samples in shard order). Each file is memory-mapped: a single
    file per array is never read whole on the host; several shards are joined in memory for the
    host's reference run, while the device reads them shard by shard (each file is delivered by
    content, so an unchanged shard is never sent again)."""
    found: dict[str, dict[int, Path]] = {}
    for f in sorted(p.iterdir()):
        m = _SHARD.match(f.name)
        if m and f.is_file():
            found.setdefault(m["key"], {})[int(m["idx"]) if m["idx"] is not None else -1] = f
    if not found:
        raise DataError(f"{role} data folder {p} holds no .npy files",
                        hint="write one KEY.npy per array (x.npy, y.npy), or shards KEY.00000.npy, KEY.00001.npy...")
    files = sorted(found)
    x_keys = parse_keys(x_key)
    by_name = x_keys in (("x",), None) and "x" not in found
    if by_name:
        x_keys = tuple(k for k in files if k != y_key)
    missing = [k for k in x_keys if k not in found]
    if missing:
        raise DataError(f"{role} data {p} has no array named {missing[0]!r} (it has {files})",
                        hint=f"rename the files, or pass --x-key with one of {files}")
    keys = [*x_keys, *([y_key] if y_key and y_key in found else [])]
    numbers = {k: sorted(found[k]) for k in keys}
    if len({tuple(v) for v in numbers.values()}) != 1:
        raise DataError(f"{role} data {p}: the arrays have different shards ({numbers})",
                        hint="every array needs the same shard numbers (x.00000.npy with y.00000.npy...)")
    shard_ids = numbers[keys[0]]

    def load(f: Path) -> np.ndarray:
        try:
            return np.load(f, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise DataError(f"{role} data {f} is not a readable .npy file ({exc})") from exc

    shards = tuple({k: found[k][i] for k in keys} for i in shard_ids)
    arrays = {k: [load(sh[k]) for sh in shards] for k in keys}
    for i, sh in enumerate(shards):
        lens = {k: len(arrays[k][i]) for k in keys}
        if len(set(lens.values())) != 1:
            raise DataError(f"{role} data {p}: shard {shard_ids[i]} has different sample counts {lens}")
    y_in = y_key if y_key and y_key in arrays else None
    if y_in is None and require_labels:
        raise DataError(f"{role} data {p} has no labels {y_key!r}.npy (it has {files})",
                        hint=f"add {y_key}.npy, or pass --y-key with one of {files}")
    groups: dict[tuple, list[int]] = {}  # sample shapes of every input -> shard positions, in shard order
    for i in range(len(shards)):
        groups.setdefault(tuple(tuple(arrays[k][i].shape[1:]) for k in x_keys), []).append(i)
    if len(groups) > 1 and role != "eval":
        first, other = list(groups)[:2]
        k = next(k for j, k in enumerate(x_keys) if first[j] != other[j])
        raise DataError(f"{role} data {p}: array {k!r} has samples of shape {first[x_keys.index(k)]} in shard "
                        f"{shard_ids[groups[first][0]]} and {other[x_keys.index(k)]} in shard "
                        f"{shard_ids[groups[other][0]]}; {role} data must hold one shape (only eval data may hold "
                        "several: shape buckets)", hint="pad or resize the samples to one shape, or use the shards "
                        "of one shape")
    buckets = []
    for shapes, pos in sorted(groups.items(), key=lambda kv: -sum(len(arrays[x_keys[0]][i]) for i in kv[1])):
        part = {k: [arrays[k][i] for i in pos] for k in keys}
        _refuse_mixed_shapes(part, [shard_ids[i] for i in pos], p, role, y_in)
        joined = {k: v[0] if len(v) == 1 else np.concatenate(v) for k, v in part.items()}
        buckets.append(Bucket(shapes=shapes, shard_ids=tuple(shard_ids[i] for i in pos),
                              xs=tuple(joined[k] for k in x_keys),
                              y=np.asarray(joined[y_in]) if y_in else None, shards=tuple(shards[i] for i in pos)))
    b0 = buckets[0]
    if b0.n == 0:
        raise DataError(f"{role} data {p}: array {x_keys[0]!r} holds no samples")
    return Dataset(p.resolve(), b0.xs, b0.y, tuple(x_keys), y_in, by_name,
                   shards=shards if len(buckets) == 1 else tuple(sh for b in buckets for sh in b.shards),
                   buckets=tuple(buckets) if len(buckets) > 1 else None)


def _refuse_mixed_shapes(arrays: dict[str, list[np.ndarray]], shard_ids: list[int], p: Path, role: str,
                         y_key: str | None) -> None:
    """Within one shape bucket (shards whose inputs share a shape) the labels must share one shape too:
    say so, naming the shards, instead of failing in numpy's concatenate."""
    for k, parts in arrays.items():
        shapes = {i: tuple(a.shape[1:]) for i, a in zip(shard_ids, parts)}
        first = shard_ids[0]
        other = next((i for i in shard_ids if shapes[i] != shapes[first]), None)
        if other is None:
            continue
        raise DataError(
            f"{role} data {p}: array {k!r} has labels of shape {shapes[first]} in shard {first} and {shapes[other]} "
            f"in shard {other}, whose samples have one shape; the labels of one shape bucket must share a shape",
            hint="pad the labels to one length (ctc_accuracy reads label sequences padded at the end with -1)")


def align_to_model(ds: Dataset, io: IOSpec, role: str = "eval", *, streams: bool = True) -> Dataset:
    """The data's input arrays in the model's input order: by name when the data names every model
    input (extra arrays are left out), else by position when the counts agree. ``streams``: the command
    takes --const/--state (deploy, quantize), which the hint for inputs the data lacks then names."""
    names = [i.name for i in io.inputs]
    if list(ds.x_keys) == names:
        return ds
    by_key = dict(zip(ds.x_keys, ds.xs))
    if all(n in by_key for n in names):
        pick = [list(ds.x_keys).index(n) for n in names]
        buckets = None if not ds.buckets else tuple(
            replace(b, xs=tuple(b.xs[i] for i in pick), shapes=tuple(b.shapes[i] for i in pick)) for b in ds.buckets)
        return replace(ds, xs=tuple(by_key[n] for n in names), x_keys=tuple(names), buckets=buckets)
    if len(ds.xs) == len(names) and not ds.by_name:
        return ds  # the user's order (--x-key) is the model's
    if ds.by_name:
        keys = ",".join(ds.x_keys[: len(names)])
        raise DataError(f"{role} data {ds.path.name} has no array named 'x', and its arrays {list(ds.x_keys)} are not "
                        f"named like the model's inputs {names}",
                        hint=f"pass --x-key with the data's array name(s) in the model's input order, e.g. --x-key {keys}")
    if len(ds.xs) < len(names):  # the inputs the data lacks may be a streaming model's state or constants
        missing = [n for n in names if n not in by_key] if set(names) & set(by_key) else names[len(ds.xs):]
        raise DataError(f"{role} data {ds.path.name} holds no array for model input(s) {missing} (its arrays "
                        f"{list(ds.x_keys)}; the model takes {names})", hint=missing_inputs_hint(io, missing, streams))
    raise DataError(f"{role} data {ds.path.name}: arrays {list(ds.x_keys)} do not match the model's inputs "
                    f"{names} ({len(ds.xs)} array(s) for {len(names)} input(s))",
                    hint=f"name the arrays like the inputs, or pass --x-key {','.join(names) if len(names) > 1 else 'NAME'} "
                    "with the data's array names in the model's input order")


def take_subset(ds: Dataset, n: int | None, seed: int = 0, *, contiguous: bool = False) -> Dataset:
    """A fixed, seeded subset of ``n`` samples (``--eval-samples``), stratified by class when the
    labels are class indices (N,), so a small subset keeps the class mix. Indices stay in file order.
    ``contiguous``: the first ``n`` samples (a stateful model's stream must stay unbroken)."""
    if n is None or n >= ds.total:
        return ds
    if ds.buckets:
        raise DataError(f"--eval-samples {n}: the eval data {ds.path.name} holds several sample shapes "
                        f"({len(ds.buckets)} shape buckets: {'; '.join(b.describe() for b in ds.buckets)}), and a "
                        "subset of shape buckets is not taken yet", hint="drop --eval-samples, or pass a folder "
                        "that holds fewer shards")
    if n < 1:
        raise DataError(f"--eval-samples {n}: take at least one sample")
    if contiguous:
        return replace(ds, xs=tuple(x[:n] for x in ds.xs), y=None if ds.y is None else ds.y[:n],
                       sample={"n": int(n), "of": int(ds.n), "seed": None, "stratified": False, "contiguous": True})
    rng = np.random.default_rng(seed)
    y = ds.y
    stratified = y is not None and y.ndim == 1 and y.dtype.kind in "iu" and len(np.unique(y)) <= max(2, n // 2)
    if stratified:
        classes, counts = np.unique(y, return_counts=True)
        quota = np.floor(counts / ds.n * n).astype(int)
        for i in np.argsort(-(counts / ds.n * n - quota))[: n - quota.sum()]:
            quota[i] += 1  # largest remainders first, so the quotas add up to n
        idx = np.concatenate([rng.choice(np.where(y == c)[0], q, replace=False) for c, q in zip(classes, quota)])
    else:
        idx = rng.choice(ds.n, n, replace=False)
    idx = np.sort(idx)
    return replace(ds, xs=tuple(x[idx] for x in ds.xs), y=None if y is None else y[idx],
                   sample={"n": int(n), "of": int(ds.n), "seed": seed, "stratified": bool(stratified)})


def check_fits(ds: Dataset, io: IOSpec, role: str = "eval", *, streams: bool = True) -> Dataset:
    """Eval data must match the model's inputs sample for sample (shape without batch, dtype).
    Returns the data aligned to the model's input order (see :func:`align_to_model`)."""
    ds = align_to_model(ds, io, role, streams=streams)
    if len(ds.xs) != len(io.inputs):
        raise DataError(f"{role} data {ds.path.name} has {len(ds.xs)} input array(s) {list(ds.x_keys)}; the model "
                        f"takes {len(io.inputs)} ({', '.join(i.name for i in io.inputs)})",
                        hint="pass --x-key a,b (the data's array names, in the model's input order)")
    for b in ds.buckets or ():  # bucket 0's arrays are ds.xs
        _check_shapes(ds, b.xs, io, role, b)
    if not ds.buckets:
        _check_shapes(ds, ds.xs, io, role)
    return ds


def _check_shapes(ds: Dataset, xs, io: IOSpec, role: str, bucket: Bucket | None = None) -> None:
    for x, spec in zip(xs, io.inputs):
        want = tuple(spec.shape[1:])
        got = tuple(x.shape[1:])
        if len(want) != len(got) or any(w is not None and w != g for w, g in zip(want, got)):
            where = "" if bucket is None else (
                f" (shards {', '.join(map(str, bucket.shard_ids))}, one of {len(ds.buckets)} shape buckets: "
                f"{'; '.join(b.describe() for b in ds.buckets)})")
            raise DataError(
                f"{role} data {ds.path.name}: samples have shape {got}{where}, the model input '{spec.name}' takes "
                f"{tuple('?' if w is None else w for w in want)} (batch axis first: {tuple(spec.shape)})",
                hint="reshape the data to the model's input layout, e.g. x.reshape(-1, *shape)" if bucket is None else
                "a model that takes several shapes has dynamic axes (torch.export's dynamic_shapes, an ONNX file with "
                "symbolic dimensions); or deploy once per shape (a folder of shards per shape)")
        if np.dtype(spec.dtype) != x.dtype:
            if x.dtype.kind == np.dtype(spec.dtype).kind and x.dtype.kind in "fiu":
                continue  # float64 data for a float32 input, int32 for int64...: the agent casts
            if {x.dtype.kind, np.dtype(spec.dtype).kind} <= {"i", "u"}:
                continue
            raise DataError(f"{role} data {ds.path.name}: dtype {x.dtype}, model input '{spec.name}' takes {spec.dtype}",
                            hint=f"cast it: x.astype('{spec.dtype}')")


def fixed_shape_misfit(art, ds: Dataset, source_io: IOSpec | None = None) -> str | None:
    """Why a file (an Artifact of the model ``source_io`` describes) cannot score eval data held at several
    sample shapes, or None: a file whose input takes one fixed shape (static in the file, or sized by the
    data when it was converted: a TFLite file from a dynamic ONNX) scores only one of them."""
    if not ds.buckets:
        return None

    sized = art.fixed_shapes
    src_io = source_io or art.io
    # the inputs the data feeds (not a stream's constants), by position: a converted file renames its inputs
    keep = [k for k, s in enumerate(src_io.inputs) if ds.stream is None or s.name not in ds.stream.fed]
    pairs = [(art.io.inputs[k], src_io.inputs[k].name) for k in keep if k < len(art.io.inputs)]
    for k, (spec, src) in enumerate(pairs[: len(ds.x_keys)]):
        shapes = {b.shapes[k] for b in ds.buckets}
        shape = tuple(sized[src][0]) if src in sized else tuple(spec.shape)
        if len(shapes) > 1 and shape and all(isinstance(d, int) and d > 0 for d in shape[1:]):
            return (f"input '{spec.name}' takes one fixed shape {shape}, and the eval data holds "
                    f"{ds.x_keys[k]!r} at {len(shapes)} shapes ({'; '.join(b.describe() for b in ds.buckets)}): a "
                    "fixed-shape file scores only one of them (deploy once per shape, or use a runtime that takes "
                    "dynamic shapes: onnxruntime, openvino)")
    return None


def eval_bundle(ds: Dataset, art_dir: Path) -> Path | list[dict[str, Path]]:
    """The eval set as the agent reads it: a folder's .npy shards as they are (each delivered by
    content, so an unchanged shard is never re-sent, and the device reads one shard at a time); the
    user's .npz when it holds only what is needed; else a trimmed copy."""
    import zipfile

    if ds.shards is not None and ds.sample is None:
        return [{k: sh[k] for k in ds.x_keys} for sh in ds.shards]
    if ds.shards is None and ds.sample is None:
        with zipfile.ZipFile(ds.path) as z:
            names = {n.removesuffix(".npy") for n in z.namelist()}
        if names <= set(ds.x_keys) | {ds.y_key}:
            return ds.path
    out = Path(art_dir) / "eval-bundle.npz"
    arrays = {k: x for k, x in zip(ds.x_keys, ds.xs)}
    if ds.y is not None:
        arrays[ds.y_key] = ds.y
    np.savez(out, **arrays)
    return out
