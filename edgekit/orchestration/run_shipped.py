"""Run a shipped model from ``out/ship/`` alone: ``edgekit run ship/ --input x.npz --out y.npz`` and
``run_shipped(ship_dir, inputs)``.

Everything comes from the ship contract (``ship.json``'s ``interface``, ``runtime.json``'s runtime,
threads and options); the file is fed through the device agent's own runner, exactly as it was
measured: inputs by the source model's names, transposed to the file's layout, quantized where its
inputs are integer, in chunks of its static batch (a streaming model: its constants beside, its state
carried from zeros one sample a call, in order); outputs brought back to the source model's names
and layout. A file whose runtime does not run on this host (Core ML) is refused naming where it runs.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..agent.inprocess import load_agent
from ..agent.protocol import build_request, load_outputs
from ..artifact import Artifact, IOSpec, TensorSpec
from ..errors import BadInputError, DataError, ModelLoadError
from ..formats import Format, spec_for_runtime
from ..inputs.stateful import from_interface
from ..inputs.targets import MeasureDefaults


def _read_json(path: Path) -> dict[str, Any]:
    """A ship/ folder's JSON document (ship.json, runtime.json), as the deploy wrote it."""
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
        return doc
    except FileNotFoundError:
        raise BadInputError(f"{path.parent} has no {path.name}: not a ship/ folder written by edgekit deploy",
                            hint="pass the ship/ folder of a deploy's --out (e.g. out/ship)") from None
    except ValueError as exc:
        raise BadInputError(f"{path} is not valid JSON ({exc})", hint="re-run the deploy that wrote it") from None


def shipped_model(ship_dir: str | Path) -> tuple[Artifact, IOSpec, dict[str, Any]]:
    """The shipped artifact (its files checked against ship.json's sha256), the source model's io, and
    runtime.json."""
    ship_dir = Path(ship_dir)
    meta, rt = _read_json(ship_dir / "ship.json"), _read_json(ship_dir / "runtime.json")
    face = meta.get("interface")
    if not face:
        raise BadInputError(f"{ship_dir / 'ship.json'} has no interface (written by an older edgekit)",
                            hint="re-run the deploy: ship.json then records how to call the file")
    fmt = Format(meta["format"])
    path = ship_dir / Path(meta["file"]).name  # beside ship.json, wherever the folder was moved
    specs = [(TensorSpec(name=e["name"], shape=tuple(e["shape"]), dtype=e["dtype"], layout=e.get("layout"),
                         transpose=tuple(e["transpose"]) if e.get("transpose") else None,
                         scale=(e.get("quantization") or {}).get("scale"),
                         zero_point=(e.get("quantization") or {}).get("zero_point")),
              TensorSpec(name=e["source_name"], shape=tuple(e["shape"]), dtype=e.get("source_dtype", e["dtype"])))
             for e in face["inputs"] + face["outputs"]]
    n_in = len(face["inputs"])
    io = IOSpec(inputs=tuple(s for s, _ in specs[:n_in]), outputs=tuple(s for s, _ in specs[n_in:]))
    source_io = IOSpec(inputs=tuple(s for _, s in specs[:n_in]), outputs=tuple(s for _, s in specs[n_in:]))
    try:
        art = Artifact.from_file(path, fmt, io, precision=meta.get("precision", "fp32"))
    except FileNotFoundError as exc:
        raise ModelLoadError(f"{exc}", hint="copy the whole ship/ folder (every file ship.json lists)") from None
    if art.sha256 != meta.get("sha256"):
        raise ModelLoadError(f"{path.name} is not the file that was measured (sha256 {art.sha256[:12]}..., "
                             f"ship.json says {str(meta.get('sha256'))[:12]}...)",
                             hint="copy the ship/ folder again from the deploy's --out")
    return art, source_io, rt


