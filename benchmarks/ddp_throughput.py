"""Issue #9 benchmark: DDP training throughput on this machine, measured side by side in one run.

    .venv/bin/python benchmarks/ddp_throughput.py [--width 48] [--epochs 3] [--repeats 2]

(a) 1 process with 2 torch threads, vs (b) 2 processes (torchrun, gloo, DDP) with 1 thread each, and
(c) 1 process with 1 thread as a control,
training the same compute-bound teacher (DigitsCNN at --width, a ~1 MFLOP-per-sample CNN at width 48)
on the digits set with the same global batch of 64 through `edgekit.train`. Throughput is the
worker's own figure (samples trained / seconds in the training loop; process start-up, the rendezvous
and the export are excluded). Runs alternate a, b, c, a, b, c so machine noise hits both alike; the median of
each is reported, and the ratio b / a printed. Both use the machine's 2 cores; what differs is
whether the cores split one batch's ops (threads) or each take half the batch and all-reduce the
gradients (processes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits"

FACTORY = """
import sys
sys.path.insert(0, {digits!r})
from model import DigitsCNN


def teacher():
    return DigitsCNN({width})
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=48)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)

    import edgekit

    sys.path.insert(0, str(DIGITS))
    import train as digits_train

    xtr, _, ytr, _ = digits_train.load_data(0)
    with tempfile.TemporaryDirectory(prefix="ddp-bench-") as tmp:
        t = Path(tmp)
        np.savez(t / "train.npz", x=xtr, y=ytr)
        (t / "fac.py").write_text(FACTORY.format(digits=str(DIGITS), width=args.width))
        # (c) is a control: if 2 threads are no faster than 1, the cores are busy (other work) or the
        # ops are too small to split, and (a) vs (b) measures that rather than DDP
        setups = {"1 proc x 2 threads": dict(nproc_per_node=1, threads=2),
                  "2 procs x 1 thread": dict(nproc_per_node=2, threads=1),
                  "1 proc x 1 thread": dict(nproc_per_node=1, threads=1)}
        sps: dict[str, list[float]] = {k: [] for k in setups}
        for r in range(args.repeats):
            for name, opts in setups.items():
                out = t / f"{r}-{opts['nproc_per_node']}-{opts['threads']}" / "teacher.pt2"
                res = edgekit.train(f"{t / 'fac.py'}:teacher", t / "train.npz", out, epochs=args.epochs,
                                    batch_size=64, seed=0, force=True, **opts)
                sps[name].append(res.metrics["samples_per_s"])
                print(f"  run {r + 1} {name}: {res.metrics['samples_per_s']:.0f} samples/s "
                      f"(loss {res.metrics['final_loss']:.3f})", flush=True)
    a, b, c = (statistics.median(v) for v in sps.values())
    print(f"\nDigitsCNN(width={args.width}), {len(xtr)} samples, global batch 64, {args.epochs} epochs, "
          f"{os.cpu_count()} cores, median of {args.repeats}:")
    print(f"  1 process  x 2 threads: {a:8.0f} samples/s")
    print(f"  2 processes x 1 thread: {b:8.0f} samples/s  (torchrun + DDP, gloo all-reduce)")
    print(f"  1 process  x 1 thread:  {c:8.0f} samples/s  (control)")
    print(f"  ratio 2 procs x 1 thread / 1 proc x 2 threads: {b / a:.2f}x")
    print(f"  thread scaling, 1 proc x 2 threads / 1 proc x 1 thread: {a / c:.2f}x")
    try:
        print(f"  load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
