"""What `edgekit quantize | prune | distill` share: load the model and the data sets, run one
pass (through the pass cache), write the result atomically to --out, print what it did."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..errors import BadInputError, OutputError


def check_range(value: float | None, lo: float, hi: float, option: str, what: str, *, lo_open=False, hi_open=False):
    if value is None:
        return
    bad = value < lo or value > hi or (lo_open and value == lo) or (hi_open and value == hi)
    if bad:
        lb, hb = "(" if lo_open else "[", ")" if hi_open else "]"
        raise BadInputError(f"{option} must be in {lb}{lo:g}, {hi:g}{hb} ({what}), got {value:g}",
                            hint=f"e.g. {option} {(lo + hi) / 2 if hi < 2 else 1:g}")


def check_out(out: Path, suffixes: tuple[str, ...]) -> Path:
    if out.suffix.lower() not in suffixes:
        raise OutputError(f"--out {out}: the output must end in {' or '.join(suffixes)}",
                          hint=f"e.g. --out model-compressed{suffixes[0]}")
    if out.exists() and out.is_dir():
        raise OutputError(f"--out {out} is a folder", hint="give a file path")
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def load_data(path: Path | None, role: str, *, labels: bool, x_key: str = "x", y_key: str = "y"):
    from ..inputs.data import load_npz

    if path is None:
        return None
    return load_npz(path, x_key=x_key, y_key=y_key if labels or role != "calib" else None,
                    require_labels=labels, role=role)


def load_model(model: Path, arch: str | None, datasets: list, workdir: Path, constants=None, state=None):
    """Load the model; ``datasets`` ([calib, eval, train]) are replaced by their model-aligned copies,
    each carrying the model's constant and state inputs (``--const``/``--state``, or 0-d arrays of the
    data named like an input: edgekit/inputs/stateful.py) when it has any."""
    from dataclasses import replace

    from ..inputs.data import check_fits
    from ..inputs.source import load_source
    from ..inputs.stateful import for_source

    first = next((d for d in datasets if d is not None), None)
    example = tuple(x[0:1] for x in first.xs) if first is not None else None
    source = load_source(model, example_inputs=example, arch=arch, workdir=workdir)
    data_constants = {k: v for d in datasets if d is not None for k, v in (d.constants or {}).items()}
    stream = for_source(source, constants, state, data_constants)
    io = stream.data_io(source.artifact.io) if stream is not None else source.artifact.io
    for i, (d, role) in enumerate(zip(datasets, ("calib", "eval", "train"))):
        if d is not None:  # aligned to the model's input order in place (arrays matched by name)
            d = check_fits(d, io, role)
            datasets[i] = replace(d, stream=stream) if stream is not None else d
    return source


def run_one(pass_name: str, art, config: dict[str, Any], ctx, out_name: str):
    from ..orchestration.cache import default_cache
    from ..passes.registry import get_pass

    p = get_pass(pass_name)
    cache = default_cache()
    return cache.run(p, art, config, ctx, out_name) if cache else p(art, config, ctx, out_name=out_name)


def write_out(art, out: Path, parity_xs) -> Any:
    """Copy the artifact to ``out`` atomically, exporting a torch result to ONNX when out is .onnx."""
    from ..formats import Format
    from ..fsutil import atomic_path

    if out.suffix.lower() == ".onnx" and art.format == Format.TORCH:
        from ..passes._torch import export_torch_artifact

        if parity_xs is None:
            raise BadInputError("writing .onnx exports the model and checks parity on real inputs, but no data "
                                "was given", hint="pass --eval-data (or --train-data), or write a .pt2")

        art = export_torch_artifact(art, Path(tempfile.mkdtemp(prefix="edgekit-export-")) / "model.onnx", parity_xs)
    elif out.suffix.lower() == ".pt2" and art.format != Format.TORCH:
        raise OutputError(f"the result is an {art.format.value} model; --out must end in .onnx")
    with atomic_path(out) as tmp:
        shutil.copyfile(art.path, tmp)
    return art


def report(art, out: Path, as_json: bool, summary: list[str]) -> None:
    from .common import out_console

    step = next((s for s in reversed(art.lineage) if s.kind == "pass"), art.lineage[-1])
    if as_json:
        print(json.dumps({"out": str(out), "size_bytes": out.stat().st_size, "precision": art.precision,
                          "pass": step.name, "config": step.config, "metrics": step.metrics,
                          "lineage": art.lineage_dicts()}, default=str))
        return
    for line in summary:
        out_console.print(line, highlight=False, markup=False)
    out_console.print(f"wrote {out} ({out.stat().st_size / 1024:.1f} KB, {art.precision})", highlight=False)


class Workdir:
    def __enter__(self) -> Path:
        self.path = Path(tempfile.mkdtemp(prefix="edgekit-"))
        return self.path

    def __exit__(self, *exc):
        shutil.rmtree(self.path, ignore_errors=True)
