"""CI's lint and type step (issue #38): ruff and mypy, strict where the code is the contract, a recorded
baseline elsewhere that may only go down.

- ruff (rules in pyproject.toml's [tool.ruff]): zero findings and `ruff format --check` clean in STRICT paths;
  elsewhere the count per rule may not exceed .ci/lint_baseline.json's (and formatting is not checked).
- mypy --strict: zero errors in the device agent package (device_agents/edgekit_agent, checked as Python 3.10,
  the oldest mypy targets; the agent itself runs on 3.9, checked by running it there), in the contract modules
  (STRICT_MYPY: the agent protocol, the report, and the pipeline's packages: devices, orchestration,
  variant_search, llm; issue #43 item 6) and in examples/release_pipeline.py (typed
  against edgekit's public API); elsewhere in edgekit/ (one mypy --strict run over the package) the errors per
  file may not exceed the baseline's.

`python .ci/lint.py --update` rewrites the baseline from the current tree (commit it when the counts went down)."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / ".ci" / "lint_baseline.json"
STRICT = ["device_agents/edgekit_agent", "edgekit/agent/protocol.py", "edgekit/agent/package.py",
          "edgekit/agent/inprocess.py", "edgekit/report", "edgekit/devices/session.py", "edgekit/llm",
          "examples/release_pipeline.py", "docs/_gen", ".ci/docs_examples.py", "tests/unit/test_docs_examples.py"]
STRICT_MYPY = ["edgekit/agent/protocol.py", "edgekit/report", "edgekit/devices", "edgekit/orchestration",
               "edgekit/variant_search", "edgekit/llm", "edgekit/pipeline"]
PY = sys.executable


def ruff_counts() -> tuple[collections.Counter, list[str]]:
    out = subprocess.run([PY, "-m", "ruff", "check", "--output-format", "json", "--exit-zero", "edgekit",
                          "device_agents", "tests", "benchmarks", "examples", "docs/_gen", ".ci/docs_examples.py"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    counts: collections.Counter = collections.Counter()
    strict = []
    for f in json.loads(out):
        rel = str(Path(f["filename"]).resolve().relative_to(ROOT))
        counts[f["code"]] += 1
        if any(rel == s or rel.startswith(s + "/") for s in STRICT):
            strict.append(f"{rel}:{f['location']['row']}: {f['code']} {f['message']}")
    return counts, strict


def ruff_unformatted() -> list[str]:
    """The STRICT paths' files that `ruff format` would change."""
    res = subprocess.run([PY, "-m", "ruff", "format", "--check", "--output-format", "concise", *STRICT], cwd=ROOT,
                         capture_output=True, text=True)
    if res.returncode not in (0, 1):  # 2: ruff itself failed (a syntax error, a bad option)
        raise SystemExit(f"lint: ruff format --check failed: {res.stderr.strip() or res.stdout.strip()}")
    return sorted({ln.split(":")[0] for ln in res.stdout.splitlines() if "unformatted:" in ln})


def mypy(args: list[str], cwd: Path) -> list[str]:
    res = subprocess.run([PY, "-m", "mypy", "--strict", "--ignore-missing-imports", "--no-error-summary",
                          "--python-version", "3.10", *args], cwd=cwd, capture_output=True, text=True)
    return [ln for ln in res.stdout.splitlines() if ": error:" in ln]


def mypy_counts() -> tuple[collections.Counter, list[str]]:
    zero = mypy(["-p", "edgekit_agent"], ROOT / "device_agents")
    zero += mypy(["--follow-imports=silent", "examples/release_pipeline.py"], ROOT)
    per_file: collections.Counter = collections.Counter()
    for ln in mypy(["-p", "edgekit"], ROOT):
        path = ln.split(":")[0]
        if any(path == s or path.startswith(s + "/") for s in STRICT_MYPY):
            zero.append(ln)
        else:
            per_file[path] += 1
    return per_file, zero


def main(argv: list[str]) -> int:
    counts, strict = ruff_counts()
    unformatted = ruff_unformatted()
    per_file, zero = mypy_counts()
    now = {"ruff": dict(sorted(counts.items())), "mypy_strict_errors": dict(sorted(per_file.items()))}
    if "--update" in argv:
        BASELINE.write_text(json.dumps(now, indent=2) + "\n")
        print(f"lint: baseline written: {sum(counts.values())} ruff findings, {sum(per_file.values())} mypy errors")
        return 0
    base = json.loads(BASELINE.read_text())
    failures = ([f"ruff (strict path): {s}" for s in strict] + [f"mypy --strict (must be clean): {z}" for z in zero]
                + [f"ruff format (strict path): {u} (run `ruff format {u}`)" for u in unformatted])
    for kind in ("ruff", "mypy_strict_errors"):
        for key, n in now[kind].items():
            if n > base[kind].get(key, 0):
                failures.append(f"{kind} {key}: {n} > baseline {base[kind].get(key, 0)} (fix the new ones)")
    went_down = [f"{k} {key}: {now[k].get(key, 0)} < baseline {n}" for k in ("ruff", "mypy_strict_errors")
                 for key, n in base[k].items() if now[k].get(key, 0) < n]
    print(f"lint: ruff {sum(counts.values())} findings (baseline {sum(base['ruff'].values())}); mypy --strict "
          f"{sum(per_file.values())} errors in {len(per_file)} files of edgekit/ (baseline "
          f"{sum(base['mypy_strict_errors'].values())}); the agent package, {', '.join(STRICT_MYPY)} and the "
          f"release example: {len(zero)} errors; ruff format: {len(unformatted)} strict-path files to reformat")
    if went_down:
        print("lint: below the baseline (run `python .ci/lint.py --update` and commit): " + "; ".join(went_down[:10]))
    for f in failures:
        print(f"lint: FAIL {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
