"""How much to trust one edgekit latency number on this machine, measured side by side:

(a) repeatability: the coefficient of variation of the median across repeated agent profiles of
    the same model (each profile a fresh agent process, as `edgekit deploy` runs it), next to the
    mean within-profile CoV;
(b) the agent's overhead: its median vs a bare in-process onnxruntime timing loop (same model,
    input, threads, warmup and run count), as a ratio;
(c) the energy sampler's perturbation: the agent's median with its background sampling thread on
    (a written RAPL tree with a fake counter, 50 Hz) vs off, as a ratio.

    .venv/bin/python benchmarks/measurement_stability.py [--repeats 5] [--runs 200] [--min-seconds 1]

Profiles alternate agent / bare / agent+sampler so that machine noise hits all three alike. The
load average is printed: on a shared 2-core machine, between-profile CoV is mostly the neighbours.
"""

from __future__ import annotations

import argparse
import json
import warnings
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def matmul_onnx(path: Path, n: int = 64) -> tuple[Path, list[int]]:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((n, n)).astype(np.float32), "W")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path, [1, n]


def mobilenet_onnx(path: Path) -> tuple[Path, list[int]]:
    import torch
    from mobilenet import MobileNetV2

    warnings.filterwarnings("ignore", category=DeprecationWarning)  # the legacy exporter is fine for a CNN
    torch.manual_seed(0)
    net = MobileNetV2(num_classes=10, width=0.35).eval()
    x = torch.randn(1, 3, 96, 96)
    torch.onnx.export(net, (x,), str(path), input_names=["x"], output_names=["y"], dynamo=False, opset_version=17)
    return path, [1, 3, 96, 96]


def agent_profile(model: Path, shape: list[int], args, workdir: Path, energy_root: Path | None) -> list[float]:
    req = {"protocol": 1, "variant": "bench", "model": str(model), "runtime": "onnxruntime", "threads": args.threads,
           "warmup": args.warmup, "runs": args.runs, "min_seconds": args.min_seconds, "max_runs": args.runs,
           "inputs": [{"name": "x", "shape": shape, "dtype": "float32"}]}
    if energy_root is not None:
        req["energy"] = {"sources": ["rapl"], "sysfs_root": str(energy_root), "baseline_seconds": 0.2, "sample_hz": 50}
    rp = workdir / "req.json"
    rp.write_text(json.dumps(req))
    from edgekit.agent.package import agent_pyz

    out = subprocess.run([sys.executable, str(agent_pyz()), str(rp)], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"agent failed: {out.stderr[-800:]}")
    doc = json.loads(out.stdout)
    if energy_root is not None and doc["energy"]["source"] != "rapl":
        raise SystemExit(f"the sampler did not run: {doc['energy']}")
    return doc["latency_ms"]["raw"]


def bare_profile(model: Path, shape: list[int], args) -> list[float]:
    """The same measurement without the agent: a session and a perf_counter_ns loop."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(str(model), sess_options=so, providers=["CPUExecutionProvider"])
    x = {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    for _ in range(args.warmup):
        sess.run(None, x)
    raw = []
    for _ in range(args.runs):
        a = time.perf_counter_ns()
        sess.run(None, x)
        raw.append((time.perf_counter_ns() - a) / 1e6)
    return raw


class FakeRaplCounter(threading.Thread):
    """A written RAPL tree whose counter rises at a constant 5 W (a fake: this machine has none)."""

    def __init__(self, root: Path):
        super().__init__(daemon=True)
        z = root / "sys/class/powercap/intel-rapl:0"
        z.mkdir(parents=True)
        (z / "name").write_text("package-0\n")
        (z / "max_energy_range_uj").write_text("262143328850\n")
        self.file = z / "energy_uj"
        self.file.write_text("0\n")
        self.stop = threading.Event()

    def run(self):
        t0 = time.perf_counter()
        while not self.stop.wait(0.005):
            tmp = self.file.with_suffix(".tmp")
            tmp.write_text(f"{int(5e6 * (time.perf_counter() - t0))}\n")
            tmp.replace(self.file)


def iqr_ratio(xs: list[float]) -> float:
    """IQR / median: the robust spread (one 100 ms preemption does not swamp it, unlike CoV)."""
    q1, _, q3 = statistics.quantiles(xs, n=4)
    return (q3 - q1) / statistics.median(xs)


def cov(xs: list[float]) -> float:
    return statistics.stdev(xs) / statistics.mean(xs) if len(xs) > 1 else 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--min-seconds", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default="matmul64,mobilenetv2-0.35-96")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_cpu.py
    from _cpu import isa

    print(f"machine: {os.cpu_count()} CPUs ({isa()}), load average {os.getloadavg()[0]:.2f} at start; "
          f"{args.repeats} profiles x {args.runs} runs, warmup {args.warmup}, threads {args.threads}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgekit-bench-") as td:
        td = Path(td)
        sensor = FakeRaplCounter(td / "sysfs")
        sensor.start()
        builders = {"matmul64": matmul_onnx, "mobilenetv2-0.35-96": mobilenet_onnx}
        for name in args.models.split(","):
            model, shape = builders[name](td / f"{name}.onnx")
            agent, bare, sampled, within, within_iqr = [], [], [], [], []
            for _ in range(args.repeats):
                raw = agent_profile(model, shape, args, td, None)
                agent.append(statistics.median(raw))
                within.append(cov(raw))
                within_iqr.append(iqr_ratio(raw))
                bare.append(statistics.median(bare_profile(model, shape, args)))
                sampled.append(statistics.median(agent_profile(model, shape, args, td, td / "sysfs")))
            rows.append((name, statistics.median(agent), cov(agent), statistics.mean(within), statistics.mean(within_iqr),
                         statistics.median(bare), cov(bare), statistics.median(agent) / statistics.median(bare),
                         statistics.median(sampled) / statistics.median(agent)))
        sensor.stop.set()
    hdr = ("model", "agent p50 ms", "CoV of p50 (agent)", "mean CoV within", "IQR/p50 within", "bare p50 ms",
           "CoV of p50 (bare)",
           "agent/bare", "sampler on/off")
    print(" | ".join(hdr))
    for r in rows:
        print(f"{r[0]} | {r[1]:.4f} | {r[2]:.1%} | {r[3]:.1%} | {r[4]:.1%} | {r[5]:.4f} | {r[6]:.1%} | {r[7]:.3f} | "
              f"{r[8]:.3f}")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
