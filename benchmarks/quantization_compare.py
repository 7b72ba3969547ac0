"""INT8 side by side on the same model and eval set: what a user would pick instead
(onnxruntime's default ``quantize_static``), edgekit's accuracy-aware pass, and Intel Neural
Compressor's tuning (``--backend inc``). Prints accuracy, drop, size and latency (onnxruntime on
this host, 1 thread, batch 1, the variants measured interleaved in rounds so that load changes hit
all of them alike), for the digits CNN and for the same CNN with a built-in activation outlier
(the textbook case where plain INT8 collapses).

    python benchmarks/quantization_compare.py [--tolerance 0.5] [--rounds 5] [--json out.json] [--docs]

Needs examples/digits/artifacts (python examples/digits/train.py writes them). ``--docs`` writes the table into
docs/benchmarks/compression.md (its ``quantization_compare`` section).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_cpu.py
from _cpu import isa  # noqa: E402

ART = ROOT / "examples" / "digits" / "artifacts"
ARCH = f"{ROOT / 'examples' / 'digits' / 'model.py'}:DigitsCNN"


def outlier_model(pth: Path):
    import torch

    from edgekit.inputs.source import import_object

    m = import_object(ARCH)()
    m.load_state_dict(torch.load(pth, weights_only=True))

    class Outlier(torch.nn.Module):
        """Hidden unit 0 scaled by 1e4, the next layer's weights by 1e-4: same function in float."""

        def __init__(self, m):
            super().__init__()
            self.m = m
            s = torch.ones(64)
            s[0] = 1e4
            self.register_buffer("s", s)
            with torch.no_grad():
                m.head[3].weight[:, 0] /= 1e4

        def forward(self, x):
            return self.m.head[3](self.m.head[2](self.m.head[1](self.m.head[0](self.m.features(x)))) * self.s)

    return Outlier(m).eval()


def accuracy(path: Path, ev) -> float:
    from edgekit.inputs.source import ort_reference

    return float((ort_reference(path)(list(ev.xs)).argmax(1) == ev.y).mean() * 100)


def latencies(paths: dict[str, Path], x: np.ndarray, rounds: int, runs: int) -> dict[str, float]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    sessions = {k: ort.InferenceSession(str(p), so, providers=["CPUExecutionProvider"]) for k, p in paths.items()}
    feeds = {k: {s.get_inputs()[0].name: x} for k, s in sessions.items()}
    for k, s in sessions.items():
        for _ in range(20):
            s.run(None, feeds[k])
    per: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(rounds):
        for k, s in sessions.items():
            t = []
            for _ in range(runs):
                t0 = time.perf_counter()
                s.run(None, feeds[k])
                t.append(time.perf_counter() - t0)
            per[k].append(statistics.median(t) * 1000)
    return {k: statistics.median(v) for k, v in per.items()}


