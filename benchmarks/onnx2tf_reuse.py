"""The short search's TFLite builds with and without onnx2tf's run reused (edgekit/convert/onnx2tf_runs.py).

For each test-zoo model (transformers architectures trained here), in this one process: the fp32 ONNX export,
then the short search's three TFLite candidates (``tflite-fp32``, ``tflite-int8``, ``tflite-dynamic``) built
twice, side by side: once with onnx2tf's run dropped before each build (as before: onnx2tf per candidate), once
reused (onnx2tf for the first, its SavedModel for the others). Prints seconds per build, the ratio, and the
CPU ISA beside them. Parity of every file is the hop's own check (a build that misses it fails here).

    .venv/bin/python benchmarks/onnx2tf_reuse.py                 # cnn, text, seg
    .venv/bin/python benchmarks/onnx2tf_reuse.py --models det,audio
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cpu import isa  # noqa: E402

CANDIDATES = {"tflite-fp32": {}, "tflite-int8": {"precision": "int8", "io": "float"},
              "tflite-dynamic": {"precision": "int8", "quantization": "dynamic"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="cnn,text,seg")
    a = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from edgekit.convert import onnx2tf_runs
    from edgekit.convert.chain import convert_to_tflite
    from edgekit.convert.onnx_to_tflite import TfliteConfig
    from edgekit.convert.torch_to_onnx import export_onnx
    from edgekit.errors import ConversionError
    from edgekit.inputs.data import load_npz
    from edgekit.inputs.source import load_source
    from tests import zoo

    print(f"CPU: {isa()}; {len(os.sched_getaffinity(0))} usable cores")
    for name in a.models.split(","):
        m = zoo.get(name)
        with tempfile.TemporaryDirectory() as td:
            d = Path(td)
            src = load_source(m.pt2, workdir=d)
            ev = load_npz(m.eval, x_key=tuple(m.input_names))
            cal = load_npz(m.calib, x_key=tuple(m.input_names), y_key=None, require_labels=False, role="calib")
            onnx_art = export_onnx(src, d / "fp32.onnx", list(ev.xs))
            totals = {}
            # untimed: the first conversion in a process also pays TensorFlow's start-up
            convert_to_tflite(onnx_art, d / "warm-up.tflite", TfliteConfig(), source=src, parity_inputs=list(ev.xs))
            for mode in ("per-build", "reused"):
                onnx2tf_runs.forget()
                row = []
                t_all = time.perf_counter()
                for cand, cfg in CANDIDATES.items():
                    if mode == "per-build":
                        onnx2tf_runs.forget()
                    t0 = time.perf_counter()
                    # the routes in order, as the search's convert step runs them (chain.py)
                    try:
                        art = convert_to_tflite(onnx_art, d / f"{mode}-{cand}.tflite", TfliteConfig(**cfg),
                                                source=src, calib=cal, parity_inputs=list(ev.xs))
                    except ConversionError:  # as in the search: that candidate is dropped at build
                        row.append(f"{cand} {time.perf_counter() - t0:5.1f} s (failed)")
                        continue
                    reused = art.lineage[-1].metrics.get("onnx2tf_reused", False)
                    row.append(f"{cand} {time.perf_counter() - t0:5.1f} s{' (reused)' if reused else ''}")
                totals[mode] = time.perf_counter() - t_all
                print(f"{name:7s} {mode:9s} {totals[mode]:6.1f} s: " + "; ".join(row), flush=True)
            print(f"{name:7s} three TFLite builds: {totals['per-build'] / totals['reused']:.2f}x faster with the "
                  f"run reused ({isa()})", flush=True)


if __name__ == "__main__":
    main()
