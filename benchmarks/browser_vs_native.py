"""The same file in a web page and natively, side by side in one run: p50 latency of ONNX Runtime Web and of
LiteRT.js (WASM, SIMD; 1 and 2 threads) in this host's headless Chromium against native onnxruntime and the
native LiteRT interpreter (1 and 2 threads), per model (its .onnx, and the .tflite `edgekit convert` makes of
it), the settings interleaved over rounds so load drifts hit them alike.

Both sides get the same agent request (edgekit/agent/protocol.py): the native side runs the device agent in
this process (``measure``), the browser side the page agent (edgekit/agent/browser_bridge.py). Models: the
digits CNN (examples/digits, `bash examples/digits/run.sh` makes it) and the perf-style MobileNetV2 at 64x64
(random weights: latency only).

    .venv/bin/python benchmarks/browser_vs_native.py [--rounds 3] [--docs]

``--docs`` writes the table into docs/benchmarks/browser-and-fleet.md (its ``browser_vs_native`` section).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _cpu import isa  # noqa: E402


def _onnx_models(d: Path, skipped: list[str]) -> dict[str, Path]:
    import torch
    from mobilenet import MobileNetV2

    out = {}
    digits = ROOT / "examples/digits/artifacts/model.pt2"
    if digits.is_file():
        from edgekit.cli.main import main as edgekit

        if edgekit(["convert", str(digits), "--to", "onnx", "--out", str(d / "digits.onnx")]) == 0:
            out["digits CNN 8x8"] = d / "digits.onnx"
        else:
            skipped.append("digits CNN 8x8 (`edgekit convert --to onnx` failed)")
    else:
        print(f"(digits CNN skipped: {digits} is missing; bash examples/digits/run.sh makes it)")
        skipped.append("digits CNN 8x8 (examples/digits/artifacts/model.pt2 missing)")
    m = MobileNetV2(num_classes=10).eval()
    torch.onnx.export(m, (torch.randn(1, 3, 64, 64),), str(d / "mobilenet.onnx"), input_names=["x"],
                      output_names=["y"], dynamo=False)
    out["MobileNetV2 64x64"] = d / "mobilenet.onnx"
    return out


def _tflite(onnx_file: Path) -> Path | None:
    from edgekit.cli.main import main as edgekit

    out = onnx_file.with_suffix(".tflite")
    return out if edgekit(["convert", str(onnx_file), "--to", "tflite", "--out", str(out)]) == 0 else None


def _request(model: Path, d: Path, threads: int) -> Path:
    from edgekit.fsutil import sha256_file

    if model.suffix == ".onnx":
        import onnx

        g = onnx.load(str(model)).graph
        inits = {i.name for i in g.initializer}
        ins = [{"name": i.name, "dtype": "float32", "shape": [x.dim_value or 1 for x in i.type.tensor_type.shape.dim]}
               for i in g.input if i.name not in inits]
    else:  # timing only: random inputs in the file's own layout
        from ai_edge_litert.interpreter import Interpreter

        ins = [{"name": i["name"], "dtype": "float32", "shape": [int(v) for v in i["shape"]]}
               for i in Interpreter(model_path=str(model)).get_input_details()]
    req = {"protocol": 2, "variant": model.stem, "model": str(model), "model_sha256": sha256_file(model),
           "format": model.suffix[1:], "runtime": "onnxruntime" if model.suffix == ".onnx" else "litert",
           "threads": threads, "warmup": 20, "runs": 100, "min_seconds": 2.0, "inputs": ins, "outputs": []}
    p = d / f"{model.stem}-{model.suffix[1:]}-t{threads}.json"
    p.write_text(json.dumps(req))
    return p


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--docs", action="store_true",
                    help="write the table into docs/benchmarks/browser-and-fleet.md (its browser_vs_native section)")
    args = ap.parse_args(argv)
    from edgekit.agent.browser_bridge import measure_in_page
    from edgekit.agent.browser_transport import BrowserTransport
    from edgekit.agent.inprocess import load_agent

    agent = load_agent()
    load = [os.getloadavg()[0]]  # the host's 1-minute load average at the start and the end (a shared host)
    with tempfile.TemporaryDirectory(prefix="edgekit-bench-browser-") as td:
        t = BrowserTransport(Path(td) / "device")
        try:
            models = {}  # (model, format) -> the file in the served folder: the page fetches it
            skipped: list[str] = []  # what the table cannot show, and why
            for name, made in _onnx_models(Path(td), skipped).items():
                for f in (made, _tflite(made)):
                    if f is None:
                        print(f"({name}: no .tflite, `edgekit convert` failed)")
                        skipped.append(f"{name} .tflite (`edgekit convert --to tflite` failed)")
                        continue
                    models[(name, f.suffix[1:])] = Path(t.workdir) / f.name
                    shutil.copyfile(f, models[(name, f.suffix[1:])])
            sides = {"onnx": ("native onnxruntime", "ONNX Runtime Web"), "tflite": ("native LiteRT", "LiteRT.js")}
            p50, versions = {}, {}
            for _r in range(args.rounds):
                for (name, fmt), model in models.items():
                    for threads in (1, 2):
                        req = _request(model, Path(td), threads)
                        native = agent.measure.measure(json.loads(req.read_text()))
                        web, code = measure_in_page(t.page, str(req), timeout=600)
                        if code != 0:
                            raise SystemExit(f"{name} ({fmt}) t{threads} in the browser: {web['error']}")
                        for side, doc in zip(sides[fmt], (native, web)):
                            p50.setdefault((name, fmt, threads, side), []).append(
                                statistics.median(doc["latency_ms"]["raw"]))
                            versions[side] = doc["runtime"]["version"]
                        feats = web["runtime"]["features"]
            load.append(os.getloadavg()[0])
            setup = (f"browser: Chromium {t.page.version} (WASM SIMD {feats['wasm_simd']}, threads "
                     f"{feats['wasm_threads']}); " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
                     + f"; median of {args.rounds} rounds' p50; {os.cpu_count()} CPUs, load average "
                     f"{load[0]:.2f} at the start, {load[1]:.2f} at the end")
            print(f"CPU: {isa()}; {setup}")
            print(f"{'model':22} {'thr':>3} {'native':>18} {'p50 ms':>8} {'in the page':>16} {'p50 ms':>8} "
                  f"{'page/native':>11}")
            rows = []
            for (name, fmt) in models:
                for threads in (1, 2):
                    nat, page = sides[fmt]
                    n = statistics.median(p50[(name, fmt, threads, nat)])
                    w = statistics.median(p50[(name, fmt, threads, page)])
                    rows.append((name, fmt, threads, nat, n, page, w, p50[(name, fmt, threads, nat)],
                                 p50[(name, fmt, threads, page)]))
                    print(f"{name:22} {threads:>3} {nat:>18} {n:8.4f} {page:>16} {w:8.4f} {w / n:10.2f}x")
        finally:
            t.close()
    if args.docs:
        from _docs import write_section

        write_section(ROOT / "docs" / "benchmarks" / "browser-and-fleet.md", "browser_vs_native",
                      docs_table(setup, rows, skipped))


def docs_table(setup: str, rows: list[tuple], skipped: list[str]) -> str:
    """The printed table as markdown (the docs page's section)."""
    lines = [setup[0].upper() + setup[1:] + ". The p50 cells: the median of the rounds' p50, then the rounds' "
             "lowest and highest.", "",
             "| model | file | threads | native | native p50 ms | in the page | page p50 ms | page / native |",
             "|---|---|---|---|---|---|---|---|"]

    def cell(med: float, seen: list[float]) -> str:
        return f"{med:.4f} ({min(seen):.4f}-{max(seen):.4f})" if len(seen) > 1 else f"{med:.4f}"

    for name, fmt, threads, nat, n, page, w, ns, ws in rows:
        lines.append(f"| {name} | .{fmt} | {threads} | {nat} | {cell(n, ns)} | {page} | {cell(w, ws)} "
                     f"| {w / n:.2f}x |")
    lines += [f"| {s} | | | | not measured | | not measured | |" for s in skipped]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
