"""How often would an unchanged model be flagged as a latency regression on this machine?

Deploys the same digits model N times on `local` (the real agent, real onnxruntime), then compares
every pair of runs per variant with edgekit.measure.compare and prints, side by side: the shift of
the median, whether the tests alone call it significant, and whether the release gate (significant
AND above the threshold) would flag it.

    python benchmarks/report_compare_noise.py [--n 3] [--threshold 0.10]
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
A = ROOT / "examples" / "digits" / "artifacts"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--threshold", type=float, default=0.10)
    ap.add_argument("--reports", nargs="*", type=Path, help="compare these report.json files instead of deploying")
    args = ap.parse_args(argv)

    import edgekit
    from edgekit.measure.compare import format_p
    from edgekit.report.model import Report

    reports = [Report.load(p) for p in args.reports or []]
    if not reports:
        if not (A / "model.pt2").exists():
            raise SystemExit("train the digits model first: python examples/digits/train.py")
        with tempfile.TemporaryDirectory() as d:
            for i in range(args.n):
                # remeasure: the measurement cache would hand back the first run's timings
                reports.append(edgekit.deploy(A / "model.pt2", eval_data=A / "eval.npz", calib_data=A / "calib.npz",
                                              out=Path(d) / f"run{i}", remeasure=True))
                print(f"run {i}: deployed", flush=True)
    rows = []
    for (i, a), (j, b) in itertools.combinations(enumerate(reports), 2):
        d = b.diff(a, min_effect=args.threshold)
        for vd in d.variants:
            c = vd.get("latency_p50_ms")
            rows.append((f"{i}->{j}", vd.variant, c.change_rel, c.significant, c.verdict, c.p_value))
    print(f"{'pair':6} {'variant':14} {'shift':>8} {'tests alone':>12} {'gate @' + format(args.threshold, '.0%'):>10}  p")
    for pair, v, rel, sig, verdict, p in rows:
        flagged = verdict in ("slower", "faster")
        print(f"{pair:6} {v:14} {rel:+8.2%} {'significant' if sig else 'no':>12} {'FLAG' if flagged else 'ok':>10}  "
              f"{format_p(p)}")
    sig = sum(1 for r in rows if r[3])
    flagged = sum(1 for r in rows if r[4] in ("slower", "faster"))
    print(f"\n{len(rows)} comparisons of an unchanged model: significant by the tests alone {sig}/{len(rows)} "
          f"({sig / max(len(rows), 1):.0%}); flagged by the gate (significant and > {args.threshold:.0%}) "
          f"{flagged}/{len(rows)}; largest shift {max(abs(r[2]) for r in rows):.2%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
