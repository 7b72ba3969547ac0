"""Issue #45's bar: a language model's default deploy as a user types it, on a trained model and on a ~100M one.

    edgekit deploy MODEL_DIR --eval-text eval.txt --out OUT          # no optional flag

For each model it runs, through the installed CLI in a fresh edgekit home (so the build caches and the device's
kept bandwidth start empty, as on a user's first run):

1. the default deploy quiet;
2. the same command again (a second deploy: every export and lowering from the build cache);
3. the default deploy beside one bounded CPU hog (``timeout N python3 -c 'while 1: pass'``), in another fresh home;
4. with ``--search``: ``--search`` quiet in the first home (its rows the default did not build are built now),
   for the default's answer against the search's (the bar: >= 0.9x its decode rate).

and prints, for each run: the wall time, the exit status, the time budget and how much of it the race used, the
shipped file with its decode rate, each row's predicted decode beside the measured one, and each row not built
with its reason (the report's race section). The CPU's ISA and the edgekit commit head the table.

The models: ``trained``, a Qwen2-architecture model trained here on real text (the licence corpus of
tests/lm_zoo.py, its held-out tail as the eval text; hidden 256, 6 layers, a 2048-token vocabulary, 600 steps);
``llama100m``, the ~100M Llama-architecture model of benchmarks/llm_runtimes.py (random weights: its speeds are a
100M model's, its quality figures are not a trained model's).

    .venv/bin/python benchmarks/lm_default_deploy.py [--models trained,llama100m] [--search] [--hog-seconds 1200]
        [--docs]
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
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cpu import isa  # noqa: E402
from _docs import commit, write_section  # noqa: E402

EDGEKIT = ROOT / ".venv" / "bin" / "edgekit"  # --edgekit: another install's (e.g. one with executorch and llama.cpp)
PAGE = ROOT / "docs" / "benchmarks" / "language-models.md"
TRAINED = dict(hidden=256, layers=6, heads=4, kv_heads=2, vocab=2048, context=256, steps=600)


def model_folder(name: str, work: Path) -> Path:
    """The model's folder (built once: the trained model is cached by tests/lm_zoo.py's content key)."""
    from lm_zoo import build_tiny_lm

    if name == "trained":
        return build_tiny_lm("qwen2", **TRAINED)  # type: ignore[arg-type]
    if name == "tiny":  # the tests' tiny trained Llama: a quick check of this script
        return build_tiny_lm("llama")
    if name == "llama100m":
        from llm_runtimes import build_model

        return build_model("llama", work / "llama100m", 256)
    raise SystemExit(f"unknown model {name!r}: trained, llama100m or tiny")


def fresh_home(home: Path) -> Path:
    """An empty edgekit home (no build cache, no kept bandwidth, no measurement cache) that still finds the host's
    llama.cpp build: a one-time install, like the pip packages, not part of a deploy."""
    shutil.rmtree(home, ignore_errors=True)
    (home / "cache").mkdir(parents=True)
    llama = Path(os.path.expanduser("~/.cache/edgekit/llama.cpp"))
    if llama.is_dir():
        (home / "cache" / "llama.cpp").symlink_to(llama)
    return home


def deploy(edgekit: Path, model: Path, text: Path, out: Path, home: Path, *extra: str) -> dict:
    """One `edgekit deploy` in its own process, as a user types it; its wall time, exit status and report."""
    env = {**os.environ, "EDGEKIT_HOME": str(home)}
    t0 = time.perf_counter()
    res = subprocess.run([str(edgekit), "deploy", str(model), "--eval-text", str(text), "--out", str(out), *extra],
                         capture_output=True, text=True, env=env, cwd=out.parent, timeout=7200)
    wall = time.perf_counter() - t0
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else None
    first = (res.stdout.strip().splitlines() or [""])[0]
    return {"wall_s": wall, "exit": res.returncode, "report": report, "first_line": first,
            "stderr_tail": res.stderr[-600:]}


def summary(label: str, run: dict) -> list[str]:
    """The run's lines: wall, exit, answer, budget; each row's predicted and measured decode; rows not built."""
    r = run["report"]
    if r is None:
        return [f"- **{label}**: exit {run['exit']} in {run['wall_s']:.0f} s, no report ({run['stderr_tail']!r})"]
    search = r.get("search") or {}
    ship = (r.get("decision") or {}).get("ship")
    by_name = {v["name"]: v for v in r.get("variants") or []}
    rate = ((by_name.get(ship) or {}).get("generation") or {}).get("decode_tokens_per_s") if ship else None
    shipped = by_name.get(ship) or {}
    other = (shipped.get("device_state") or {}).get("other_cpu_fraction")  # the agent's reading during the run
    busy = f"other processes took {other:.0%} of the CPU while it was measured" if other is not None else ""
    lines = [f"- **{label}**: exit {run['exit']} in {run['wall_s']:.0f} s wall (race {search.get('seconds', 0):.0f} s "
             f"of its {search.get('time_budget_s', 0):.0f} s budget); shipped **{ship}**"
             + (f" at {rate:.1f} tok/s" if rate else "") + (f"; {busy}" if busy else "")]
    rows = []
    for v in r.get("variants") or []:
        pred = next((s["metrics"]["predicted_decode"] for s in reversed(v.get("lineage") or [])
                     if "predicted_decode" in (s.get("metrics") or {})), None)
        measured = (v.get("generation") or {}).get("decode_tokens_per_s")
        hit = next((s["metrics"]["cache"] for s in v.get("lineage") or []
                    if isinstance((s.get("metrics") or {}).get("cache"), str)), None)
        p = pred.get("decode_tokens_per_s") if isinstance(pred, dict) else None
        rows.append(f"  | {v['name']} | {f'{p:.0f}' if p else '-'} | {f'{measured:.0f}' if measured else '-'} | "
                    f"{f'{measured / p:.2f}' if p and measured else '-'} | {'cache' if hit else 'built'} |")
    if rows:
        lines += ["", "  | file | predicted tok/s | measured tok/s | measured / predicted | build |",
                  "  |---|---|---|---|---|", *rows, ""]
    for c in search.get("candidates") or []:
        if c.get("status") == "dropped":
            lines.append(f"  - not built or not measured: {c['name']}: {c.get('reason') or ''}")
    skipped = (r.get("settings") or {}).get("skipped") or {}
    for why in dict.fromkeys(skipped.values()):
        names = [n for n, w in skipped.items() if w == why]
        lines.append(f"  - not built: {', '.join(names)}: {why}")
    return lines


def rate_of(run: dict) -> float | None:
    r = run["report"]
    if not r or not (r.get("decision") or {}).get("ship"):
        return None
    ship = r["decision"]["ship"]
    v = next(v for v in r["variants"] if v["name"] == ship)
    return (v.get("generation") or {}).get("decode_tokens_per_s")


def same_run_ratio(default: dict, search: dict) -> tuple[str, float] | None:
    """The default deploy's shipped file against --search's, both as the --search run measured them."""
    d, s = default["report"], search["report"]
    if not d or not s or not (d.get("decision") or {}).get("ship") or not (s.get("decision") or {}).get("ship"):
        return None
    rates = {v["name"]: (v.get("generation") or {}).get("decode_tokens_per_s") for v in s["variants"]}
    mine, best = rates.get(d["decision"]["ship"]), rates.get(s["decision"]["ship"])
    return (d["decision"]["ship"], mine / best) if mine and best else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="trained,llama100m")
    ap.add_argument("--search", action="store_true", help="also run --search quiet (the 0.9x bar)")
    ap.add_argument("--hog-seconds", type=int, default=1200, help="the bounded CPU hog's lifetime")
    ap.add_argument("--keep", type=Path, default=None, help="keep the work folder here")
    ap.add_argument("--edgekit", type=Path, default=EDGEKIT, help="the edgekit command to run (another venv's)")
    ap.add_argument("--docs", action="store_true",
                    help=f"write the result between the `benchmark lm_default_deploy` markers of {PAGE.name}")
    args = ap.parse_args(argv)
    from lm_zoo import eval_text

    work = Path(args.keep or tempfile.mkdtemp(prefix="edgekit-lm-default-"))
    work.mkdir(parents=True, exist_ok=True)
    text = eval_text(work)
    lines = [f"{isa()}; edgekit {commit()}; {os.cpu_count()} CPUs", ""]
    for name in args.models.split(","):
        model = model_folder(name, work)
        zoo = model / "edgekit_zoo.json"
        about = json.loads(zoo.read_text()) if zoo.is_file() else {}
        trained = (f"trained here: held-out loss {about['heldout_loss']:.2f} nats against a uniform guess's "
                   f"{about.get('uniform_loss', 0):.2f}, {about.get('train_tokens', 0)} training tokens"
                   if "heldout_loss" in about else "random weights")
        lines += [f"### {name} ({trained})", ""]
        homes = [fresh_home(work / f"{name}-home-quiet"), fresh_home(work / f"{name}-home-hog")]
        ek = args.edgekit
        quiet = deploy(ek, model, text, work / f"{name}-quiet", homes[0])
        lines += summary("default deploy, quiet (first run)", quiet)
        print("\n".join(lines), flush=True)
        again = deploy(ek, model, text, work / f"{name}-again", homes[0])
        lines += summary("the same deploy again (second run: the build cache)", again)
        # bounded by itself (a `timeout` wrapper killed would leave its child spinning) and killed after the run
        hog = subprocess.Popen([sys.executable, "-c", f"import time\nt = time.time() + {args.hog_seconds}\n"
                                "while time.time() < t: pass"])
        try:
            busy = deploy(ek, model, text, work / f"{name}-hog", homes[1])
        finally:
            hog.kill()
            hog.wait()
        lines += summary("default deploy beside one CPU hog (first run)", busy)
        if args.search:
            s = deploy(ek, model, text, work / f"{name}-search", homes[0], "--search")
            lines += summary("--search, quiet", s)
            best = rate_of(s)
            for label, run in (("quiet", quiet), ("beside the hog", busy)):
                got = rate_of(run)
                if got and best:
                    lines.append(f"- the default deploy {label} ships {got / best:.2f}x --search's decode rate "
                                 "(separate runs: each at its own moment's load)")
                same = same_run_ratio(run, s)
                if same:
                    lines.append(f"- in the --search run itself, the default's file ({same[0]}) decodes {same[1]:.2f}x "
                                 "the search's shipped file (one run: the same load)")
        lines.append("")
        print("\n".join(lines), flush=True)
    if args.docs:
        write_section(PAGE, "lm_default_deploy", "\n".join(lines[2:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
