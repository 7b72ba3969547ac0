"""Issue #43 (item 3, "the same answer, busy or quiet"): the digits demo's default deploy, as a user types it,

    edgekit deploy examples/digits/artifacts/model.pt2 --target local \\
        --eval-data examples/digits/artifacts/eval.npz --calib-data examples/digits/artifacts/calib.npz --out OUT

run N times without and N times beside one bounded CPU hog (a `while True: pass` loop this script starts, pins to one
core and kills after each run), each with a fresh EDGEKIT_HOME (nothing borrowed from a measurement cache). It
prints each run's shipped file (name, sha256, size), its wall time and what decided it (the finals' alternating
rounds: the ratio and its CI) and the host's load as the deploy recorded it ("quiet" means no hog of this script's:
on a shared machine other work may run), then whether every run shipped the same file. Target: the same file all
2N times.

    .venv/bin/python benchmarks/same_answer.py [--runs 3] [--hog-cpu 0] [--json out.json]
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cpu import isa  # noqa: E402

EDGEKIT = Path(sys.executable).with_name("edgekit")
ART = ROOT / "examples" / "digits" / "artifacts"


class Hog:
    """One busy loop pinned to ``cpu``, ending by itself after ``seconds`` (killed on exit, whichever is first)."""

    def __init__(self, cpu: int | None, seconds: float = 1800.0):
        self.cpu, self.seconds, self.proc = cpu, seconds, None

    def __enter__(self) -> "Hog":
        code = f"import time\nend = time.monotonic() + {self.seconds}\nwhile time.monotonic() < end: pass\n"
        self.proc = subprocess.Popen([sys.executable, "-c", code])
        if self.cpu is not None:
            os.sched_setaffinity(self.proc.pid, {self.cpu})
        time.sleep(1.0)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def artifacts() -> None:
    """The demo's model and data, built as examples/digits/run.sh builds them when missing."""
    if not (ART / "model.pt2").is_file():
        subprocess.run([sys.executable, str(ROOT / "examples" / "digits" / "train.py"), "--out", str(ART)], check=True)


def deploy(work: Path) -> dict:
    out = Path(tempfile.mkdtemp(prefix="out-", dir=work))
    home = Path(tempfile.mkdtemp(prefix="home-", dir=work))
    cmd = [str(EDGEKIT), "deploy", str(ART / "model.pt2"), "--target", "local", "--eval-data", str(ART / "eval.npz"),
           "--calib-data", str(ART / "calib.npz"), "--out", str(out)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "EDGEKIT_HOME": str(home)})
    wall = time.perf_counter() - t0
    if not (out / "report.json").is_file():
        return {"exit": p.returncode, "wall_s": round(wall, 1), "error": p.stderr.strip().splitlines()[-3:]}
    rep = json.loads((out / "report.json").read_text())
    s = rep.get("search") or {}
    shipped = s.get("shipped") or {}
    sel = next((v for v in rep["variants"] if v["name"] == s.get("selected")), None)
    reason = (rep.get("decision") or {}).get("reason") or ""
    host = (s.get("host") or {}).get("summary")
    return {"exit": p.returncode, "wall_s": round(wall, 1), "shipped": s.get("selected"),
            "file": Path(shipped["file"]).name if shipped.get("file") else None,
            "sha256": (shipped.get("sha256") or "")[:12], "size_bytes": sel["size_bytes"] if sel else None,
            "decided_by": reason.split("; ", 1)[1] if "; " in reason else reason, "host": host}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="deploys quiet, then as many beside the hog")
    ap.add_argument("--hog-cpu", type=int, default=None,
                    help="the core the hog is pinned to (default: the first usable core)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    artifacts()
    cpus = sorted(os.sched_getaffinity(0))
    hog_cpu = a.hog_cpu if a.hog_cpu is not None else cpus[0]
    work = Path(tempfile.mkdtemp(prefix="edgekit-same-answer-"))
    os.environ.setdefault("EDGEKIT_LOCAL_DEVICE_DIR", str(work / "device"))
    print(f"CPU: {isa()}; {len(cpus)} usable cores; hog pinned to core {hog_cpu}", flush=True)
    rows = []
    for load in ("quiet", "1 hog"):
        for _ in range(a.runs):
            if load == "quiet":
                r = deploy(work)
            else:
                with Hog(hog_cpu):
                    r = deploy(work)
            r = {"run": len(rows) + 1, "load": load, **r}
            rows.append(r)
            print(json.dumps(r), flush=True)
    print()
    print("| run | load | shipped | file sha256 | size KB | wall s | decided by | host as the deploy saw it |")
    print("|---:|---|---|---|---:|---:|---|---|")
    for r in rows:
        kb = f"{r['size_bytes'] / 1024:.0f}" if r.get("size_bytes") else ""
        print(f"| {r['run']} | {r['load']} | {r.get('shipped') or 'nothing (exit %s)' % r['exit']} | "
              f"{r.get('sha256', '')} | {kb} | {r['wall_s']} | {r.get('decided_by', r.get('error', ''))} | "
              f"{r.get('host') or ''} |")
    # the same file: its bytes (a runtime setting the tuning picked, name@t2, is the same file run another way)
    files = {r.get("sha256") or None for r in rows}
    same = len(files) == 1 and None not in files
    print()
    names = ", ".join(sorted({str(r.get("shipped")) for r in rows}))
    print(f"same file in all {len(rows)} runs: {'yes' if same else 'NO'} ({names})")
    if a.json:
        Path(a.json).write_text(json.dumps({"cpu": isa(), "rows": rows, "same": same}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
