"""Convert every architecture of tests/models_zoo.py through every format and precision and print
parity and conversion time per hop (the numbers behind the support table in docs/benchmarks/conversion.md).

    python benchmarks/convert_matrix.py [--only mlp,gru] [--json out.json] [--docs]

``--docs`` writes the support table into docs/benchmarks/conversion.md (its ``convert_matrix`` section).

fp32/fp16 rows show max |error| of the hop against its input model (ONNX vs PyTorch, TFLite vs
ONNX); INT8 rows show top-1 agreement with the PyTorch model on 64 seeded inputs. Core ML parity
needs macOS: on Linux the Core ML rows say "spec validated" and show no error figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

CASES = [("onnx", "fp32", {}), ("tflite", "fp32", {}), ("tflite", "fp16", {}),
         ("tflite", "int8-dynamic", {"quantization": "dynamic"}), ("tflite", "int8", {}),
         ("tflite", "int8-int8io", {"io": "int8"}), ("coreml", "fp32", {}), ("coreml", "fp16", {}),
         ("coreml", "int8", {})]


def main(argv=None) -> int:
    import models_zoo

    from edgekit.convert.api import convert
    from edgekit.errors import EdgekitError

    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--json", default=None)
    ap.add_argument("--docs", action="store_true",
                    help="write the support table into docs/benchmarks/conversion.md (every architecture only)")
    args = ap.parse_args(argv)
    if args.docs and args.only:
        ap.error("--docs writes the whole table: leave out --only")
    names = [n for n in models_zoo.ZOO if not args.only or n in args.only.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as td:
        td = Path(td)
        for name in names:
            pt2, calib, ev = models_zoo.export(name, td / name)
            for to, label, extra in CASES:
                precision = label.split("-")[0]
                out = td / name / f"{name}-{label}{ {'onnx': '.onnx', 'tflite': '.tflite', 'coreml': '.mlpackage'}[to]}"
                t0, c0 = time.perf_counter(), time.process_time()
                row = {"arch": name, "to": to, "precision": label}
                try:
                    art = convert(pt2, to=to, precision=precision, out=out, calib_data=calib, eval_data=ev, **extra)
                    row["seconds"] = round(time.perf_counter() - t0, 2)
                    row["cpu_seconds"] = round(time.process_time() - c0, 2)  # the box is shared: CPU time is steadier
                    hops = [s for s in art.lineage if s.kind == "convert"]
                    row["hops"] = [{"hop": s.name, "route": s.metrics.get("route") or s.config.get("converter"),
                                    "seconds": s.seconds, "parity": s.metrics.get("parity"),
                                    "chain_parity": s.metrics.get("chain_parity"),
                                    "violations": s.metrics.get("parity_violations"),
                                    "routes_tried": s.metrics.get("routes_tried")} for s in hops]
                    row["ok"] = True
                except EdgekitError as exc:
                    # the first line says what failed, the next ones why (a chain's failure lists each route's error)
                    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
                    row.update(ok=False, error=" ".join(lines)[:300], seconds=round(time.perf_counter() - t0, 2))
                rows.append(row)
                last = (row.get("hops") or [{}])[-1]
                par = last.get("parity") or {}
                chain = last.get("chain_parity") or par
                print(f"{name:16} {to:7} {label:13} {'ok ' if row['ok'] else 'FAIL'} {row['seconds']:7.2f}s cpu {row.get('cpu_seconds', 0):6.2f}s "
                      f"hop-max|err|={par.get('max_abs_err', float('nan')):.3g} "
                      f"chain-top1={chain.get('top1_agreement')} route={last.get('route')} "
                      f"{'' if row['ok'] else row['error']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    table = support_table(rows)
    print(table)
    if args.docs:
        from _docs import write_section

        write_section(ROOT / "docs" / "benchmarks" / "conversion.md", "convert_matrix", table)
    return 0


def _cell(row: dict) -> str:
    """One hop's figure as the support table shows it: fp32/fp16 the hop's max |error| against the model it came
    from, INT8 the chain's top-1 agreement with PyTorch; Core ML on Linux has no runtime: its spec is validated."""
    if not row["ok"]:
        return "✗ " + row["error"].replace("|", "/")[:200]
    last = (row.get("hops") or [{}])[-1]
    par = last.get("parity") or {}
    chain = last.get("chain_parity") or par
    if row["precision"].startswith("int8"):
        top1 = chain.get("top1_agreement")
        if top1 is not None:
            return f"✓ {top1:.1%}"
    err = par.get("max_abs_err")
    if err is not None:
        return f"✓ {err:.1e}"
    return "spec ✓ (parity: macOS)" if row["to"] == "coreml" else "✓ (no parity figure)"


def support_table(rows: list[dict]) -> str:
    labels = [f"{to} {label}" for to, label, _ in CASES]
    by = {(r["arch"], f"{r['to']} {r['precision']}"): r for r in rows}
    archs = list(dict.fromkeys(r["arch"] for r in rows))
    out = ["| architecture | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for a in archs:
        out.append(f"| {a} | " + " | ".join(_cell(by[(a, c)]) if (a, c) in by else "not run" for c in labels) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
