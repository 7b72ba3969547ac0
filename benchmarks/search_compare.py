"""Issue #11 benchmark, side by side in one run on one device (default: `local`):

  fp32 | onnxruntime's default INT8 (quantize_static with no options) | the best single-runtime choice
  (the fastest candidate of the target's first runtime inside the tolerance) | the searched choice

for the digits model and a MobileNetV2-style net at 64x64 (trained for a few steps on random data so
quantization has real ranges; accuracy on random labels means nothing there, the tolerance is what
matters), with the search's total time.

    .venv/bin/python benchmarks/search_compare.py [--target local] [--device NAME] [--max-drop 1]
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


def mobilenet_case(work: Path):
    import torch
    from mobilenet import MobileNetV2

    torch.manual_seed(0)
    m = MobileNetV2(num_classes=10, width=0.5)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((96, 3, 64, 64)).astype(np.float32)
    y = rng.integers(0, 10, 96)
    # a few steps so BatchNorm statistics and weights are not at their init values
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    m.train()
    for i in range(0, 96, 16):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(torch.from_numpy(x[i:i + 16])), torch.from_numpy(y[i:i + 16])).backward()
        opt.step()
    m.eval()
    with torch.no_grad():
        y_model = m(torch.from_numpy(x[:64])).argmax(1).numpy()  # labels = the float model's own answers
    np.savez(work / "mnet_eval.npz", x=x[:64], y=y_model)
    np.savez(work / "mnet_calib.npz", x=x[64:])
    ep = torch.export.export(m, (torch.from_numpy(x[:1]),))
    torch.export.save(ep, str(work / "mnet.pt2"))
    return work / "mnet.pt2", work / "mnet_eval.npz", work / "mnet_calib.npz"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="local")
    ap.add_argument("--device", default=None)
    ap.add_argument("--max-drop", type=float, default=1.0)
    args = ap.parse_args()
    import train as digits_train

    from edgekit.inputs.targets import load_target
    from edgekit.variant_search import SearchOptions, search

    work = Path(tempfile.mkdtemp(prefix="edgekit-search-bench-"))
    digits_train.main(["--out", str(work / "digits"), "--epochs", "20"])
    d = work / "digits"
    cases = [("digits", d / "model.pt2", d / "eval.npz", d / "calib.npz"), ("mobilenetv2-64", *mobilenet_case(work))]
    first_runtime = load_target(args.target).runtimes[0]
    prefix = {"onnxruntime": ("fp32", "ort-"), "litert": ("tflite-",)}[first_runtime]
    rows = []
    for name, model, ev, cal in cases:
        t0 = time.perf_counter()
        rep = search(model, eval_data=ev, calib_data=cal, target=args.target, device=args.device,
                     out=work / f"out-{name}", max_accuracy_drop=args.max_drop,
                     options=SearchOptions(remeasure=True))  # a benchmark never reuses the cache
        seconds = time.perf_counter() - t0
        v = {x.name: x for x in rep.variants}
        cands = {c["name"]: c for c in rep.search["candidates"]}
        ok = [x for x in rep.variants if x.accuracy_drop is not None and x.accuracy_drop <= args.max_drop]
        single = min((x for x in ok if x.name.startswith(prefix)), key=lambda x: x.latency_ms.p50, default=None)
        chosen = next((x for x in rep.variants if x.selected), None)

        def p50(n):
            if n in v:
                return v[n].latency_ms.p50
            c = cands.get(n) or {}
            return (c.get("screening") or {}).get("p50")  # dropped after screening: its screening median

        rows.append((name, p50("fp32"), p50("ort-int8-default"), single, chosen, seconds, rep))
    print(f"\ntarget {args.target}, device {args.device or 'local'}; tolerance {args.max_drop} pts; p50 ms on the device; "
          f"host CPU {isa()}")
    print(f"{'model':16} {'fp32':>8} {'ORT default INT8':>17} {'best single-runtime':>26} {'searched choice':>26} {'search s':>9}")
    for name, f, dflt, single, chosen, seconds, rep in rows:
        s = f"{single.name}={single.latency_ms.p50:.4f}" if single else "n/a"
        c = f"{chosen.name}={chosen.latency_ms.p50:.4f}" if chosen else "none"
        print(f"{name:16} {f:8.4f} {dflt if dflt is None else round(dflt, 4)!s:>17} {s:>26} {c:>26} {seconds:9.1f}")
        for cand in rep.search["candidates"]:
            scr = cand.get("screening") or {}
            print(f"    {cand['name']:20} {cand['status']:9} p50(screen)={scr.get('p50')!s:24} "
                  f"{(cand.get('reason') or '')[:90]}")


if __name__ == "__main__":
    main()
