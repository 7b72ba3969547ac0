"""Simulated device vs `local`, side by side (root: network namespace + cgroup CPU quota).

Seen on the 2-core dev VM (quiet), --width 6144 (~7.5 ms/inference), --cpu-quota 0.25: p50 ratio 4.6-5.1x
(1/quota = 4x: an inference longer than the 5 ms quota slice also waits out the rest of a 20 ms period);
delivery of 153 MB cold 2.3 s vs warm 0.37 s with 0 bytes sent.

Prints: the p50 latency ratio of the same fp32 ONNX model on a CPU-throttled simulated device vs on
`local` (showing the agent measures the device it runs on, not the host), and the deploy time and
bytes sent cold vs warm over SSH (content-addressed delivery).

    sudo .venv/bin/python benchmarks/sim_device.py [--cpu-quota 0.25] [--width 2048] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def build(workdir: Path, width: int):
    import numpy as np
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                torch.nn.ReLU(), torch.nn.Linear(width, 10)).eval()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 64)).astype("float32")
    with torch.no_grad():
        y = model(torch.from_numpy(x)).argmax(1).numpy()
    np.savez(workdir / "eval.npz", x=x, y=y)
    return model, (torch.from_numpy(x[:1]),)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-quota", type=float, default=0.25)
    ap.add_argument("--width", type=int, default=2048, help="MLP width: bigger = longer inference")
    ap.add_argument("--rounds", type=int, default=2, help="alternating local/sim rounds")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root (network namespace + cgroup); without it `sim up` falls back to loopback, unthrottled")
        return 2
    work = Path(tempfile.mkdtemp(prefix="edgekit-bench-"))
    os.environ["EDGEKIT_HOME"] = str(work / "home")
    os.environ["EDGEKIT_LOCAL_DEVICE_DIR"] = str(work / "local-device")
    import edgekit
    from edgekit.agent.bundle import BundleDeployer
    from edgekit.devices.inventory import get_device, transport_for
    from edgekit.devices.sim_device import down, up
    from edgekit.inputs.recipe import Recipe
    from edgekit.pipeline.deploy import DeployOptions

    model, example = build(work, args.width)
    fp32_only = Recipe(variants=[])

    def run(device, out):
        opts = DeployOptions(warmup=20, runs=100, min_seconds=2.0, threads=1, remeasure=True)
        t0 = time.perf_counter()
        rep = edgekit.deploy(model, example_inputs=example, eval_data=work / "eval.npz", target="local",
                             device=device, recipe=fp32_only, out=work / out, options=opts)
        return rep, time.perf_counter() - t0

    up("bench", target="local", cpu_quota=args.cpu_quota)
    try:
        ratios = []
        for i in range(args.rounds):
            loc, _ = run(None, f"local-{i}")
            sim, _ = run("bench", f"sim-{i}")
            a, b = loc.variants[0].latency_ms, sim.variants[0].latency_ms
            ratios.append(b.p50 / a.p50)
            print(f"round {i}: p50 local {a.p50:.3f} ms, sim (cpu-quota {args.cpu_quota}) {b.p50:.3f} ms, "
                  f"ratio {b.p50 / a.p50:.2f}x (mean {a.mean:.3f} vs {b.mean:.3f} ms)")
        print(f"p50 ratio sim/local: median {statistics.median(ratios):.2f}x over {len(ratios)} rounds "
              f"(1/quota = {1 / args.cpu_quota:.1f}x)")
        down("bench")
        up("bench2", target="local")  # unthrottled, fresh device folder: a cold deploy
        cold, cold_s = run("bench2", "cold")
        warm, warm_s = run("bench2", "warm")
        print(f"deploy over ssh: cold {cold_s:.2f} s {cold.settings['delivery']}, "
              f"warm {warm_s:.2f} s {warm.settings['delivery']}")
        # the delivery step alone (hash check + transfer + verify), fresh folder then again
        files = [work / "eval.npz", *sorted((work / "cold" / "artifacts").glob("*.onnx"))]
        entry = get_device("bench2")
        entry = entry.model_copy(update={"workdir": str(work / "fresh-device")})
        with transport_for(entry) as t:
            dep = BundleDeployer(t)
            _ = dep.agent
            t0 = time.perf_counter(); dep.deliver(files); c = time.perf_counter() - t0
            dep2 = BundleDeployer(t)
            _ = dep2.agent
            t0 = time.perf_counter(); dep2.deliver(files); w = time.perf_counter() - t0
        print(f"delivery only ({sum(f.stat().st_size for f in files)} bytes): cold {c:.3f} s "
              f"({dep.stats.bytes_sent} B sent), warm {w:.3f} s ({dep2.stats.bytes_sent} B sent)")
    finally:
        for n in ("bench", "bench2"):
            try:
                down(n)
            except Exception:  # already down
                pass
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
