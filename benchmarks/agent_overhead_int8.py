"""Issue #2 benchmark, measured side by side in one run on this machine:

(a) the agent's reported median latency vs a direct in-process onnxruntime timing loop on the same
    model, input and thread count (the agent's measurement overhead, as a ratio);
(b) INT8 (static QDQ per-channel) vs FP32 median latency (and accuracy where it means something) on
    the digits model and on a MobileNetV2-style 224x224 net with random weights.

    .venv/bin/python benchmarks/agent_overhead_int8.py [--threads 1] [--repeats 3]

Measurements alternate agent / direct loop so that machine noise hits both alike.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "digits"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from _cpu import isa  # noqa: E402


def direct_median_ms(model_path: Path, x: np.ndarray, threads: int, warmup: int, runs: int) -> float:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(str(model_path), sess_options=so, providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x}
    for _ in range(warmup):
        sess.run(None, feed)
    t = []
    for _ in range(runs):
        a = time.perf_counter_ns()
        sess.run(None, feed)
        t.append((time.perf_counter_ns() - a) / 1e6)
    return float(np.median(t))


def deploy(model, out: Path, eval_npz: Path, calib_npz: Path, threads: int, runs: int, example=None):
    import edgekit

    return edgekit.deploy(model, example_inputs=example, eval_data=eval_npz, calib_data=calib_npz, out=out,
                          threads=threads, warmup=20, runs=runs, min_seconds=0.0, max_accuracy_drop=100,
                          remeasure=True)  # a benchmark measures; it never reuses the cache


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import torch

    work = Path(tempfile.mkdtemp(prefix="edgekit-bench-"))
    # --- digits -----------------------------------------------------------------------------
    import train as digits_train

    digits_train.main(["--out", str(work / "digits"), "--epochs", "20"])
    d = work / "digits"
    # --- MobileNetV2-style 224x224 ------------------------------------------------------------
    from mobilenet import MobileNetV2

    torch.manual_seed(0)
    mnet = MobileNetV2().eval()
    rng = np.random.default_rng(0)
    xm = rng.standard_normal((16, 3, 224, 224)).astype(np.float32)
    np.savez(work / "m_eval.npz", x=xm[:8], y=np.zeros(8, np.int64))
    np.savez(work / "m_calib.npz", x=xm[8:])

    cases = [("digits", d / "model.pt2", d / "eval.npz", d / "calib.npz", None, 2000),
             ("mobilenetv2-224", mnet, work / "m_eval.npz", work / "m_calib.npz", (torch.from_numpy(xm[:1]),), 60)]
    rows = []
    for name, model, ev, cal, example, runs in cases:
        agent = {"fp32": [], "int8-static": []}
        direct = {"fp32": [], "int8-static": []}
        rep = None
        for r in range(args.repeats):
            rep = deploy(model, work / f"out-{name}", ev, cal, args.threads, runs, example)
            x = np.load(ev)["x"][:1]
            for v in ("fp32", "int8-static"):
                agent[v].append(rep.variant(v).latency_ms.p50)
                direct[v].append(direct_median_ms(Path(rep.variant(v).artifact_path), x, args.threads, 20, runs))
        med = lambda a: float(np.median(a))  # noqa: E731
        rows.append((name, rep, {v: med(agent[v]) for v in agent}, {v: med(direct[v]) for v in direct}))

    print(f"\nthreads={args.threads}, repeats={args.repeats} (median of repeats), host: {rep.device.get('cpu')}; "
          f"ISA {isa()}")
    print("\n(a) agent overhead: agent-reported p50 vs direct in-process onnxruntime loop p50")
    print(f"{'model':18} {'variant':12} {'agent ms':>10} {'direct ms':>10} {'ratio':>7}")
    for name, _, a, dct in rows:
        for v in a:
            print(f"{name:18} {v:12} {a[v]:10.4f} {dct[v]:10.4f} {a[v] / dct[v]:7.3f}")
    print("\n(b) INT8 (static QDQ per-channel) vs FP32, agent p50 latency")
    print(f"{'model':18} {'fp32 ms':>9} {'int8 ms':>9} {'speedup':>8} {'fp32 acc':>9} {'int8 acc':>9} {'top1 agree':>10} {'cosine':>8}")
    for name, rep, a, _ in rows:
        f, q = rep.variant("fp32"), rep.variant("int8-static")
        acc = (f"{f.accuracy.value:9.2f} {q.accuracy.value:9.2f}" if name == "digits"
               else f"{'n/a':>9} {'n/a':>9}")  # random weights: accuracy means nothing
        print(f"{name:18} {a['fp32']:9.4f} {a['int8-static']:9.4f} {a['fp32'] / a['int8-static']:7.2f}x {acc} "
              f"{q.parity.top1_agreement:10.1%} {q.parity.cosine:8.4f}")


if __name__ == "__main__":
    main()
