"""The same ONNX file in a web page and natively, side by side in one run: p50 latency of ONNX Runtime Web
(WASM, SIMD; 1 and 2 threads) in this host's headless Chromium against native onnxruntime (1 and 2 threads),
per model, the settings interleaved over rounds so load drifts hit them alike.

Both sides get the same agent request (edgekit/agent/protocol.py): the native side runs the device agent in
this process (``measure``), the browser side the page agent (edgekit/agent/browser_bridge.py). Models: the
digits CNN (examples/digits, `bash examples/digits/run.sh` makes it) and the perf-style MobileNetV2 at 64x64
(random weights: latency only). LiteRT.js is not measured (not built yet).

    .venv/bin/python benchmarks/browser_vs_native.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _cpu import isa  # noqa: E402


def _onnx_models(d: Path) -> dict[str, Path]:
    import torch

    from mobilenet import MobileNetV2

    out = {}
    digits = ROOT / "examples/digits/artifacts/model.pt2"
    if digits.is_file():
        from edgekit.cli.main import main as edgekit

        if edgekit(["convert", str(digits), "--to", "onnx", "--out", str(d / "digits.onnx")]) == 0:
            out["digits CNN 8x8"] = d / "digits.onnx"
    else:
        print(f"(digits CNN skipped: {digits} is missing; bash examples/digits/run.sh makes it)")
    m = MobileNetV2(num_classes=10).eval()
    torch.onnx.export(m, (torch.randn(1, 3, 64, 64),), str(d / "mobilenet.onnx"), input_names=["x"],
                      output_names=["y"], dynamo=False)
    out["MobileNetV2 64x64"] = d / "mobilenet.onnx"
    return out


def _request(model: Path, d: Path, threads: int) -> Path:
    import onnx

    from edgekit.fsutil import sha256_file

    g = onnx.load(str(model)).graph
    inits = {i.name for i in g.initializer}
    ins = [{"name": i.name, "dtype": "float32", "shape": [x.dim_value or 1 for x in i.type.tensor_type.shape.dim]}
           for i in g.input if i.name not in inits]
    req = {"protocol": 2, "variant": model.stem, "model": str(model), "model_sha256": sha256_file(model),
           "format": "onnx", "runtime": "onnxruntime", "threads": threads, "warmup": 20, "runs": 100,
           "min_seconds": 2.0, "inputs": ins, "outputs": []}
    p = d / f"{model.stem}-t{threads}.json"
    p.write_text(json.dumps(req))
    return p


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    from edgekit.agent.browser_bridge import measure_in_page
    from edgekit.agent.inprocess import load_agent
    from edgekit.transport.browser import BrowserTransport

    agent = load_agent()
    with tempfile.TemporaryDirectory(prefix="edgekit-bench-browser-") as td:
        t = BrowserTransport(Path(td) / "device")
        try:
            models = {}
            for name, made in _onnx_models(Path(td)).items():  # into the served folder: the page fetches them
                models[name] = Path(t.workdir) / made.name
                shutil.copyfile(made, models[name])
            p50 = {}
            for r in range(args.rounds):
                for name, model in models.items():
                    for threads in (1, 2):
                        req = _request(model, Path(td), threads)
                        native = agent.measure(json.loads(req.read_text()))
                        web, code = measure_in_page(t.page, str(req), timeout=600)
                        if code != 0:
                            raise SystemExit(f"{name} t{threads} in the browser: {web['error']}")
                        for side, doc in (("native onnxruntime", native), ("ONNX Runtime Web", web)):
                            raw = doc["latency_ms"]["raw"]
                            p50.setdefault((name, threads, side), []).append(statistics.median(raw))
                            if side == "ONNX Runtime Web":
                                feats = doc["runtime"]["features"]
            print(f"CPU: {isa()}; browser: {t.page.version}; ONNX Runtime Web {web['runtime']['version']} "
                  f"(WASM SIMD {feats['wasm_simd']}, threads {feats['wasm_threads']}); native onnxruntime "
                  f"{native['runtime']['version']}; median of {args.rounds} rounds' p50")
            print(f"{'model':22} {'thr':>3} {'native p50 ms':>14} {'web p50 ms':>11} {'web/native':>10}")
            for name in models:
                for threads in (1, 2):
                    n = statistics.median(p50[(name, threads, "native onnxruntime")])
                    w = statistics.median(p50[(name, threads, "ONNX Runtime Web")])
                    print(f"{name:22} {threads:>3} {n:14.4f} {w:11.4f} {w / n:9.2f}x")
        finally:
            t.close()


if __name__ == "__main__":
    main()
