"""``out/ship/``: the file(s) to ship, its lineage and measured figures (ship.json), and the runtime
configuration the measured speed needs (runtime.json: runtime, threads, options, and the runtime API
settings that reproduce them, ``apply``: each runtime's function is named by its registry row,
``formats.FormatSpec.ship_apply``).

ship.json's ``interface`` is what it takes to call the file without edgekit's help: every input's name
in the file, the source model's name for it, its shape and dtype as the source takes it, the static
shape a fixed-shape file was converted at, and the transpose from the source's layout to the file's
(a TFLite file made by onnx2tf takes NHWC where the source took NCHW); every output's name in the file
and the source output it stands for, with the transpose back. ``edgekit run ship/`` (``run_shipped.py``)
feeds the file from this contract alone, exactly as the agent did.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..agent.browser_bridge import _WEB_LEVEL
from ..agent.browser_transport import HEADERS, RUNTIME_PACKAGE, litert_version, runtime_version
from ..artifact import Artifact, IOSpec, TensorSpec
from ..formats import load_named, spec_for_runtime
from ..fsutil import atomic_path, atomic_write_text, sha256_files
from ..inputs.source import model_batch
from ..inputs.stateful import of_artifact
from ..report.model import VariantResult

SHIP_SCHEMA = 2  # 2: ``interface`` (names, shapes, layouts, transposes, source names)
# a registry row's ship_apply: (threads, runtime options) -> runtime.json's "apply" section
ShipApply = Callable[[int, Mapping[str, Any]], dict[str, Any]]


def write_ship(out_dir: Path, v: VariantResult, art: Artifact, source_io: IOSpec) -> dict[str, Any]:
    """A fixed graph's ship folder: its files, and ship.json's interface (how to call it: names, shapes,
    layouts, transposes) and measured figures."""
    measured = {"p50_ms": v.latency_ms.p50 if v.latency_ms else None,
                "accuracy": v.accuracy.value if v.accuracy else None, "accuracy_drop": v.accuracy_drop, **_by_shape(v)}
    return write_file_set(out_dir, v, art, {"interface": interface(art, source_io), "measured": measured})


def write_file_set(out_dir: Path, v: VariantResult, art: Artifact, contract: dict[str, Any],
                   companions: Sequence[Path] = ()) -> dict[str, Any]:
    """The one ship writer, for every kind of model: the shipped file set (the model's files, same stem, so a
    runtime finds its companions such as OpenVINO's .bin beside its .xml; then ``companions``, a language
    model's tokenizer and configs) copied atomically into ``out_dir/ship/``; ship.json with the fields every
    ship folder has (the files, each one's and the set's hashes, format, precision, lineage) plus the kind's
    ``contract`` (a fixed graph's interface, a generator's calling convention); runtime.json with what the
    application must set for the measured speed; and the model files an earlier run shipped there removed."""
    ship_dir = out_dir / "ship"
    ship_dir.mkdir(parents=True, exist_ok=True)
    before = _shipped_files(ship_dir)
    dest = ship_dir / f"{v.name}{Path(art.path).suffix}"
    copies = [(src, dest.with_suffix(src.suffix)) for src in art.files] + [(f, ship_dir / f.name) for f in companions]
    for src, to in copies:
        with atomic_path(to) as tmp:
            shutil.copyfile(src, tmp)
    files = [to for _, to in copies]
    meta = {"schema": SHIP_SCHEMA, "variant": v.name, "file": str(dest), "files": [str(f) for f in files],
            "sha256": art.sha256, "set_sha256": sha256_files(files), "format": art.format.value,
            "precision": art.precision, "runtime": v.runtime.name, "lineage": art.lineage_dicts(), **contract}
    atomic_write_text(ship_dir / "ship.json", json.dumps(meta, indent=2))
    # what the application must set for the measured speed: the runtime, its threads and options,
    # and the runtime API settings they stand for (every one spelled out, defaults included)
    rt = {"runtime": v.runtime.name, "version": v.runtime.version, "threads": v.runtime.threads,
          "options": v.runtime.options or {}, "delegate": v.runtime.delegate, "file": dest.name,
          "apply": runtime_settings(v.runtime.name, v.runtime.threads or 1, v.runtime.options or {})}
    atomic_write_text(ship_dir / "runtime.json", json.dumps(rt, indent=2))
    # the model files a previous run shipped here (another variant's) go: ship/ holds one model
    for old in before - {f.resolve() for f in files}:
        old.unlink(missing_ok=True)
    return {"file": str(dest), "sha256": art.sha256, "runtime_config": str(ship_dir / "runtime.json")}


def write_nothing_shipped(out_dir: Path, task: str, reason: str) -> None:
    """A run that shipped nothing says so in ``ship/ship.json`` (``"shipped": false`` and the decision's reason),
    and the model files an earlier run shipped there go: ``edgekit run`` on the folder then answers that nothing
    shipped instead of running a file the new report does not stand behind."""
    ship_dir = out_dir / "ship"
    ship_dir.mkdir(parents=True, exist_ok=True)
    before = _shipped_files(ship_dir)
    meta = {"schema": SHIP_SCHEMA, "task": task, "shipped": False, "reason": reason,
            "report": str(out_dir / "report.json")}
    atomic_write_text(ship_dir / "ship.json", json.dumps(meta, indent=2))
    for name in ("runtime.json", *(p.name for p in before)):
        (ship_dir / name).unlink(missing_ok=True)


def nothing_shipped(ship_dir: Path) -> str | None:
    """Why the deploy that wrote ``ship_dir`` shipped nothing (None: it shipped a file, or it is no ship folder)."""
    try:
        meta = json.loads((Path(ship_dir) / "ship.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("shipped", True) is not False:
        return None
    return str(meta.get("reason") or "no variant qualified")


def _shipped_files(ship_dir: Path) -> set[Path]:
    """The model files the ship.json already in ``ship_dir`` names (only those: nothing else is removed)."""
    try:
        meta = json.loads((ship_dir / "ship.json").read_text())
        names = meta.get("files") or [meta["file"]]
    except (OSError, ValueError, KeyError, TypeError):
        return set()
    return {(ship_dir / Path(n).name).resolve() for n in names if isinstance(n, str)}


def interface(art: Artifact, source_io: IOSpec) -> dict[str, Any]:
    """How to call the file: per input and output, its name in the file and in the source model, the
    shape and dtype the source takes/gives (None: a dynamic axis), the static shape the file was
    converted at (in the source's layout), and the transpose that takes the source's layout to the
    file's (feed ``np.transpose(x, transpose)``; an output is brought back with the inverse). A streaming
    model's constant inputs (``constants``: fed unchanged with every call) and state (``state``: the input
    starts as zeros of ``shape`` and takes the named output after each call, one sample a call, in order)
    come from the run's --const/--state, recorded in the lineage (edgekit/inputs/stateful.py)."""
    fixed = art.fixed_shapes
    stream = of_artifact(art) or {}
    roles = {**{k: "constant" for k in stream.get("constants") or {}},
             **{s["input"]: "state" for s in stream.get("state") or []}}

    def entry(spec: TensorSpec, src: TensorSpec, kind: str) -> dict[str, Any]:
        d: dict[str, Any] = {"name": spec.name, "source_name": src.name, "dtype": spec.dtype, "source_dtype": src.dtype,
             "shape": list(src.shape), "layout": spec.layout, "transpose": list(spec.transpose) if spec.transpose else None}
        if kind == "input" and src.name in fixed:
            d["static_shape"], d["static_shape_from"] = fixed[src.name]
        if spec.scale is not None:
            d["quantization"] = {"scale": spec.scale, "zero_point": spec.zero_point}
        if kind == "input" and src.name in roles:
            d["role"] = roles[src.name]
        return d

    face: dict[str, Any] = {"inputs": [entry(s, src, "input") for s, src in zip(art.io.inputs, source_io.inputs)],
            "outputs": [entry(s, src, "output") for s, src in zip(art.io.outputs, source_io.outputs)],
            "batch": _batch(art, source_io, fixed, set(roles))}
    if stream:
        face.update(constants=stream["constants"], state=stream["state"],
                    batch=1 if stream["state"] else face["batch"],
                    **({"order": stream["order"]} if stream.get("order") else {}))
    return face


def _by_shape(v: VariantResult) -> dict[str, Any]:
    """Eval data at several sample shapes: the shapes the file was scored and timed at (per input,
    no batch axis), each bucket's sample count and p50, and the sample-weighted p50."""
    extra = (v.latency_ms.model_extra or {}) if v.latency_ms else {}
    if not extra.get("buckets"):
        return {}
    return {"weighted_p50_ms": extra.get("weighted_p50"),
            "by_shape": [{"shapes": b["shapes"], "samples": b["samples"], "p50_ms": b["p50"]} for b in extra["buckets"]]}


def _batch(art: Artifact, source_io: IOSpec, fixed: dict[str, tuple[list[int], str]],
           fed: frozenset[str] | set[str] = frozenset()) -> int | None:
    """The batch the file takes (None: any); a file with a static batch is fed that many samples a call.
    ``fixed`` is keyed by the source's input names (the file's may differ: 'serving_default_x:0');
    ``fed``: constant and state inputs, whose first axis is no batch."""

    return model_batch([fixed[src.name][0] if src.name in fixed else s.shape
                        for s, src in zip(art.io.inputs, source_io.inputs) if src.name not in fed])


def runtime_settings(runtime: str, threads: int, options: Mapping[str, Any]) -> dict[str, Any] | None:
    """How the application loads the shipped file to run it as it was measured: the runtime API
    call and every setting the agent's runner made for these threads and options (defaults spelled
    out, so a runtime whose defaults change does not change the shipped speed), from the runtime's
    registry row (``ship_apply``). None for a runtime the agent does not run."""
    if runtime == "onnxruntime-web":  # the browser page's runtimes (agent/browser_transport.py): no registry row
        return onnxruntime_web_apply(threads, options)
    if runtime == "litert.js":
        return litertjs_apply(threads, options)
    row = spec_for_runtime(runtime)
    if row is None or row.ship_apply is None:
        return None
    apply: ShipApply = load_named(row.ship_apply)
    return apply(threads, options)


_ORT_LEVELS = {"disable_all": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
               "all": "ORT_ENABLE_ALL"}


def onnxruntime_apply(threads: int, options: Mapping[str, Any]) -> dict[str, Any]:
    parallel = options.get("execution_mode") == "parallel"
    inter = int(options.get("inter_op_threads") or threads) if parallel else 1
    level = _ORT_LEVELS[options.get("graph_optimization_level", "all")]
    return {"call": "onnxruntime.InferenceSession(file, sess_options, providers=['CPUExecutionProvider'])",
            "sess_options": {"intra_op_num_threads": threads, "inter_op_num_threads": inter,
                             "execution_mode": "ORT_PARALLEL" if parallel else "ORT_SEQUENTIAL",
                             "graph_optimization_level": level}}


def onnxruntime_web_apply(threads: int, options: Mapping[str, Any]) -> dict[str, Any]:
    """What a web page sets to run the file as the browser agent measured it (device_agents/browser/agent.js)."""

    return {"package": f"{RUNTIME_PACKAGE}@{runtime_version()}", "script": "dist/ort.wasm.min.js",
            "env": {"ort.env.wasm.numThreads": threads, "ort.env.wasm.proxy": False},
            "call": "ort.InferenceSession.create(bytes, {executionProviders: ['wasm'], graphOptimizationLevel, "
                    "executionMode})",
            "session_options": {"graphOptimizationLevel": _WEB_LEVEL[options.get("graph_optimization_level", "all")],
                                "executionMode": options.get("execution_mode", "sequential")},
            # WASM threads need SharedArrayBuffer, which only a cross-origin isolated page has
            "headers": {k: v for k, v in HEADERS.items() if k.startswith("Cross-Origin")} if threads > 1 else {}}


def litertjs_apply(threads: int, options: Mapping[str, Any]) -> dict[str, Any]:
    """What a web page sets to run a .tflite as the browser agent measured it with LiteRT.js."""

    return {"package": f"@litertjs/core@{litert_version()}", "module": "dist/index.js",
            "import_map": {"@litertjs/wasm-utils": "<node_modules>/@litertjs/wasm-utils/dist/index.js"},
            "call": "await loadLiteRt('<node_modules>/@litertjs/core/wasm/'" + (", {threads: true}" if threads > 1
                                                                                 else "") + "); "
                    "await loadAndCompile(bytes, {accelerator: 'wasm', cpuOptions: {numThreads}})",
            "cpu_options": {"numThreads": threads},
            "tensors": "fed and returned by the file's signature names (model.getInputDetails()); Float32Array, "
                       "Int32Array or Uint8Array only",
            "headers": {k: v for k, v in HEADERS.items() if k.startswith("Cross-Origin")} if threads > 1 else {}}


def litert_apply(threads: int, options: Mapping[str, Any]) -> dict[str, Any]:
    off = options.get("xnnpack") == "off"
    if options.get("api") == "compiled":
        return {"call": "ai_edge_litert.compiled_model.CompiledModel.from_file(file, options=Options("
                        "hardware_accelerators=HardwareAccelerator.CPU, cpu_options=CpuOptions(...)))",
                "cpu_options": {"num_threads": threads, "kernel_mode": "BUILTIN" if off else None}}
    resolver = {"off": "BUILTIN_WITHOUT_DEFAULT_DELEGATES", "on": "BUILTIN"}.get(str(options.get("xnnpack")), "AUTO")
    return {"call": "ai_edge_litert.interpreter.Interpreter(model_path=file, num_threads, "
                    "experimental_op_resolver_type)",
            "num_threads": threads, "experimental_op_resolver_type": resolver}


def executorch_apply(threads: int, options: Mapping[str, Any]) -> dict[str, Any]:
    # the XNNPACK pool is process-wide and must be sized before the program loads
    return {"call": "executorch.extension.pybindings.portable_lib._unsafe_reset_threadpool(threads) before "
                    "the program loads (executorch.runtime.Runtime.get().load_program(file))",
            "threadpool_threads": threads}


def openvino_apply(threads: int, options: Mapping[str, Any]) -> dict[str, Any]:
    # the precision is what the CPU plugin ran at (read back by the agent), not the IR's weights' type
    cfg = {"INFERENCE_NUM_THREADS": threads, "ENABLE_CPU_PINNING": False,
           "PERFORMANCE_HINT": str(options.get("performance_hint", "latency")).upper(),
           "NUM_STREAMS": str(options.get("num_streams", 1))}
    if options.get("inference_precision"):
        cfg["INFERENCE_PRECISION_HINT"] = options["inference_precision"]
    return {"call": "openvino.Core().compile_model(file, 'CPU', config)  # the .bin beside the .xml", "config": cfg}


def ncnn_apply(threads: int, options: Mapping[str, Any]) -> dict[str, Any]:
    fp16 = options.get("fp16", "on") == "on"
    return {"call": "net = ncnn.Net(); set net.opt; net.load_param(file); net.load_model(the .bin)",
            "opt": {"num_threads": threads, "use_vulkan_compute": False, "use_fp16_storage": fp16,
                    "use_fp16_arithmetic": fp16, "use_fp16_packed": fp16,
                    **({} if fp16 else {"use_bf16_storage": False, "use_bf16_packed": False})},
            "batch": 1, "inputs": "in0, in1, ... (one sample each, no batch axis)", "outputs": "out0, out1, ..."}
