"""Issue #25's table: every real pretrained model of ``tests/pretrained`` (PP-OCR's text-direction classifier,
recognizer and detector, Silero VAD, MTCNN's ONet: weights from pip packages' wheels, labelled data made here)
through the default ``edgekit deploy`` as a user types it, from a working folder with relative paths and the
model's own ``deploy_args`` (a streaming model's ``--const``/``--state``, a multi-output model's ``--output``).

Prints, per model: the metric, the fp32 value, the shipped variant with its p50 speed-up over fp32 and its metric
drop, the deploy's wall time against its search budget, and every candidate that did not ship with the stage
and the reason it lost (dropped at build, at the host check, at racing, ...), and the CPU's ISA. Measured afresh
(``--remeasure``): the measurement cache would hand back an earlier run's timings.

    .venv/bin/python benchmarks/pretrained_zoo.py [--models ocr_cls,vad] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_cpu.py
from _cpu import isa  # noqa: E402

EDGEKIT = str(Path(sys.executable).with_name("edgekit"))


def _p50(v: dict) -> float | None:
    return (v.get("latency_ms") or {}).get("p50")


def summary(rep: dict) -> dict:
    """The row of the table from a deploy's report.json."""
    vs = {v["name"]: v for v in rep["variants"]}
    base = vs["fp32"]
    ship = (rep.get("decision") or {}).get("ship")
    shipped = vs.get(ship) if ship else None
    speed = (_p50(base) / _p50(shipped)) if shipped and _p50(shipped) and _p50(base) else None
    lost = []
    for c in (rep.get("search") or {}).get("candidates") or []:
        if c["status"] == "dropped":
            why = " ".join((c.get("reason") or "").split())[:200]  # one line: reasons may hold a route list
            lost.append(f"{c['name']}: dropped at {c.get('dropped_at')}: {why}")
        elif c["status"] == "finalist" and c["name"] != ship:
            lost.append(f"{c['name']}: a finalist, not chosen ({(c.get('reason') or 'not the best')[:100]})")
    acc = base.get("accuracy") or {}
    return {"metric": acc.get("metric"), "fp32": acc.get("value"), "ship": ship,
            "speedup": speed, "drop": shipped.get("accuracy_drop") if shipped else None, "lost": lost,
            "gate": rep["gate"]["passed"], "search_s": (rep.get("search") or {}).get("seconds"),
            "budget_s": (rep.get("search") or {}).get("time_budget_s")}


def main() -> int:
    from tests import pretrained

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(pretrained.MODELS))
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary one)")
    a = ap.parse_args()
    work = a.keep or Path(tempfile.mkdtemp(prefix="edgekit-pretrained-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"ISA: {isa()}; target: the default (local); measured afresh (--remeasure); work: {work}")
    rows = {}
    for name in a.models.split(","):
        m = pretrained.MODELS[name]
        pretrained.prepared(name, work)  # work/NAME/{model.onnx|model.pt2, eval.npz, calib.npz}
        model = f"{name}/model.pt2" if (work / name / "model.pt2").exists() else f"{name}/model.onnx"
        args = [EDGEKIT, "deploy", model, "--eval-data", f"{name}/eval.npz", "--calib-data", f"{name}/calib.npz",
                "--metric", m.metric, *sum((["--metric-option", o] for o in m.metric_options), []),
                *m.deploy_args, "--out", f"out-{name}", "--remeasure"]
        shutil.rmtree(work / f"out-{name}", ignore_errors=True)
        t0 = time.perf_counter()
        p = subprocess.run(args, cwd=work, capture_output=True, text=True, env=os.environ.copy())
        wall = time.perf_counter() - t0
        rep_path = work / f"out-{name}" / "report.json"
        print(f"\n== {name} ({m.package}: {m.member.rsplit('/', 1)[-1]}): exit {p.returncode} in {wall:.0f} s")
        print("   $ edgekit " + " ".join(args[1:]))
        if not rep_path.exists():
            print("   no report: " + (p.stderr.strip().splitlines() or ["?"])[-1][:300])
            continue
        s = rows[name] = {**summary(json.loads(rep_path.read_text())), "exit": p.returncode, "wall_s": wall}
        sp = f"{s['speedup']:.2f}x" if s["speedup"] else "n/a"
        drop = f"{s['drop']:+.2f}" if s["drop"] is not None else "n/a"
        print(f"   metric {s['metric']}: fp32 {s['fp32']:.2f}; ships {s['ship']} ({sp} fp32's p50, drop {drop}); "
              f"gate {'passed' if s['gate'] else 'FAILED'}; search {s['search_s']} s of {s['budget_s']} s")
        for ln in s["lost"]:
            print(f"     not {ln}")
    print("\n| model | metric | fp32 | ships | speed-up | drop | deploy s | exit |")
    print("|---|---|---|---|---|---|---|---|")
    for name, s in rows.items():
        sp = f"{s['speedup']:.2f}x" if s["speedup"] else "n/a"
        drop = f"{s['drop']:+.2f}" if s["drop"] is not None else "n/a"
        print(f"| {name} | {s['metric']} | {s['fp32']:.2f} | {s['ship']} | {sp} | {drop} | {s['wall_s']:.0f} "
              f"| {s['exit']} |")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if len(rows) == len(a.models.split(",")) else 1


if __name__ == "__main__":
    sys.exit(main())