def run_case(name: str, pt2: Path, calib, ev, tol: float, work: Path, rounds: int, runs: int) -> list[dict]:
    from onnxruntime.quantization import quantize_static

    from edgekit.convert.torch_to_onnx import export_onnx
    from edgekit.errors import PassError
    from edgekit.inputs.source import load_pt2
    from edgekit.logs import quiet
    from edgekit.passes import PassContext, get_pass
    from edgekit.passes.quantize_ort import _Reader

    work.mkdir(parents=True, exist_ok=True)
    src = load_pt2(pt2)
    fp32 = export_onnx(src, work / "fp32.onnx", list(ev.xs))
    ctx = PassContext(workdir=work, calib=calib, eval=ev)
    rows: dict[str, dict] = {}
    paths = {"fp32": fp32.path}
    # what a user would write: quantize_static with its defaults
    t = time.perf_counter()
    with quiet("root", "onnxruntime"):
        quantize_static(str(fp32.path), str(work / "ort-default.onnx"),
                        _Reader([fp32.io.inputs[0].name], (calib.xs[0][:256],), ["float32"]))
    rows["ort quantize_static (defaults)"] = {"seconds": time.perf_counter() - t}
    paths["ort quantize_static (defaults)"] = work / "ort-default.onnx"
    t = time.perf_counter()
    try:
        aa = get_pass("quantize_accuracy_aware")(fp32, {"max_accuracy_drop": tol}, ctx, out_name="edgekit-aa")
        rows["edgekit accuracy-aware"] = {"seconds": time.perf_counter() - t,
                                          "float_ops": aa.lineage[-1].metrics["float_ops"]}
        paths["edgekit accuracy-aware"] = aa.path
    except PassError as exc:
        rows["edgekit accuracy-aware"] = {"seconds": time.perf_counter() - t, "error": exc.message}
    t = time.perf_counter()
    try:
        inc = get_pass("quantize_inc")(src.artifact, {"max_accuracy_drop": tol}, ctx, out_name="inc")
        rows["INC autotune (PT2E)"] = {"seconds": time.perf_counter() - t,
                                       "trials": inc.lineage[-1].metrics["trials"]}
        paths["INC autotune (PT2E)"] = inc.path
    except PassError as exc:
        rows["INC autotune (PT2E)"] = {"seconds": time.perf_counter() - t, "error": exc.message}
    lat = latencies(paths, np.ascontiguousarray(ev.xs[0][:1]), rounds, runs)
    base_acc = accuracy(fp32.path, ev)
    out = []
    for method in ["fp32", *rows]:
        r = {"case": name, "method": method, **rows.get(method, {})}
        if method in paths:
            acc = accuracy(paths[method], ev)
            r.update(accuracy=round(acc, 2), drop=round(base_acc - acc, 2),
                     size_kb=round(paths[method].stat().st_size / 1024, 1),
                     p50_ms=round(lat[method], 6), speedup=round(lat["fp32"] / lat[method], 2),
                     within_tolerance=base_acc - acc <= tol)
        out.append(r)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tolerance", type=float, default=0.5, help="accuracy points (default 0.5)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=300, help="timed runs per variant per round")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--docs", action="store_true",
                    help="write the table into docs/benchmarks/compression.md (its quantization_compare section)")
    args = ap.parse_args(argv)
    if not (ART / "model.pt2").is_file():
        raise SystemExit(f"{ART} has no model.pt2: `python examples/digits/train.py` makes the digits artifacts")
    import torch

    from edgekit.inputs.data import load_npz

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    calib = load_npz(ART / "calib.npz", y_key=None, require_labels=False, role="calib")
    ev = load_npz(ART / "eval.npz")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.environ["EDGEKIT_HOME"] = str(tmp / "home")  # cold caches (calibration ranges...): the build times
        rows += run_case("digits CNN", ART / "model.pt2", calib, ev, args.tolerance, tmp / "digits", args.rounds,
                         args.runs)
        om = outlier_model(ART / "model.pth")
        ep = torch.export.export(om, (torch.from_numpy(ev.xs[0][:1]),))
        torch.export.save(ep, str(tmp / "outlier.pt2"))
        rows += run_case("digits CNN + activation outlier", tmp / "outlier.pt2", calib, ev, args.tolerance,
                         tmp / "outlier", args.rounds, args.runs)
    print(f"host CPU: {isa()}")
    print(f"\nINT8 side by side (tolerance {args.tolerance} points; latency: onnxruntime 1 thread, batch 1, "
          f"median of {args.rounds} interleaved rounds x {args.runs} runs)\n")
    hdr = f"{'case':32} {'method':32} {'acc %':>7} {'drop':>6} {'size KB':>8} {'p50 ms':>8} {'vs fp32':>8}  note"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if "accuracy" in r:
            note = ("float: " + ", ".join(r["float_ops"])) if r.get("float_ops") else (
                "" if r["within_tolerance"] else "OUTSIDE the tolerance")
            print(f"{r['case']:32} {r['method']:32} {r['accuracy']:7.2f} {r['drop']:6.2f} {r['size_kb']:8.1f} "
                  f"{r['p50_ms']:8.4f} {r['speedup']:7.2f}x  {note}")
        else:
            print(f"{r['case']:32} {r['method']:32} {'-':>7} {'-':>6} {'-':>8} {'-':>8} {'-':>8}  refused: "
                  f"{r['error'][:110]}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    if args.docs:
        from _docs import write_section

        write_section(ROOT / "docs" / "benchmarks" / "compression.md", "quantization_compare",
                      docs_table(rows, args.tolerance, args.rounds, args.runs))


def docs_table(rows: list[dict], tolerance: float, rounds: int, runs: int) -> str:
    """The printed table as markdown (the docs page's section), with each method's build time."""
    lines = [f"Tolerance {tolerance:g} accuracy points; latency: onnxruntime on this host, 1 thread, batch 1, the "
             f"median of {rounds} interleaved rounds' p50 ({runs} runs each). Build s: the method's own time to "
             "make the file, with cold caches (a fresh EDGEKIT_HOME).", "",
             "| case | method | acc % | drop (pts) | size KB | p50 µs | vs fp32 | build s | note |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        built = f"{r['seconds']:.2f}" if "seconds" in r else "-"
        trials = r.get("trials")  # INC: the accuracy of each configuration it tried
        if trials:
            n = len(trials) if isinstance(trials, list) else trials
            built += f" ({n} trial{'' if n == 1 else 's'})"
        if "accuracy" in r:
            note = ("kept in float: " + ", ".join(f"`{op}`" for op in r["float_ops"])) if r.get("float_ops") else (
                "" if r["within_tolerance"] else "outside the tolerance")
            lines.append(f"| {r['case']} | {r['method']} | {r['accuracy']:.2f} | {r['drop']:.2f} | {r['size_kb']:.1f} "
                         f"| {r['p50_ms'] * 1e3:.2f} | {r['speedup']:.2f}x | {built} | {note} |")
        else:
            why = " ".join(r["error"].split()).replace("|", "/")[:200]
            lines.append(f"| {r['case']} | {r['method']} | - | - | - | - | - | {built} | refused: {why} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
