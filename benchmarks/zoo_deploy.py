"""Issue #17 figures: every test-zoo model (transformers architectures trained here, tests/zoo) through
`edgekit deploy` with its task's metric and `edgekit deploy --search`, side by side in one run on one
device (default `local`). Prints, per model: the metric, the fp32 value, each variant's value and drop
with its paired 95% CI, p50 latency and the speed-up over fp32, the searched choice, and the CPU's ISA
(x86 INT8 gains hinge on VNNI).

    .venv/bin/python benchmarks/zoo_deploy.py [--models cnn,text] [--no-search] [--runs 50]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_cpu.py
from _cpu import isa  # noqa: E402


def run(args: list[str]) -> tuple[int, float]:
    from edgekit.cli.main import main

    t0 = time.perf_counter()
    code = main(args)
    return code, time.perf_counter() - t0


def fmt_variant(v: dict, base: dict) -> str:
    acc, st = v.get("accuracy") or {}, v.get("accuracy_stats") or {}
    ci = st.get("ci95")
    p50 = (v.get("latency_ms") or {}).get("p50")
    bp50 = (base.get("latency_ms") or {}).get("p50")
    sp = f"{bp50 / p50:.2f}x" if p50 and bp50 else "n/a"
    drop = "" if v is base else f" drop {v.get('accuracy_drop', 0):+.3g}" + (f" [{ci[0]:+.3g}, {ci[1]:+.3g}]" if ci else "")
    return (f"    {v['name']:<22} {v['format']:<7} {v['precision']:<6} {acc.get('metric')} {acc.get('value', float('nan')):8.3f}"
            f"{drop:<28} p50 {p50 if p50 is not None else float('nan'):8.3f} ms  {sp}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="cnn,hybrid,text,audio,seg,det")
    ap.add_argument("--no-search", action="store_true")
    ap.add_argument("--runs", default="50")
    ap.add_argument("--target", default="local")
    a = ap.parse_args()
    from tests import zoo

    print(f"ISA: {isa()}; target {a.target}; measurement cache off (--remeasure)")
    work = Path(tempfile.mkdtemp(prefix="edgekit-zoo-bench-"))
    for name in a.models.split(","):
        m = zoo.get(name)
        extra = ["--max-metric-drop", "5"] if m.metric == "map50" else []
        common = [str(m.pt2), "--target", a.target, "--eval-data", str(m.eval), "--calib-data", str(m.calib),
                  "--metric", m.metric, *extra, "--runs", a.runs, "--remeasure"]
        print(f"\n== {name} ({m.facts.get('library_class', m.facts.get('class', '?'))}; metric {m.metric}; "
              f"torch fp32 {m.facts.get('metric_fp32')})")
        code, secs = run(["deploy", *common, "--out", str(work / name)])
        rep = json.loads((work / name / "report.json").read_text())
        base = next(v for v in rep["variants"] if v["name"] == rep["baseline"])
        print(f"  deploy: exit {code}, gate {'PASSED' if rep['gate']['passed'] else 'FAILED'}, {secs:.0f} s")
        for v in rep["variants"]:
            print(fmt_variant(v, base))
        for w in rep["warnings"]:
            if "resolves" in w or "slower" in w:
                print(f"    warning: {w}")
        if a.no_search:
            continue
        code, secs = run(["deploy", *common, "--search", "--out", str(work / f"{name}-search")])
        rep = json.loads((work / f"{name}-search" / "report.json").read_text())
        base = next(v for v in rep["variants"] if v["name"] == rep["baseline"])
        sel = rep["search"]["selected"]
        print(f"  search: exit {code}, selected {sel}, {rep['search']['seconds']:.0f} s")
        for v in rep["variants"]:
            print(fmt_variant(v, base) + ("   <- selected" if v["name"] == sel else ""))
        for c in rep["search"]["candidates"]:
            if c.get("status") == "dropped":
                print(f"    dropped {c['name']} at {c['dropped_at']}: {str(c['reason'])[:150]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
