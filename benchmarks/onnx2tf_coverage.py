"""Does edgekit cover at least what onnx2tf covers by itself? Side by side on ONNX models nobody here
wrote: the ONNX package's own backend test models (``onnx/backend/test/data``: ``pytorch-converted``,
``pytorch-operator`` with their ``test_data_set_0/input_*.pb`` inputs, and the ``light`` zoo models,
which ship no inputs and get seeded standard-normal ones), nothing downloaded.

For each model, in a fresh worker process (one TensorFlow import per model, a timeout per model):
  plain     ``onnx2tf.convert(input_onnx_file_path=..., output_folder_path=...)`` with its defaults, then its
            model_float32.tflite run on the model's own inputs (each input fed as the shape the .tflite asks,
            channels-last when that is what it takes) and held to edgekit's fp32 tolerance vs onnxruntime;
            onnx2tf's sample-image file is put in its working folder, as it looks there first (offline machine);
  edgekit   ``edgekit convert MODEL --to tflite --eval-data INPUTS.npz --out ...`` (exit 0 = within parity on
            those inputs, every output);
  no-data   ``edgekit convert MODEL --to tflite --out ...`` without data where every input size is static, and
            the result then checked on the model's own inputs with edgekit's recorded layout.
A traceback is an exception escaping edgekit's CLI (must be 0); every other failure must be exit 2.

    .venv/bin/python benchmarks/onnx2tf_coverage.py            # the default subset (~40 models, < 10 min on 2 cores)
    .venv/bin/python benchmarks/onnx2tf_coverage.py --all      # every pytorch-converted/-operator and light model
    .venv/bin/python benchmarks/onnx2tf_coverage.py --only Conv2d,light_squeezenet --verbose

Prints one line per model, the counts converted-within-parity for each, the models where edgekit loses,
the tracebacks and the CPU ISA (avx2 / avx512f / avx512_vnni) beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_cpu.py
from _cpu import isa  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_FILE = "calibration_image_sample_data_20x128x128x3_float32.npy"

# The default subset: every family of op the suite has (conv 1/2/3-D, depthwise, grouped, transposed, pools,
# batchnorm, pads, activations, softmax, gemm/matmul, reshapes, broadcasting, multi-input/-output), small
# enough for ~10 minutes on 2 cores. --all runs every model.
DEFAULT = [
    "test_AvgPool1d", "test_AvgPool2d_stride", "test_AvgPool3d", "test_BatchNorm1d_3d_input_eval",
    "test_BatchNorm2d_eval", "test_ConstantPad2d", "test_Conv1d", "test_Conv1d_groups", "test_Conv2d",
    "test_Conv2d_depthwise_strided", "test_Conv2d_dilated", "test_Conv2d_groups", "test_Conv3d_stride",
    "test_ConvTranspose2d", "test_ELU", "test_Embedding", "test_GLU_dim", "test_LeakyReLU", "test_Linear",
    "test_Linear_no_bias", "test_LogSoftmax", "test_MaxPool1d_stride", "test_MaxPool2d", "test_MaxPool3d_stride",
    "test_PReLU_2d_multiparam", "test_PixelShuffle", "test_ReflectionPad2d", "test_SELU", "test_Softmax",
    "test_Softplus", "test_Tanh", "test_softmax_lastdim",
    "test_operator_add_broadcast", "test_operator_addmm", "test_operator_chunk", "test_operator_concat2",
    "test_operator_conv", "test_operator_flatten", "test_operator_maxpool", "test_operator_mm",
    "test_operator_non_float_params", "test_operator_pow", "test_operator_reduced_mean_keepdim",
    "test_operator_repeat", "test_operator_symbolic_override", "test_operator_symbolic_override_nested",
    "test_operator_view",
    "light_squeezenet", "light_bvlc_alexnet",
]


def backend_data() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("onnx")
    return Path(list(spec.submodule_search_locations)[0]) / "backend" / "test" / "data"


def suite(all_models: bool) -> list[tuple[str, Path]]:
    d = backend_data()
    models = []
    for sub in ("pytorch-converted", "pytorch-operator"):
        for m in sorted((d / sub).glob("*/model.onnx")):
            models.append((m.parent.name, m))
    for m in sorted((d / "light").glob("*.onnx")):
        models.append((m.stem, m))
    if not all_models:
        keep = set(DEFAULT)
        models = [m for m in models if m[0] in keep]
    return models


# --------------------------------------------------------------------------- worker (one model)
def _model_inputs(model_path: Path):
    """The model's own inputs (test_data_set_0/input_*.pb), else seeded standard-normal ones."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(model_path), load_external_data=False)
    init = {i.name for i in m.graph.initializer}
    ins = [v for v in m.graph.input if v.name not in init]
    files = sorted((model_path.parent / "test_data_set_0").glob("input_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
    if files and model_path.name == "model.onnx":
        xs = []
        for f in files:
            t = onnx.TensorProto()
            t.ParseFromString(f.read_bytes())
            xs.append(numpy_helper.to_array(t))
        return [v.name for v in ins], xs, "own"
    rng = np.random.default_rng(0)
    xs = []
    for v in ins:
        shape = [d.dim_value or 1 for d in v.type.tensor_type.shape.dim]
        xs.append(rng.standard_normal(shape).astype(np.float32))
    return [v.name for v in ins], xs, "seeded"


def _plain(model_path: Path, names, xs, work: Path) -> dict:
    """onnx2tf with its defaults, then its fp32 .tflite on the inputs vs onnxruntime."""
    import numpy as np
    import onnxruntime as ort

    from edgekit.convert.parity import compare

    rng = np.random.default_rng(0)
    wd = work / "plain"
    wd.mkdir()
    np.save(wd / SAMPLE_FILE, rng.random((20, 128, 128, 3)).astype(np.float32))
    old = os.getcwd()
    os.chdir(wd)
    try:
        import onnx2tf

        onnx2tf.convert(input_onnx_file_path=str(model_path), output_folder_path=str(wd / "out"), non_verbose=True)
    except BaseException as exc:  # onnx2tf raises anything, or sys.exit(1)
        return {"ok": False, "error": f"convert: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"}
    finally:
        os.chdir(old)
    tfl = next(iter(sorted((wd / "out").glob("*_float32.tflite"))), None)
    if tfl is None:
        return {"ok": False, "error": "no float32 .tflite written"}
    so = ort.SessionOptions()
    so.log_severity_level = 3
    try:
        sess = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
        refs = sess.run(None, dict(zip(names, xs)))
    except Exception as exc:  # onnxruntime cannot run it (old opsets): the outputs the model ships
        import onnx
        from onnx import numpy_helper

        files = sorted((model_path.parent / "test_data_set_0").glob("output_*.pb"),
                       key=lambda p: int(p.stem.split("_")[1]))
        if not files:
            return {"ok": False, "error": f"no reference: onnxruntime: {str(exc).splitlines()[0][:160]}"}
        refs = [numpy_helper.to_array(onnx.load_tensor(str(f))) for f in files]
    try:
        from ai_edge_litert.interpreter import Interpreter

        it = Interpreter(model_path=str(tfl))
        it.allocate_tensors()
        dets = it.get_input_details()
        by_name = {d["name"]: d for d in dets}
        order = [next((d for n_, d in by_name.items() if n_.endswith(name) or name in n_), None) for name in names]
        if any(d is None for d in order) or len({id(d) for d in order}) != len(order):
            order = list(dets)
        for d, x in zip(order, xs):
            want = tuple(int(v) for v in d["shape"])
            if x.shape != want and x.ndim >= 3 and np.transpose(x, (0, *range(2, x.ndim), 1)).shape == want:
                x = np.transpose(x, (0, *range(2, x.ndim), 1))
            it.set_tensor(d["index"], np.ascontiguousarray(x.reshape(want).astype(d["dtype"])))
        it.invoke()
        gots = [it.get_tensor(o["index"]) for o in it.get_output_details()]
    except Exception as exc:  # a model the interpreter cannot run or feed
        return {"ok": False, "error": f"run: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"}
    worst, used = [], set()
    for ref in refs:  # each ONNX output: the .tflite output (as is or channels-first again) closest to it
        best = None
        for j, g in enumerate(gots):
            if j in used:
                continue
            cands = [g] + ([np.transpose(g, (0, g.ndim - 1, *range(1, g.ndim - 1)))] if g.ndim >= 3 else [])
            for c in cands:
                if c.size == ref.size:
                    try:
                        p = compare(ref, c.reshape(ref.shape), "onnx")
                    except Exception:  # shapes that do not fit: not this one
                        continue
                    v = p.violations("fp32")
                    if best is None or (len(v), p.max_abs_err) < (len(best[1]), best[0].max_abs_err):
                        best = (p, v, j)
        if best is None:
            return {"ok": False, "error": "no .tflite output has the shape of an ONNX output"}
        used.add(best[2])
        worst.append(best)
    bad = [v for _, vs, _ in worst for v in vs]
    return {"ok": not bad, "error": ("parity: " + "; ".join(bad)) if bad else None}


def _edgekit(model_path: Path, args: list[str]) -> dict:
    """`edgekit convert` in this process; an exception escaping the CLI is a traceback."""
    import contextlib
    import io

    from edgekit.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["convert", str(model_path), *args])
    except BaseException:  # what a user would see as a Python traceback
        return {"ok": False, "code": None, "traceback": traceback.format_exc()[-1500:], "error": "traceback"}
    text = err.getvalue().strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    msg = next((ln for ln in lines if ln.startswith("error")), lines[-1] if lines else "")
    return {"ok": code == 0, "code": code, "traceback": None, "error": None if code == 0 else msg[:300],
            "stdout": out.getvalue()}


def worker(model: str, out_json: str) -> None:
    import numpy as np

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    model_path = Path(model)
    res: dict = {}
    with tempfile.TemporaryDirectory(prefix="o2t-cov-") as tmp:
        work = Path(tmp)
        names, xs, kind = _model_inputs(model_path)
        res["inputs"] = kind
        t = time.perf_counter()
        res["plain"] = _plain(model_path, names, xs, work)
        res["plain"]["seconds"] = round(time.perf_counter() - t, 1)
        keys = [f"x{i}" for i in range(len(xs))]
        data = work / "inputs.npz"
        np.savez(data, **dict(zip(keys, xs)))
        t = time.perf_counter()
        res["edgekit"] = _edgekit(model_path, ["--to", "tflite", "--eval-data", str(data), "--x-key", ",".join(keys),
                                               "--out", str(work / "ek" / "m.tflite")])
        res["edgekit"]["seconds"] = round(time.perf_counter() - t, 1)
        res["edgekit"].pop("stdout", None)
        import onnx

        from edgekit.convert.opcheck import dynamic_dims

        m = onnx.load(str(model_path), load_external_data=False)
        static = not dynamic_dims(m) and all(
            d.HasField("dim_value") for v in m.graph.input for d in v.type.tensor_type.shape.dim)
        if static:
            t = time.perf_counter()
            r = _edgekit(model_path, ["--to", "tflite", "--json", "--out", str(work / "nd" / "m.tflite")])
            if r["ok"]:  # and on the model's own inputs, with the layout edgekit recorded
                try:
                    from edgekit.artifact import IOSpec
                    from edgekit.convert.onnx_to_tflite import run_tflite_all
                    from edgekit.convert.parity import compare_outputs, parity_metrics
                    from edgekit.inputs.source import ort_reference_all

                    art = json.loads(r["stdout"].strip().splitlines()[-1])
                    io_ = IOSpec.model_validate(art["io"])
                    gots = run_tflite_all(Path(art["path"]), io_, xs)
                    refs = ort_reference_all(model_path)(xs)
                    pm = parity_metrics(compare_outputs(refs, gots, "onnx", [o.name for o in io_.outputs]), "fp32")
                    if pm["parity_violations"]:
                        r.update(ok=False, error="on its own inputs: " + "; ".join(pm["parity_violations"]))
                except Exception as exc:  # the cross-check itself failed: count it as not converted
                    r.update(ok=False, error=f"cross-check: {type(exc).__name__}: {exc}"[:300])
            r.pop("stdout", None)
            r["seconds"] = round(time.perf_counter() - t, 1)
            res["nodata"] = r
        else:
            res["nodata"] = None
    Path(out_json).write_text(json.dumps(res))


# --------------------------------------------------------------------------- driver
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="every model of the suite (about 20-30 minutes on 2 cores)")
    ap.add_argument("--only", default="", help="comma-separated model names (substring match)")
    ap.add_argument("--timeout", type=float, default=240, help="seconds per model")
    ap.add_argument("--verbose", action="store_true", help="print each failure's message")
    ap.add_argument("--json", type=Path, default=None, help="write every result to this file")
    ap.add_argument("--worker", nargs=2, metavar=("MODEL", "OUT_JSON"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return 0
    models = suite(args.all or bool(args.only))
    if args.only:
        pats = [p for p in args.only.split(",") if p]
        models = [m for m in models if any(p in m[0] for p in pats)]
    print(f"CPU ISA: {isa()}  ({os.cpu_count()} cores)  suite: {len(models)} models from {backend_data()}")
    print(f"{'model':<42} {'in':<6} {'plain':<7} {'edgekit':<8} {'no-data':<8} {'s':>6}")
    results = {}
    t0 = time.perf_counter()
    for name, path in models:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out_json = f.name
        t = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, __file__, "--worker", str(path), out_json], capture_output=True,
                                  text=True, timeout=args.timeout, cwd=tempfile.gettempdir())
            r = json.loads(Path(out_json).read_text()) if proc.returncode == 0 and Path(out_json).stat().st_size else \
                {"crash": f"worker exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:] if proc.stderr.strip() else ''}"}
        except subprocess.TimeoutExpired:
            r = {"crash": f"timeout after {args.timeout:.0f} s"}
        finally:
            Path(out_json).unlink(missing_ok=True)
        r["seconds"] = round(time.perf_counter() - t, 1)
        results[name] = r

        def mark(x):
            if x is None:
                return "-"
            return "ok" if x.get("ok") else ("TRACEB" if x.get("traceback") else "fail")

        if "crash" in r:
            print(f"{name:<42} {'?':<6} CRASH: {r['crash']}")
            continue
        print(f"{name:<42} {r['inputs']:<6} {mark(r['plain']):<7} {mark(r['edgekit']):<8} {mark(r['nodata']):<8} "
              f"{r['seconds']:6.1f}", flush=True)
        if args.verbose:
            for k in ("plain", "edgekit", "nodata"):
                x = r.get(k)
                if x and not x.get("ok"):
                    print(f"    {k}: {x.get('error')}" + (f"\n{x['traceback']}" if x.get("traceback") else ""))
    done = {k: v for k, v in results.items() if "crash" not in v}
    plain = sum(bool(v["plain"]["ok"]) for v in done.values())
    ek = sum(bool(v["edgekit"]["ok"]) for v in done.values())
    nd_all = [v["nodata"] for v in done.values() if v["nodata"] is not None]
    nd = sum(bool(x["ok"]) for x in nd_all)
    tracebacks = [k for k, v in done.items() if any((v.get(s) or {}).get("traceback") for s in ("edgekit", "nodata"))]
    not_exit2 = [k for k, v in done.items() if any((v.get(s) or {}).get("code") not in (0, 2, None)
                                                    for s in ("edgekit", "nodata"))]
    loses = [k for k, v in done.items() if v["plain"]["ok"] and not v["edgekit"]["ok"]]
    wins = [k for k, v in done.items() if v["edgekit"]["ok"] and not v["plain"]["ok"]]
    print()
    print(f"CPU ISA: {isa()}")
    print(f"models run: {len(done)} of {len(results)} (crashed/timed out: {len(results) - len(done)})")
    print(f"converted within fp32 parity vs onnxruntime on the model's inputs:")
    print(f"  plain onnx2tf (defaults)       {plain:3d} / {len(done)}")
    print(f"  edgekit convert --eval-data    {ek:3d} / {len(done)}   (ratio edgekit/plain {ek / max(plain, 1):.2f})")
    print(f"  edgekit convert, no data       {nd:3d} / {len(nd_all)} (static-shape models)")
    print(f"edgekit loses (plain ok, edgekit not): {len(loses)} {loses}")
    for k in loses:
        print(f"    {k}: {done[k]['edgekit'].get('error')}")
    print(f"edgekit wins (edgekit ok, plain not):  {len(wins)} {wins if len(wins) <= 12 else ''}")
    print(f"tracebacks: {len(tracebacks)} {tracebacks}   other exit codes than 0/2: {len(not_exit2)} {not_exit2}")
    print(f"wall time: {time.perf_counter() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
