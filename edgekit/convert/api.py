"""``edgekit.convert.api.convert``: what `edgekit convert` runs. One model -> ONNX, TFLite or Core
ML, through the chain of hops, each checked for parity; the result lands atomically at ``out``.
Every input is validated before any converter runs.

Without --eval-data/--calib-data, a model whose input sizes are all known (a .pt2 always; an ONNX
file with static shapes, or with --input-shape) is checked on seeded synthetic inputs (float:
standard normal; integer/bool: 0 or 1), recorded as ``parity_inputs: "synthetic"`` in every hop's
lineage metrics (``"data"`` otherwise) with a ``parity_warning`` that real data is a stronger check."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from ..artifact import Artifact
from ..errors import BadInputError, DataError, OutputError
from ..formats import FORMATS, all_options, convert_targets, format_spec
from ..inputs.data import Dataset, check_fits, load_npz
from ..inputs.source import load_source, synthetic_inputs, unbatched
from .hops import check_parity, convert_to, hop_config, target_spec

_DEFAULTS = {"io": "float", "quantization": "full"}
SYNTHETIC_WARNING = ("parity was checked on synthetic inputs (seeded: float standard normal, integer 0/1): it shows "
                     "the converted model computes what the source computes on such inputs, not on yours; "
                     "pass --eval-data EVAL.npz (real inputs) for a stronger check")


def _mark_parity_inputs(art: Artifact, since: int, kind: str) -> Artifact:
    """Record on every convert step after the first ``since`` lineage steps which inputs checked it."""
    steps = []
    for i, step in enumerate(art.lineage):
        if i >= since and step.kind == "convert":
            metrics = {**step.metrics, "parity_inputs": kind}
            if kind == "synthetic":
                metrics["parity_warning"] = SYNTHETIC_WARNING
            step = step.model_copy(update={"metrics": metrics})
        steps.append(step)
    return art.model_copy(update={"lineage": tuple(steps)})


def _check_out(out: Path, to: str) -> Path:
    suffix = target_spec(to).suffix
    if out.suffix.lower() != suffix:
        raise OutputError(f"--out {out}: a {to} model is written as {suffix}", hint=f"e.g. --out model{suffix}")
    if out.exists() and out.is_dir() and not format_spec(to).is_dir:
        raise OutputError(f"--out {out} is a folder", hint=f"give a file name ending in {suffix}")
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def _load_data(path, x_key: str, role: str):
    """(dataset, None), or (None, (path, keys, error)) when the arrays do not share a sample count:
    that is right only for a model without a common batch axis (a 2x3 times 3x4 product), which takes
    its inputs whole; decided once the model is loaded (:func:`_whole_inputs`)."""
    import numpy as np

    if not path:
        return None, None
    try:
        return load_npz(path, x_key=x_key, y_key=None, require_labels=False, role=role), None
    except DataError as exc:
        try:
            with np.load(path, allow_pickle=False) as npz:
                files = list(npz.files)
                keys = [k.strip() for k in str(x_key).split(",") if k.strip()]
                if keys == ["x"] and "x" not in files:
                    keys = files
                lengths = {len(npz[k]) if npz[k].ndim else None for k in keys if k in files}
        except Exception:  # unreadable: the data layer's error says so
            raise exc from None
        if len(lengths) <= 1 or any(k not in files for k in keys):
            raise
        return None, (Path(path), keys, exc)


def _whole_inputs(pending, io):
    """The arrays of a file without a common sample axis, for a model without one: each array must
    be exactly its input's static shape (one run of the model). Anything else: the data layer's error."""
    import numpy as np


    path, keys, err = pending
    shapes = [tuple(s.shape) for s in io.inputs]
    if not unbatched(shapes) or len(keys) != len(shapes):
        raise err
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: np.asarray(npz[k]) for k in keys}
    names = [s.name for s in io.inputs]
    order = names if all(n in arrays for n in names) else keys
    xs = tuple(arrays[k] for k in order)
    if any(x.shape != sh for x, sh in zip(xs, shapes)):
        raise err
    return Dataset(path.resolve(), xs, None, tuple(order), None)


def convert(model: Any, *, to: str, precision: str = "fp32", out: str | Path, calib_data: str | Path | None = None,
            eval_data: str | Path | None = None, io: str = "float", quantization: str = "full", route: str = "auto",
            input_shapes: dict[str, list[int]] | None = None, arch: str | None = None, x_key: str = "x",
            progress: Callable[[str], None] | None = None) -> Artifact:
    progress = progress or (lambda _m: None)
    out = _check_out(Path(out).absolute(), to)  # converters change the working directory: no relative path
    row = format_spec(to)
    # --- validate the cheap things first ------------------------------------------------------
    given = {"io": io, "quantization": quantization}  # --input-shape also sizes synthetic parity inputs: any format
    foreign = [k for k in given if k in all_options() and k not in row.options and given[k] != _DEFAULTS[k]]
    if foreign:
        owners = " / ".join(s.label for s in _owners(foreign))
        raise BadInputError(f"--{' and --'.join(foreign)} are {owners} options"
                            + (f"; {row.precision_note}" if row.precision_note else ""),
                            hint=f"for {row.label} use --precision {' | '.join(row.precisions)}")
    if precision not in row.precisions:
        raise BadInputError(f"--to {to} --precision {precision}: the {row.label} hop makes the "
                            f"{' / '.join(row.precisions)} model", hint=row.precision_hint or None)
    options = {k: v for k, v in {**given, "input_shapes": input_shapes}.items() if k in row.options}
    hcfg = hop_config(to, precision, options, context="convert options",
                      hint="--io int8 needs --precision int8 --quantization full")
    calib, calib_whole = _load_data(calib_data, x_key, "calib")
    ev, ev_whole = _load_data(eval_data, x_key, "eval")
    if getattr(hcfg, "needs_calibration", False) and calib is None and calib_whole is None:
        raise DataError("full-integer INT8 needs a calibration set",
                        hint="pass --calib-data CALIB.npz, or --quantization dynamic (weights only)")
    data = ev or calib
    example = tuple(x[0:1] for x in data.xs) if data is not None else None
    if data is None and Path(str(model)).suffix.lower() in (".pt", ".pth"):
        raise DataError("a state dict needs sample inputs to export the model", hint="pass --calib-data or --eval-data")

    work = Path(tempfile.mkdtemp(prefix=".edgekit-convert-", dir=out.parent))
    try:
        progress("loading the model")
        source = load_source(model, example_inputs=example, arch=arch, workdir=work)
        if calib_whole is not None:
            calib = _whole_inputs(calib_whole, source.artifact.io)
        if ev_whole is not None:
            ev = _whole_inputs(ev_whole, source.artifact.io)
        # check_fits returns the data in the model's input order (arrays matched by name or --x-key order)
        # convert has no --const/--state: parity feeds every input from the data (the hint says so)
        calib = (check_fits(calib, source.artifact.io, "calib", streams=False) or calib) if calib is not None else None
        ev = (check_fits(ev, source.artifact.io, "eval", streams=False) or ev) if ev is not None else None
        data = ev or calib
        if data is None:
            xs = synthetic_inputs(source.artifact.io, input_shapes=input_shapes)  # DataError naming --input-shape
            kind = "synthetic"
            progress("no sample data given: checking parity on synthetic inputs (--eval-data is a stronger check)")
        else:
            xs = list(data.xs)
            kind = "data"
        since = len(source.artifact.lineage)
        if source.artifact.format == row.format:
            raise BadInputError(f"{model} is already {row.label}",
                                hint=f"use --to {' or --to '.join(t for t in _targets() if t != to)}")
        art = convert_to(source.artifact, to, out, source=source, precision=precision, config=hcfg, calib=calib,
                         parity_inputs=xs, route=route, workdir=work, progress=progress)
        try:
            check_parity(art, row)  # `edgekit convert` writes nothing out of tolerance
        except Exception:
            _remove(out)
            raise
        return _mark_parity_inputs(art, since, kind)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _owners(options: list[str]):
    return [s for s in FORMATS if any(k in s.options for k in options)]


def _targets() -> tuple[str, ...]:
    return convert_targets()


def _remove(p: Path) -> None:
    if p.is_dir():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


__all__ = ["convert"]
