"""Issue #15 benchmark: runtime options as a search dimension, side by side. For the digits CNN and one
model of the test zoo (tests/models_zoo.py, default mobilenet), the fp32 file of each runtime (ONNX on
onnxruntime, TFLite on LiteRT, .pte on ExecuTorch) is measured by the real agent on the local device
under every setting the search tries (edgekit/variant_search/tuning.py ``settings_grid``: threads
1..cores, onnxruntime's optimization level and parallel mode, LiteRT's XNNPACK off and CompiledModel,
ExecuTorch's XNNPACK pool size), through the same DeviceSession.measure the search's tuning step
calls; a 64x64 conv net beside them (``--no-conv64`` leaves it out) shows the threads at a size where
they can pay. Printed: p50 (ms) per row and its ratio to that runtime's default row, with the CPU's ISA and
the host's load average (on a shared host other jobs move wall-clock figures, the multi-thread rows
most). A runtime that is not installed, or a setting the device refuses, is a row with the reason.

    .venv/bin/python benchmarks/runtime_options.py [--zoo mobilenet] [--runs 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_cpu.py
from _cpu import isa  # noqa: E402


def digits(work: Path) -> tuple[str, Path, Path]:
    sys.path.insert(0, str(ROOT / "examples" / "digits"))
    import train

    out = work / "digits"
    train.main(["--out", str(out), "--epochs", "12"])
    return "digits", out / "model.pt2", out / "eval.npz"


def zoo_model(name: str, work: Path) -> tuple[str, Path, Path]:
    from tests import models_zoo

    pt2, _calib, ev = models_zoo.export(name, work / name)
    return f"zoo:{name}", pt2, ev


def conv64(work: Path) -> tuple[str, Path, Path]:
    """Three 3x3 convs at 64x64 (about 0.5 ms a run here): a model big enough for a second thread to
    pay, where the digits CNN and the zoo's 16x16 nets are over in microseconds."""
    import numpy as np
    import torch
    from torch import nn

    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1, stride=2), nn.ReLU(),
                      nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(64, 10)).eval()
    out = work / "conv64"
    out.mkdir(parents=True, exist_ok=True)
    torch.export.save(torch.export.export(m, (torch.zeros(1, 3, 64, 64),)), out / "conv64.pt2")
    x = np.random.default_rng(0).standard_normal((16, 3, 64, 64)).astype(np.float32)
    with torch.no_grad():
        y = m(torch.from_numpy(x)).argmax(1).numpy()
    np.savez(out / "eval.npz", x=x, y=y)
    return "conv64", out / "conv64.pt2", out / "eval.npz"


