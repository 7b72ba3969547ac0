"""Issue #44 benchmark: the MLPerf Tiny reference architectures on the three microcontroller targets, each through
`edgekit deploy --target nrf52840` (full-integer INT8, TFLite Micro's kernels on this host, LiteRT beside it):
per model, whether it fits each part, the arena TFLM measured, the flash (model + the interpreter's published
16 KB core, a lower bound), TFLM's accuracy against LiteRT's and the float model's, and the op list.

The architectures follow the MLPerf Tiny v1.0 reference models (github.com/mlcommons/tiny, benchmark/training):
keyword spotting DS-CNN (49x10 MFCC, 12 classes), visual wake words MobileNetV1 0.25 (96x96x3, 2 classes), image
classification ResNet-8 (32x32x3, 10 classes), anomaly detection FC autoencoder (640 in, 8 bottleneck). No data set
can be downloaded here (Speech Commands, VWW/COCO, CIFAR-10, ToyADMOS): each is trained for a few seconds on a
synthetic learnable task of the same input shape (a striped texture per class, at a random phase, in noise; for
the autoencoder, vectors on a low-dimensional subspace), so the accuracies are those tasks', not the benchmark's.
The arena, the flash and the op list do not depend on the weights' values. The arena and flash are measured once
per model (the same INT8 file); each part's fit is judged from them with its own SRAM, flash and margin. Latency:
none (no board).

    .venv/bin/python benchmarks/micro_mlperf_tiny.py [--models kws,vww,ic,ad] [--docs] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cpu import isa  # noqa: E402

TARGETS = ("nrf52840", "stm32h7", "cortex-m55")
PAGE = ROOT / "docs" / "benchmarks" / "microcontrollers.md"


def _dw_block(nn, cin: int, cout: int, stride: int):  # depthwise 3x3 + pointwise 1x1, each with BN + ReLU
    return [nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin), nn.ReLU(),
            nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


def ds_cnn(nn):
    """KWS DS-CNN: conv 64 10x4 /2, four depthwise-separable 64 blocks, average pool, FC 12."""
    layers = [nn.Conv2d(1, 64, (10, 4), (2, 2), (5, 1), bias=False), nn.BatchNorm2d(64), nn.ReLU()]
    for _ in range(4):
        layers += _dw_block(nn, 64, 64, 1)
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 12)), (1, 49, 10), 12


def mobilenet_v1_025(nn):
    """VWW MobileNetV1 alpha 0.25 at 96x96: conv 8 /2, 13 depthwise-separable blocks, average pool, FC 2."""
    cfg = [(16, 1), (32, 2), (32, 1), (64, 2), (64, 1), (128, 2), (128, 1), (128, 1), (128, 1), (128, 1), (128, 1),
           (256, 2), (256, 1)]
    layers, cin = [nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU()], 8
    for cout, s in cfg:
        layers += _dw_block(nn, cin, cout, s)
        cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 2)), (3, 96, 96), 2


def resnet8(nn, torch):
    """IC ResNet-8: conv 16, three residual stacks (16, 32 /2, 64 /2; 1x1 shortcut where the shape changes),
    average pool, FC 10."""

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.a = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1), nn.BatchNorm2d(cout), nn.ReLU(),
                                   nn.Conv2d(cout, cout, 3, 1, 1), nn.BatchNorm2d(cout))
            self.short = nn.Conv2d(cin, cout, 1, stride) if (cin, stride) != (cout, 1) else nn.Identity()

        def forward(self, x):
            return torch.relu(self.a(x) + self.short(x))

    net = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1), nn.BatchNorm2d(16), nn.ReLU(), Block(16, 16, 1), Block(16, 32, 2),
                        Block(32, 64, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    return net, (3, 32, 32), 10


def fc_autoencoder(nn):
    """AD FC autoencoder: 640 -> 4x(128, BN, ReLU) -> 8 -> 4x(128, BN, ReLU) -> 640."""
    def dense(i: int, o: int):
        return [nn.Linear(i, o), nn.BatchNorm1d(o), nn.ReLU()]
    enc = dense(640, 128) + dense(128, 128) + dense(128, 128) + dense(128, 128) + dense(128, 8)
    dec = dense(8, 128) + dense(128, 128) + dense(128, 128) + dense(128, 128) + [nn.Linear(128, 640)]
    return nn.Sequential(*enc, *dec), (640,), 0


def synthetic(shape: tuple[int, ...], classes: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A learnable task of the model's input shape: class k is a striped texture with its own orientation and
    frequency at a random phase, in noise of the same strength (what a convolution and a global pool can tell
    apart); for the autoencoder (classes == 0), points of an 8-dimensional subspace, the label the input itself."""
    rng = np.random.default_rng(seed)
    if classes == 0:
        basis = np.random.default_rng(0).normal(size=(8, *shape)).astype(np.float32) / 3
        x = (rng.normal(size=(n, 8)).astype(np.float32) @ basis.reshape(8, -1)).reshape(n, *shape)
        return x.astype(np.float32), x.astype(np.float32)
    _, h, w = shape
    v, u = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    y = rng.integers(0, classes, n)
    theta = np.pi * y / classes
    freq = 0.12 + 0.08 * (y % 3)
    phase = rng.uniform(0, 2 * np.pi, n)
    arg = 2 * np.pi * freq[:, None, None] * (u * np.cos(theta)[:, None, None] + v * np.sin(theta)[:, None, None])
    tex = np.cos(arg + phase[:, None, None])[:, None]  # (n, 1, h, w), the same in every channel
    x = np.broadcast_to(tex, (n, *shape)) + rng.normal(size=(n, *shape))
    return x.astype(np.float32), y.astype(np.int64)


