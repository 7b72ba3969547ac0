"""Issue #22: edgekit on a busy host. For each model and each number of CPU hogs (0, 1, 2: bounded busy
loops this script starts and stops), as a user types the commands (the installed `edgekit`, a fresh
EDGEKIT_HOME each run so nothing is borrowed from a cache):

  preparation (the search's timeline span: model load, reference outputs, export + parity),
  `edgekit quantize` (accuracy-aware, --calib-data + --eval-data),
  the default deploy (the short search, its budget), and `edgekit deploy --search` (its budget),

each with its wall time, what shipped and its class (INT8 / fp16 / fp32), and the host facts the run
recorded (free cores, load, the threads it used). With --old-threads N it also times preparation with the
thread count forced to N (EDGEKIT_HOST_THREADS=N: what torch's default did before the thread policy), so
the ratio is measured side by side in one run.

Targets on this machine (issue #22): preparation with 2 hogs <= 3x its quiet time; the default deploy ends
within its budget +-10% and ships the same variant class as when quiet; quantize <= 60 s with 2 hogs.

    .venv/bin/python benchmarks/busy_host.py [--models mbv2,hybrid] [--hogs 0,1,2] [--steps prep,quantize,quick,full]
        [--quick-budget 300] [--full-budget 900] [--old-threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cpu import isa  # noqa: E402

EDGEKIT = Path(sys.executable).with_name("edgekit")


class Hogs:
    """n busy loops, each ending by itself after ``seconds`` (killed on exit, whichever comes first)."""

    def __init__(self, n: int, seconds: float = 3600.0):
        self.n, self.seconds, self.procs = n, seconds, []

    def __enter__(self):
        code = f"import time\nend = time.monotonic() + {self.seconds}\nwhile time.monotonic() < end: pass\n"
        self.procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(self.n)]
        time.sleep(1.0)
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
            p.wait(timeout=10)


def model(name: str):
    if name == "mbv2":
        from compression_table import perf_mobilenet

        return perf_mobilenet()
    from tests import zoo

    return zoo.get(name)


def variant_class(precision: str | None, name: str | None) -> str:
    if not name:
        return "nothing"
    p = (precision or "").lower()
    return "INT8" if "int8" in p or "int8" in name or "dynamic" in name else ("fp16" if "16" in p else "fp32")


def run(args: list[str], work: Path, env: dict | None = None, timeout: float = 3600) -> tuple[int, float, str]:
    home = Path(tempfile.mkdtemp(prefix="home-", dir=work))
    e = {**os.environ, "EDGEKIT_HOME": str(home), **(env or {})}
    t0 = time.perf_counter()
    p = subprocess.run([str(EDGEKIT), *args], capture_output=True, text=True, env=e, timeout=timeout)
    return p.returncode, time.perf_counter() - t0, p.stderr


def deploy_row(m, work: Path, budget: float, full: bool, env: dict | None = None) -> dict:
    out = Path(tempfile.mkdtemp(prefix="out-", dir=work))
    args = ["deploy", str(m.pt2), "--target", "local", "--eval-data", str(m.eval), "--calib-data", str(m.calib),
            "--time-budget", str(budget), "--out", str(out), "--json"] + (["--search"] if full else [])
    if m.facts.get("metric"):
        args += ["--metric", m.facts["metric"]]
    code, wall, err = run(args, work, env)
    if not (out / "report.json").is_file():
        return {"exit": code, "wall_s": wall, "error": err.strip().splitlines()[-1:] if err.strip() else None}
    rep = json.loads((out / "report.json").read_text())
    s = rep.get("search") or {}
    tl = s.get("timeline") or {}
    spans = tl.get("spans") or []
    sel = next((v for v in rep["variants"] if v["name"] == s.get("selected")), None)
    base = next(v for v in rep["variants"] if v["name"] == rep["baseline"])
    speed = (base["latency_ms"]["p50"] / sel["latency_ms"]["p50"]) if sel and sel.get("latency_ms") else None
    return {"exit": code, "wall_s": round(wall, 1), "budget_s": budget,
            "preparation_s": round(sum(x["seconds"] for x in spans if x["stage"] == "preparation"), 1),
            "builds_s": round(sum(x["seconds"] for x in spans if x["stage"] == "build"), 1),
            "lock_wait_s": tl.get("lock_wait_s"), "unattributed_s": tl.get("unattributed_s"),
            "shipped": s.get("selected"), "class": variant_class(sel.get("precision") if sel else None, s.get("selected")),
            "speedup": round(speed, 2) if speed else None,
            "not_built": [c["name"] for c in s.get("candidates", []) if c.get("dropped_at") == "build"],
            "host": (s.get("host") or {}).get("summary")}


def quantize_row(m, work: Path) -> dict:
    out = work / f"q-{time.monotonic_ns()}.onnx"
    args = ["quantize", str(m.pt2), "--calib-data", str(m.calib), "--eval-data", str(m.eval), "--out", str(out)]
    if m.facts.get("metric"):
        args += ["--metric", m.facts["metric"]]
    code, wall, err = run(args, work)
    return {"exit": code, "wall_s": round(wall, 1), **({"error": err.strip().splitlines()[-1:]} if code else {})}


def took(r: dict) -> str:
    """A deploy's wall time and budget, or why there is none."""
    if not r:
        return "not run"
    return f"{r['wall_s']} ({r['budget_s']:g})" if "budget_s" in r else f"failed ({r.get('error')})"