def build(pt2: Path, ev: Path, work: Path) -> tuple[object, object, dict]:
    """The source and its fp32 file per runtime (or why that file could not be built)."""
    import numpy as np

    from edgekit.convert.torch_to_onnx import export_onnx
    from edgekit.inputs.source import load_onnx, load_pt2

    work.mkdir(parents=True, exist_ok=True)
    src = load_pt2(pt2)
    xs = [np.load(ev)["x"][:16]]
    arts: dict[str, object] = {}
    onnx = load_onnx(Path(export_onnx(src, work / f"{pt2.stem}.onnx", xs).path)).artifact
    arts["onnxruntime"] = onnx
    try:
        from edgekit.convert.onnx_to_tflite import TfliteConfig, onnx_to_tflite

        arts["litert"] = onnx_to_tflite(onnx, work / f"{pt2.stem}.tflite", TfliteConfig(), parity_inputs=xs)
    except Exception as exc:  # a batch: a missing extra or a failed hop is this runtime's reason
        arts["litert"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    try:
        from edgekit.convert.torch_to_executorch import available, torch_to_executorch

        arts["executorch"] = (torch_to_executorch(src, work / f"{pt2.stem}.pte", parity_inputs=xs)
                              if available() else "executorch is not installed (pip install 'edgekit[executorch]')")
    except Exception as exc:
        arts["executorch"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return src, onnx, arts


def measure_rows(src, ev: Path, arts: dict, runs: int) -> dict[str, list[dict]]:
    from edgekit.devices.session import DeviceSession, MeasureFailure, RunSettings
    from edgekit.inputs.data import load_npz
    from edgekit.inputs.targets import MeasureDefaults, load_target
    from edgekit.metrics import MetricSpec
    from edgekit.metrics.evaluate import eval_plan
    from edgekit.variant_search.tuning import label, settings_grid

    target = load_target("local")
    cores = os.cpu_count() or target.cores
    ds = load_npz(ev, x_key="x", y_key="y", require_labels=False, role="eval")
    md = MeasureDefaults(warmup=20, runs=runs, min_seconds=1.0, max_runs=runs, threads=1)
    out: dict[str, list[dict]] = {}
    with DeviceSession(target, None, source_io=src.artifact.io, plan=eval_plan(MetricSpec(), src, ds)) as s:
        for runtime, art in arts.items():
            if isinstance(art, str):
                out[runtime] = [{"row": "-", "p50_ms": None, "reason": art}]
                continue
            rows = []
            for g in settings_grid(runtime, cores, None):
                name = label("fp32", g, 1)
                load = os.getloadavg()[0]
                r = s.measure(name, art, RunSettings(measure=md.model_copy(update={"threads": g["threads"]}),
                                                     with_eval=False, cached=False,
                                                     runtime_options=g["options"] or None))
                if isinstance(r, MeasureFailure):
                    rows.append({"row": name, "p50_ms": None, "reason": f"{r.kind}: {r.message[:160]}"})
                    continue
                v = r.result
                rows.append({"row": name, "threads": v.runtime.threads, "options": v.runtime.options or {},
                             "delegate": v.runtime.delegate, "p50_ms": v.latency_ms.p50,
                             "ci95": v.latency_ms.ci95, "runs": v.latency_ms.runs, "load_avg_1m": load})
            out[runtime] = rows
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zoo", default="mobilenet", help="a tests/models_zoo.py model")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--no-conv64", action="store_true", help="leave out the 64x64 conv net (threads matter there)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="edgekit-runtime-options-"))
    os.environ["EDGEKIT_HOME"] = str(work / "home")  # fresh caches: every figure measured in this run
    os.environ.setdefault("EDGEKIT_LOCAL_DEVICE_DIR", str(work / "device"))
    os.environ["EDGEKIT_NO_MEASURE_CACHE"] = "1"
    result = {"isa": isa(), "cores": os.cpu_count(), "models": {}}
    print(f"CPU: {result['isa']}; {result['cores']} cores; agent p50 per setting (ms), x = default row / this row")
    models = [digits(work), zoo_model(args.zoo, work)] + ([] if args.no_conv64 else [conv64(work)])
    for name, pt2, ev in models:
        t0 = time.perf_counter()
        src, _onnx, arts = build(pt2, ev, work / name.replace(":", "-"))
        rows = measure_rows(src, ev, arts, args.runs)
        result["models"][name] = rows
        print(f"\n== {name} (input {list(src.artifact.io.inputs[0].shape)}), {time.perf_counter() - t0:.0f} s")
        for runtime, rs in rows.items():
            base = next((r["p50_ms"] for r in rs if r["row"] == "fp32" and r["p50_ms"]), None)
            print(f"   {runtime}")
            for r in rs:
                if r["p50_ms"] is None:
                    print(f"     {r['row']:28} {'-':>9}  {r['reason']}")
                    continue
                lo, hi = r["ci95"] or (None, None)
                ci = f"[{lo:.4f}, {hi:.4f}]" if lo is not None else ""
                x = f"{base / r['p50_ms']:5.2f}x" if base else ""
                # threads and delegate as the agent reported them (ExecuTorch: its pool's size, read back)
                print(f"     {r['row']:28} {r['p50_ms']:9.4f}  {x:6} ci95 {ci:22} threads {r['threads']} "
                      f"delegate {r['delegate'] or '-':8} load {r['load_avg_1m']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
