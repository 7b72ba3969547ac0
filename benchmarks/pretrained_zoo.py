"""Issue #25's table: every real pretrained model of ``tests/pretrained`` (PP-OCR's text-direction classifier,
recognizer and detector, Silero VAD, MTCNN's ONet: weights from pip packages' wheels, labelled data made here)
through the default ``edgekit deploy`` as a user types it, from a working folder with relative paths and the
model's own ``deploy_args`` (a streaming model's ``--const``/``--state``, a multi-output model's ``--output``).

Prints, per model: the metric, the fp32 value, the shipped variant with its p50 speed-up over fp32 and its metric
drop, the deploy's wall time against its search budget, and every candidate that did not ship with the stage
and the reason it lost (dropped at build, at the host check, at racing, ...), and the CPU's ISA. Measured afresh
(``--remeasure``): the measurement cache would hand back an earlier run's timings.

``--searches quick,full`` also runs ``edgekit deploy --search`` (issue #24's bar) on the same target with NCNN
and ExecuTorch added where they are installed (the local target lists only what every install has), so every
runtime edgekit supports is a candidate: OpenVINO fp32, at the CPU's default precision (bf16 where the CPU has
it, no calibration) and NNCF INT8, NCNN fp32/fp16, besides ORT and LiteRT. For each search it prints the fastest
file inside the tolerance among everything that search measured (its finalists at their final p50 against fp32's
final p50; candidates dropped at racing at their screening p50 against fp32's screening p50), the best of each
runtime, and the default deploy's choice as a fraction of the fastest file of any runtime (target: >= 0.9x on
a VNNI host), each run's speed-up taken over the fp32 it measured itself.

    .venv/bin/python benchmarks/pretrained_zoo.py [--models ocr_cls,vad] [--searches quick,full] [--keep DIR] [--docs]

``--docs`` writes the table, each run's best file per runtime and what did not ship (with the reason the deploy
gave) into docs/benchmarks/pretrained.md (its ``pretrained_zoo`` section; every model only).
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
from compression_table import RUNTIME, target_file  # noqa: E402

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


def _tolerance(rep: dict) -> float:
    """The accuracy-drop limit the deploy's gate applied (in the metric's units)."""
    lim = [c.get("limit") for c in rep["gate"]["checks"] if c["name"] == "accuracy_drop" and c.get("limit") is not None]
    return float(lim[0]) if lim else 1.0


def in_tolerance(rep: dict) -> list[dict]:
    """Every file the search measured inside the tolerance, fastest first: ``{name, format, speedup, drop, how}``.
    Finalists (and their runtime settings, ``name@...``) at their final p50 over fp32's final p50; a candidate
    dropped at racing at its screening p50 over fp32's screening p50 (the same settings, the same session)."""
    tol = _tolerance(rep)
    vs = {v["name"]: v for v in rep["variants"]}
    base = _p50(vs["fp32"])
    out = [{"name": n, "format": v.get("format"), "speedup": base / _p50(v), "drop": v.get("accuracy_drop") or 0.0,
            "how": "final"} for n, v in vs.items()
           if _p50(v) and base and (n == "fp32" or (v.get("accuracy_drop") is not None and v["accuracy_drop"] <= tol))]
    cands = (rep.get("search") or {}).get("candidates") or []
    fp32 = next((c for c in cands if c["name"] == "fp32"), {})
    sbase = (fp32.get("screening") or {}).get("p50")
    for c in cands:
        sc = c.get("screening") or {}
        if (c["status"] == "dropped" and c.get("dropped_at") == "racing" and c["name"] not in vs and sbase
                and sc.get("p50") and sc.get("accuracy_drop") is not None and sc["accuracy_drop"] <= tol):
            out.append({"name": c["name"], "format": c.get("format"), "speedup": sbase / sc["p50"],
                        "drop": sc["accuracy_drop"], "how": "screening"})
    return sorted(out, key=lambda r: -r["speedup"])