def train(net, x: np.ndarray, y: np.ndarray, classes: int, seconds: float = 20.0) -> None:
    import torch

    torch.manual_seed(0)
    opt = torch.optim.Adam(net.parameters(), 3e-3)
    xt, yt = torch.tensor(x), torch.tensor(y)
    loss_fn = torch.nn.functional.cross_entropy if classes else torch.nn.functional.mse_loss
    start, step = time.perf_counter(), 0
    net.train()
    while time.perf_counter() - start < seconds and step < 400:
        idx = torch.randint(0, len(xt), (64,))
        opt.zero_grad()
        loss_fn(net(xt[idx]), yt[idx]).backward()
        opt.step()
        step += 1
    # BatchNorm's running statistics lag a short training run (eval then collapses to one class): recompute them
    # as exact averages over the training set, in train mode, without gradients
    for mod in net.modules():
        if isinstance(mod, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
            mod.reset_running_stats()
            mod.momentum = None
    with torch.no_grad():
        for i in range(0, len(xt), 100):
            net(xt[i:i + 100])
    net.eval()


def build(name: str):
    import torch
    from torch import nn

    return {"kws": lambda: ds_cnn(nn), "vww": lambda: mobilenet_v1_025(nn), "ic": lambda: resnet8(nn, torch),
            "ad": lambda: fc_autoencoder(nn)}[name]()


TITLES = {"kws": "KWS DS-CNN", "vww": "VWW MobileNetV1 0.25", "ic": "IC ResNet-8", "ad": "AD FC autoencoder"}


def measure(name: str, work: Path) -> dict:
    import torch

    import edgekit
    from edgekit.inputs.targets import load_target
    from edgekit.micro.fit import judge_fit
    from edgekit.micro.interpreter import Arena

    net, shape, classes = build(name)
    x, y = synthetic(shape, classes, 1200, seed=1)
    train(net, x[:1000], y[:1000], classes)
    d = work / name
    d.mkdir(parents=True, exist_ok=True)
    torch.export.save(torch.export.export(net, (torch.tensor(x[:1]),)), d / "model.pt2")
    np.savez(d / "eval.npz", x=x[1000:], y=y[1000:])
    np.savez(d / "calib.npz", x=x[:200])
    kw = {} if classes else {"metric": "mse", "max_accuracy_drop": 100.0}  # the gate is not the point here
    start = time.perf_counter()
    report = edgekit.deploy(str(d / "model.pt2"), eval_data=d / "eval.npz", calib_data=d / "calib.npz",
                            target="nrf52840", out=d / "out", **kw)
    seconds = time.perf_counter() - start
    fp32, tflm = report.variant("fp32"), report.variant("tflm-int8")
    micro = tflm.micro
    arena = Arena(bytes=micro["arena"]["bytes"], largest_failing=micro["arena"]["largest_failing"],
                  head=micro["arena"]["head"], tail=micro["arena"]["tail"],
                  recorded_total=micro["arena"]["recorded_total"], probes=micro["arena"]["probes"])
    fits = {}
    for t in TARGETS:
        part = load_target(t).microcontroller
        fit = judge_fit(part, arena, tflm.size_bytes, None)
        fits[t] = {"fits": fit.fits, "sram_budget": fit.sram_budget, "flash_budget": fit.flash_budget}
    return {"model": name, "title": TITLES[name], "metric": fp32.accuracy.metric, "units": fp32.accuracy.units,
            "fp32": fp32.accuracy.value, "tflm": tflm.accuracy.value, "litert": micro["litert"]["accuracy"]["value"],
            "disagreement": micro["litert"]["disagreement_with_tflm"], "arena": micro["arena"],
            "flash": micro["fit"]["flash"]["bytes"], "model_bytes": tflm.size_bytes, "ops": micro["ops"],
            "fits": fits, "gate": report.gate.passed, "deploy_seconds": round(seconds, 1), "macs": micro["macs"]}


def table(rows: list[dict]) -> str:
    head = ("| model | metric | fp32 | TFLM int8 | LiteRT int8 | TFLM vs LiteRT (max steps, equal, top-1 agree) "
            "| arena B "
            "(head + tail) | flash B (model + 16 KB core) | " + " | ".join(f"fits {t}" for t in TARGETS) + " | ops |")
    lines = [head, "|" + "---|" * (9 + len(TARGETS))]
    for r in rows:
        dis = next(iter(r["disagreement"].values()))
        agree = f"{dis['top1_agreement']:.1%}" if "top1_agreement" in dis else "n/a"
        fmt = "{:.2f}" if r["units"] == "%" else "{:.4f}"
        a = r["arena"]
        lines.append(f"| {r['title']} | {r['metric']} {r['units']} | {fmt.format(r['fp32'])} | "
                     f"{fmt.format(r['tflm'])} | {fmt.format(r['litert'])} | "
                     f"{dis['max_steps']:.1f}, {dis['exact_share']:.0%}, {agree} | "
                     f"{a['bytes']} ({a['head']} + {a['tail']}) | {r['flash']} ({r['model_bytes']} + 16384) | "
                     + " | ".join("yes" if r["fits"][t]["fits"] else "**no**" for t in TARGETS)
                     + f" | {', '.join(r['ops'])} |")
    return "\n".join(lines)


def estimates(rows: list[dict]) -> str:
    """The latency estimate per model and target (edgekit/micro/latency_estimate.py), beside the published figure
    it was fitted on, with its leave-one-out error; only with all four models (the fit needs them)."""
    from edgekit.inputs.targets import load_target
    from edgekit.micro.latency_estimate import SOURCE, fit_core

    macs = {r["model"]: int(r["macs"]) for r in rows}
    parts = {t: load_target(t).microcontroller for t in TARGETS}
    fits = {t: fit_core(p.core, macs) for t, p in parts.items() if p is not None}
    lines = ["| model | MACs | " + " | ".join(f"{t} estimate ms" for t in TARGETS) + " | published ms (board) "
             "| leave-one-out error |", "|" + "---|" * (4 + len(TARGETS))]
    for r in rows:
        cells = []
        for t in TARGETS:
            f, part = fits.get(t), parts[t]
            cells.append(f"{f.estimate_ms(macs[r['model']], part.clock_mhz):.1f}" if f and part else
                         "none: no published figure for this core class")
        pub = "; ".join(f"{f.published_ms[r['model']]:.1f} ({f.board})" for f in
                        {id(f): f for f in fits.values() if f is not None}.values() if r["model"] in f.published_ms)
        err = "; ".join(f"{f.loo_errors[r['model']]:+.0%} ({f.core})" for f in
                        {id(f): f for f in fits.values() if f is not None}.values() if r["model"] in f.loo_errors)
        lines.append(f"| {r['title']} | {macs[r['model']]} | " + " | ".join(cells) + f" | {pub} | {err} |")
    models = "; ".join(f"{f.core}: {f.model()}" for f in {id(f): f for f in fits.values() if f}.values())
    return (f"Latency is an estimate, not a measurement (no board): {models}. Each part's own clock is used "
            f"(nrf52840 64 MHz, stm32h7 480 MHz); the published runs are X-CUBE-AI's, not TFLM's. Source: {SOURCE}."
            "\n\n" + "\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="kws,vww,ic,ad")
    ap.add_argument("--docs", action="store_true", help=f"write the table into {PAGE.relative_to(ROOT)}")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    print(f"host: {isa()}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgekit-mlperf-tiny-") as tmp:
        for name in args.models.split(","):
            rows.append(measure(name, Path(tmp)))
            print(json.dumps(rows[-1]))
    body = table(rows)
    if {r["model"] for r in rows} == set(TITLES):
        body += "\n\n" + estimates(rows)
    print(body)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    if args.docs:
        from _docs import write_section

        write_section(PAGE, "micro_mlperf_tiny", body)


if __name__ == "__main__":
    main()