def _feed(inputs: Mapping[str, np.ndarray] | str | Path, source_io: IOSpec,
          fed: frozenset[str] = frozenset()) -> dict[str, np.ndarray]:
    """Input arrays by the source model's input names (a single-input model also takes one unnamed array);
    ``fed``: the constant and state inputs ship.json feeds itself (not taken from ``inputs``)."""
    if isinstance(inputs, (str, Path)):
        try:
            with np.load(inputs, allow_pickle=False) as z:
                inputs = {k: z[k] for k in z.files}
        except (OSError, ValueError) as exc:
            raise DataError(f"{inputs} is not a readable .npz ({exc})", hint="np.savez(path, NAME=array) with "
                            "the model's input names") from None
    given = sorted(fed & set(inputs))
    if given:
        raise DataError(f"input(s) {given} are fed from ship.json's interface (a constant, or a state carried from "
                        "zeros, one sample a call in order), not from the inputs",
                        hint="leave them out; to change a constant, deploy again with another --const")
    names = [s.name for s in source_io.inputs if s.name not in fed]
    if len(names) == 1 and names[0] not in inputs and len(inputs) == 1:
        return {names[0]: np.asarray(next(iter(inputs.values())))}
    missing = [n for n in names if n not in inputs]
    if missing:
        raise DataError(f"inputs {missing} are missing (given: {sorted(inputs)})",
                        hint=f"name the arrays as the model's inputs: {', '.join(names)}")
    return {n: np.asarray(inputs[n]) for n in names}


# the browser agent's runtimes (edgekit/agent/browser_bridge.py) -> the native runtime of the same project
NATIVE_OF_WEB = {"onnxruntime-web": "onnxruntime", "litert.js": "litert"}


def run_shipped(ship_dir: str | Path, inputs: Mapping[str, np.ndarray] | str | Path, *,
                threads: int | None = None) -> dict[str, np.ndarray]:
    """The shipped file's outputs (by the source model's output names) for ``inputs`` (arrays by the
    source model's input names, batch first, or an .npz of them), run as the device ran it."""

    rt = _read_json(Path(ship_dir) / "runtime.json")
    if rt.get("runtime") == "tflite-micro":  # a microcontroller's file: TFLite Micro's interpreter, as measured
        return _run_micro(Path(ship_dir), inputs)
    # a file shipped to a web page runs here on the same runtime's native build (the page's outputs were
    # checked against it: ONNX Runtime Web against onnxruntime, LiteRT.js against the LiteRT interpreter)
    shipped_runtime = str(rt.get("runtime"))
    runtime = NATIVE_OF_WEB.get(shipped_runtime, shipped_runtime)
    agent = load_agent()
    if runtime not in agent.runners.RUNNERS:  # checked first: a Core ML package is not even hashed here
        row = spec_for_runtime(str(runtime))
        raise BadInputError(f"{rt.get('file')} is a {row.label if row else str(runtime)} model: it runs on "
                            f"{runtime}, which edgekit's agent does not run on this host",
                            hint="run it on the device it was measured on (its ship.json names the target)")
    art, source_io, rt = shipped_model(ship_dir)
    stream = from_interface(_read_json(Path(ship_dir) / "ship.json")["interface"], source_io)
    feed = _feed(inputs, source_io, stream.fed if stream is not None else frozenset())
    with tempfile.TemporaryDirectory(prefix=".edgekit-run-") as tmp:
        x_path, y_path = Path(tmp) / "inputs.npz", Path(tmp) / "outputs.npz"
        np.savez(x_path, allow_pickle=True, **feed)  # numpy's default, named so no input array is read as it
        req = build_request(variant="run", artifact=art, model_remote=[str(f) for f in art.files],
                            source_io=source_io,
                            measure=MeasureDefaults(warmup=0, runs=1, min_seconds=0.0, threads=threads or rt.get("threads") or 1),
                            eval_remote=str(x_path), x_keys=list(feed), outputs_remote=str(y_path), runtime=runtime,
                            runtime_options=rt.get("options") or None, stream=stream)
        try:
            agent.measure.measure(req.wire())
        except agent.AgentFailure as exc:
            hint = ("install the runtime (edgekit doctor names its package)" if exc.kind == "runtime_missing" else
                    "check the inputs' shapes and dtypes against ship.json's interface")
            raise BadInputError(f"{runtime} could not run {art.path.name}: {exc.message}", hint=hint) from None
        ys = load_outputs(y_path)
    return {s.name: y for s, y in zip(source_io.outputs, ys)}


def _run_micro(ship_dir: Path, inputs: Mapping[str, np.ndarray] | str | Path) -> dict[str, np.ndarray]:
    """A microcontroller's shipped file through TFLite Micro's kernels with the arena the deploy measured."""
    from ..micro.interpreter import run_tflm

    art, source_io, _ = shipped_model(ship_dir)
    arena = int(_read_json(ship_dir / "ship.json")["micro"]["arena_bytes"])
    feed = _feed(inputs, source_io)
    ys = run_tflm(art.path, arena, art.io, list(feed.values()))
    return {s.name: y for s, y in zip(source_io.outputs, ys)}


__all__ = ["run_shipped", "shipped_model"]
