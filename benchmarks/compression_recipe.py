"""The digits compression recipe (examples/digits/recipe-compress.yaml) through `edgekit deploy`
on the local device, twice: a cold run (empty pass cache) and a re-run with nothing changed.
Prints every variant's accuracy, drop, size and device-measured p50 with its speedup over fp32,
and the time both runs spent building variants (passes) and in total.

    python benchmarks/compression_recipe.py [--runs 300] [--json out.json] [--docs]

Both runs measure on the device (--remeasure), so the re-run's saving is the passes' alone. ``--docs`` writes the
table and the re-run's saving into docs/benchmarks/compression.md (its ``compression_recipe`` section).
Needs examples/digits/artifacts/ (`python examples/digits/train.py` makes it, seeded, in seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ART = ROOT / "examples" / "digits" / "artifacts"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=300, help="minimum timed runs per variant")
    ap.add_argument("--recipe", type=Path, default=ROOT / "examples" / "digits" / "recipe-compress.yaml")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--docs", action="store_true",
                    help="write the table into docs/benchmarks/compression.md (its compression_recipe section)")
    args = ap.parse_args(argv)
    if not (ART / "model.pt2").is_file():
        raise SystemExit(f"{ART} has no model.pt2: `python examples/digits/train.py` makes the digits artifacts")
    from edgekit.pipeline.deploy import deploy

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["EDGEKIT_HOME"] = str(Path(tmp) / "home")  # a cold pass cache for run 1
        for label in ("cold", "re-run"):
            t = time.perf_counter()
            rep = deploy(ART / "model.pt2", arch=f"{ROOT / 'examples' / 'digits' / 'model.py'}:DigitsCNN",
                         eval_data=ART / "eval.npz", calib_data=ART / "calib.npz", recipe=args.recipe,
                         out=Path(tmp) / label, runs=args.runs, remeasure=True)
            wall = time.perf_counter() - t
            results.append((label, wall, rep))
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_cpu.py
    from _cpu import isa

    print(f"\nCPU: {isa()}")
    print(f"{'variant':28} {'acc %':>7} {'drop':>6} {'size KB':>8} {'p50 ms':>8} {'ci95 of p50':>20} {'speedup':>8}")
    cold = results[0][2]
    for v in cold.variants:
        lat = v.latency_ms
        print(f"{v.name:28} {v.accuracy.value:7.2f} {v.accuracy_drop or 0:6.2f} {v.size_bytes / 1024:8.1f} "
              f"{lat.p50:8.4f} {f'[{lat.ci95[0]:.4f}, {lat.ci95[1]:.4f}]':>20} {v.speedup_vs_baseline or 1:7.2f}x")
    print()
    for label, wall, rep in results:
        p = rep.settings["passes"]
        print(f"{label:7}: passes {p['seconds']:8.2f} s (cache hits {p['cache']['hits']}, "
              f"misses {p['cache']['misses']}), whole deploy {wall:7.2f} s")
    (c_label, c_wall, c_rep), (r_label, r_wall, r_rep) = results
    print(f"re-run / cold: passes {r_rep.settings['passes']['seconds'] / c_rep.settings['passes']['seconds']:.3f}, "
          f"whole deploy {r_wall / c_wall:.3f} (the device measurements are repeated in both)")
    print(f"gate: {'PASSED' if cold.gate.passed else 'FAILED'}")
    if args.docs:
        from _docs import write_section

        write_section(ROOT / "docs" / "benchmarks" / "compression.md", "compression_recipe", docs_table(results))
    if args.json:
        args.json.write_text(json.dumps({
            "variants": [{"name": v.name, "accuracy": v.accuracy.value, "drop": v.accuracy_drop,
                          "size_bytes": v.size_bytes, "p50_ms": v.latency_ms.p50, "ci95": v.latency_ms.ci95,
                          "speedup_vs_baseline": v.speedup_vs_baseline} for v in cold.variants],
            "runs": [{"label": lbl, "wall_s": w, "passes": r.settings["passes"]} for lbl, w, r in results],
        }, indent=1))


def _int8(v) -> str:
    """The accuracy-aware pass's choice in a variant's lineage: its encoding and the ops it kept in float."""
    for step in v.lineage:
        m = step.metrics
        if step.kind == "pass" and "encoding" in m and "float_ops" in m:
            return f"{m['encoding']}, {len(m['float_ops'])} of {m.get('quantizable_ops', '?')} ops in float"
    return "-"


def docs_table(results) -> str:
    """The printed table and the re-run's saving as markdown (the docs page's section)."""
    (_, c_wall, cold), (_, r_wall, rerun) = results
    rts = sorted({(v.runtime.name, v.runtime.version, v.runtime.threads) for v in cold.variants},
                 key=lambda r: tuple(str(x) for x in r))
    runs = sorted({v.latency_ms.runs for v in cold.variants})
    rt = "; ".join(f"{n} {ver or '(version not read)'}, {th or '?'} thread{'' if th == 1 else 's'}"
                   for n, ver, th in rts)
    lines = [f"Local device, {rt}, batch 1, {'-'.join(map(str, runs[::max(len(runs) - 1, 1)]))} timed "
             "runs a variant (the cold run's measurements). vs fp32: fp32's p50 over the variant's. INT8: the "
             "encoding the accuracy-aware pass chose and the ops it kept in float.", "",
             "| variant (digits CNN) | acc % | drop (pts) | size KB | device p50 µs | 95% CI of p50, µs | vs fp32 "
             "| INT8 |",
             "|---|---|---|---|---|---|---|---|"]
    for v in cold.variants:
        lat = v.latency_ms
        lines.append(f"| {v.name} | {v.accuracy.value:.2f} | {v.accuracy_drop or 0:.2f} | {v.size_bytes / 1024:.1f} "
                     f"| {lat.p50 * 1e3:.2f} | {lat.ci95[0] * 1e3:.2f}-{lat.ci95[1] * 1e3:.2f} "
                     f"| {v.speedup_vs_baseline or 1:.2f}x | {_int8(v)} |")
    cp, rp = cold.settings["passes"], rerun.settings["passes"]
    lines += ["", f"Re-running the unchanged recipe: passes {cp['seconds']:.1f} s ({cp['cache']['hits']} cache hits, "
              f"{cp['cache']['misses']} misses) -> {rp['seconds']:.2f} s ({rp['cache']['hits']} cache hits, "
              f"{rp['cache']['misses']} misses), whole deploy {c_wall:.1f} s -> "
              f"{r_wall:.1f} s (the device measurements are repeated in both). Gate: "
              f"{'passed' if cold.gate.passed else 'FAILED'}."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