def ships(r: dict) -> str:
    if not r.get("shipped"):
        return ""
    speed = f"{r['speedup']}x" if r.get("speedup") else "speed-up not measured"
    return f"{r['shipped']} {r['class']} {speed}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="mbv2,hybrid")
    ap.add_argument("--hogs", default="0,1,2")
    ap.add_argument("--steps", default="prep,quantize,quick,full")
    ap.add_argument("--quick-budget", type=float, default=300.0)
    ap.add_argument("--full-budget", type=float, default=900.0)
    ap.add_argument("--old-threads", type=int, default=None,
                    help="also time preparation with EDGEKIT_HOST_THREADS=N (the old default: every core)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--docs", action="store_true",
                    help="write the table and the targets into docs/benchmarks/busy-host.md (its `benchmark busy_host` "
                    "section)")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="edgekit-busy-host-"))
    os.environ.setdefault("EDGEKIT_LOCAL_DEVICE_DIR", str(work / "device"))
    steps = a.steps.split(",")
    print(f"CPU: {isa()}; {len(os.sched_getaffinity(0))} usable cores")
    results: dict = {}
    for name in a.models.split(","):
        m = model(name)
        for n in [int(h) for h in a.hogs.split(",")]:
            row: dict = {}
            with Hogs(n):
                if "prep" in steps:  # preparation alone: a search whose budget builds nothing after it
                    row["prep"] = deploy_row(m, work, 0.0, False)
                    if a.old_threads:
                        row["prep_old"] = deploy_row(m, work, 0.0, False, {"EDGEKIT_HOST_THREADS": str(a.old_threads)})
                if "quantize" in steps:
                    row["quantize"] = quantize_row(m, work)
                if "quick" in steps:
                    row["quick"] = deploy_row(m, work, a.quick_budget, False)
                if "full" in steps:
                    row["full"] = deploy_row(m, work, a.full_budget, True)
            results.setdefault(name, {})[n] = row
            print(f"{name} hogs={n}: {json.dumps(row)}", flush=True)
    lines: list[str] = []  # the table and the targets, printed and (with --docs) written into the page

    def say(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    print()
    say(f"| model | hogs | preparation s | (threads forced to {a.old_threads}) | quantize s | default deploy s "
          "(budget) | shipped | deploy --search s (budget) | shipped | host |")
    say("|---|---:|---:|---:|---:|---:|---|---:|---|---|")
    for name, rows in results.items():
        for n, r in rows.items():
            p, po, q, d, f = (r.get(k, {}) for k in ("prep", "prep_old", "quantize", "quick", "full"))
            say(f"| {name} | {n} | {p.get('preparation_s', 'not run')} | {po.get('preparation_s', 'not run')} | "
                f"{q.get('wall_s', 'not run')} | {took(d)} | {ships(d)} | {took(f)} | {ships(f)} | "
                f"{(d or p).get('host', '')} |")
    say()
    for name, rows in results.items():  # the targets
        quiet, busy = rows.get(0, {}), rows.get(max(rows))
        if quiet.get("prep") and busy.get("prep") and quiet["prep"].get("preparation_s"):
            r = busy["prep"]["preparation_s"] / quiet["prep"]["preparation_s"]
            say(f"- {name}: preparation {max(rows)} hogs / quiet = {r:.2f}x (target <= 3x): "
                f"{'met' if r <= 3 else 'MISSED'}")
        if busy.get("quantize"):
            w = busy["quantize"]["wall_s"]
            say(f"- {name}: quantize with {max(rows)} hogs {w} s (target <= 60 s): {'met' if w <= 60 else 'MISSED'}")
        for n, r in rows.items():
            d = r.get("quick")
            if d and d.get("budget_s"):
                within = d["wall_s"] <= 1.1 * d["budget_s"]
                same = d.get("class") == (quiet.get("quick") or {}).get("class")
                say(f"- {name} hogs={n}: default deploy {d['wall_s']} s of {d['budget_s']:g} s "
                      f"({'within +10%' if within else 'OVER +10%'}), ships {d.get('class')} "
                      f"({'same class as quiet' if same else 'NOT the quiet class'})")
    if a.json:
        Path(a.json).write_text(json.dumps({"isa": isa(), "results": results}, indent=1))
    if a.docs:
        from _docs import write_section

        write_section(ROOT / "docs" / "benchmarks" / "busy-host.md", "busy_host", "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