def main() -> int:
    from tests import pretrained

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(pretrained.MODELS))
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary one)")
    ap.add_argument("--searches", default="quick", help="quick (the default deploy), full (deploy --search on the "
                    "target with every installed runtime)")
    ap.add_argument("--docs", action="store_true", help="write the tables into docs/benchmarks/pretrained.md")
    a = ap.parse_args()
    if a.docs and a.models != ",".join(pretrained.MODELS):
        ap.error("--docs writes the whole table: leave out --models")
    work = a.keep or Path(tempfile.mkdtemp(prefix="edgekit-pretrained-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    modes = [x for x in a.searches.split(",") if x]
    full_target = target_file("local", work) if "full" in modes else None
    print(f"ISA: {isa()}; target: the default (local){f', for --search {full_target}' if full_target else ''}; "
          f"measured afresh (--remeasure); work: {work}")
    rows, bars, per_runtime = {}, {}, {}
    for name, mode in [(n, m) for n in a.models.split(",") for m in modes]:
        m = pretrained.MODELS[name]
        if mode == modes[0]:  # afresh, also in a kept folder of an earlier run
            shutil.rmtree(work / name, ignore_errors=True)
            pretrained.prepared(name, work)  # work/NAME/{model.onnx|model.pt2, eval.npz, calib.npz}
        model = f"{name}/model.pt2" if (work / name / "model.pt2").exists() else f"{name}/model.onnx"
        out = f"out-{name}" if mode == "quick" else f"out-{name}-{mode}"
        args = [EDGEKIT, "deploy", model, "--eval-data", f"{name}/eval.npz", "--calib-data", f"{name}/calib.npz",
                "--metric", m.metric, *sum((["--metric-option", o] for o in m.metric_options), []),
                *m.deploy_args, *(["--search", "--target", full_target] if mode == "full" else []),
                "--out", out, "--remeasure"]
        shutil.rmtree(work / out, ignore_errors=True)
        t0 = time.perf_counter()
        p = subprocess.run(args, cwd=work, capture_output=True, text=True, env=os.environ.copy())
        wall = time.perf_counter() - t0
        rep_path = work / out / "report.json"
        print(f"\n== {name} {mode} ({m.package}: {m.member.rsplit('/', 1)[-1]}): exit {p.returncode} in {wall:.0f} s")
        print("   $ edgekit " + " ".join(args[1:]))
        if not rep_path.exists():
            print("   no report: " + (p.stderr.strip().splitlines() or ["?"])[-1][:300])
            continue
        rep = json.loads(rep_path.read_text())
        s = rows[(name, mode)] = {**summary(rep), "exit": p.returncode, "wall_s": wall}
        ok = bars[(name, mode)] = in_tolerance(rep)
        sp = f"{s['speedup']:.2f}x" if s["speedup"] else "n/a"
        drop = f"{s['drop']:+.2f}" if s["drop"] is not None else "n/a"
        print(f"   metric {s['metric']}: fp32 {s['fp32']:.2f}; ships {s['ship']} ({sp} fp32's p50, drop {drop}); "
              f"gate {'passed' if s['gate'] else 'FAILED'}; search {s['search_s']} s of {s['budget_s']} s")
        for ln in s["lost"]:
            print(f"     not {ln}")
        best = {}
        for r in ok:  # fastest first: the first of each runtime is its best
            best.setdefault(r["format"], r)
        per_runtime[(name, mode)] = "; ".join(
            f"{RUNTIME.get(f, f)} {r['name']} {r['speedup']:.2f}x ({r['how']})" for f, r in best.items())
        print("   fastest in tolerance, per runtime: " + per_runtime[(name, mode)])
    table = ["| model | search | metric | fp32 | ships | speed-up | drop | fastest in tolerance | ships / fastest "
             "| deploy s | exit |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (name, mode), s in rows.items():
        sp = f"{s['speedup']:.2f}x" if s["speedup"] else "n/a"
        drop = f"{s['drop']:+.2f}" if s["drop"] is not None else "n/a"
        # the fastest file of any runtime: the full search's when it ran, else this search's own
        ok = bars.get((name, "full")) or bars[(name, mode)]
        top = ok[0] if ok else None
        ratio = f"{s['speedup'] / top['speedup']:.2f}" if s["speedup"] and top else "n/a"
        fastest = f"{top['name']} {top['speedup']:.2f}x" if top else "n/a"
        table.append(f"| {name} | {mode} | {s['metric']} | {s['fp32']:.2f} | {s['ship']} | {sp} | {drop} | "
                     f"{fastest} | {ratio} | {s['wall_s']:.0f} | {s['exit']} |")
    print("\n" + "\n".join(table))
    if a.docs:
        _write_docs(table, rows, per_runtime)
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if len(rows) == len(a.models.split(",")) * len(modes) else 1


def _write_docs(table: list[str], rows: dict, per_runtime: dict) -> None:
    from _docs import write_section

    body = ["Speed-ups over the fp32 file's p50 (onnxruntime, the target's threads) measured in the same run "
            "(`--remeasure`); `quick`: the default deploy, `full`: `deploy --search` on the local target with every "
            "installed runtime. ships / fastest: the shipped file's speed-up over the fastest file inside the "
            "tolerance that the full search measured (#24's bar: >= 0.9).", "", *table, "",
            "The fastest file inside the tolerance, per runtime:", ""]
    body += [f"- {name} {mode}: {txt}" for (name, mode), txt in per_runtime.items()]
    body += ["", "What did not ship, and the reason each deploy gave:", ""]
    for (name, mode), s in rows.items():
        body += [f"- **{name} {mode}**: " + ("nothing else was built" if not s["lost"] else "")]
        body += [f"    - {ln.replace('|', '/')}" for ln in s["lost"]]
    write_section(ROOT / "docs" / "benchmarks" / "pretrained.md", "pretrained_zoo", "\n".join(body))


if __name__ == "__main__":
    sys.exit(main())
