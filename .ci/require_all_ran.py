"""Fail a CI step whose tests did not all run: `python .ci/require_all_ran.py STEP junit.xml [more.xml ...]`
(a step may run in phases, e.g. parallel then serial: their files are judged together).

A missing tool or runtime makes its tests skip, and a skipped route must not pass as green: every skip
fails the step unless `.ci/allowed_skips.txt` names it (a test id pattern, the steps it may skip in, and
why). A step that selected no test at all fails too (pytest's exit 5 is not a pass). An allowlist line that
names a step no CI script judges fails every step: the steps are read from the scripts themselves (STEP as
.ci/run and .ci/*.sh pass it to .ci/pytest_step.sh or to this script), not from a list kept beside them."""

from __future__ import annotations

import fnmatch
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ALLOWLIST = Path(__file__).with_name("allowed_skips.txt")
# `pytest_step.sh NAME` or `require_all_ran.py NAME` on a command line of a CI script (a "$name" is not a name)
_CALL = re.compile(r"""(?:pytest_step\.sh|require_all_ran\.py)"?\s+([A-Za-z][\w-]*)""")


def judged_steps(ci: Path = ALLOWLIST.parent) -> set[str]:
    """The steps whose skips this script judges: the names .ci/run and .ci/*.sh call .ci/pytest_step.sh (which
    calls this script with its NAME) or this script with, comment lines left out."""
    names: set[str] = set()
    for script in [ci / "run", *sorted(ci.glob("*.sh"))]:
        for line in script.read_text(encoding="utf-8").splitlines():
            if not line.lstrip().startswith("#"):
                names.update(_CALL.findall(line))
    return names


def allowed(step: str) -> list[tuple[str, str]]:
    """(pattern, reason) for the skips allowed in ``step``. A line: ``PATTERN | STEPS | REASON``, where
    PATTERN matches ``tests.unit.test_x::test_name[param]`` and STEPS is a comma list of judged steps
    (:func:`judged_steps`) or ``*``; a line naming any other step exits with the line and the steps."""
    known = judged_steps()
    out = []
    for n, line in enumerate(ALLOWLIST.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split("|")]
        if len(parts) != 3 or not all(parts):
            sys.exit(f"{ALLOWLIST.name}:{n}: expected 'PATTERN | STEPS | REASON', got {line!r}")
        pattern, steps, reason = parts
        names = [s.strip() for s in steps.split(",")]
        unknown = [s for s in names if s not in known] if steps != "*" else []
        if unknown:
            sys.exit(f"{ALLOWLIST.name}:{n}: no CI step is named {', '.join(map(repr, unknown))} "
                     f"(the steps that judge skips: {', '.join(sorted(known))}, or *)")
        if steps == "*" or step in names:
            out.append((pattern, reason))
    return out


def main(step: str, *paths: str) -> None:
    cases = []
    for path in paths:
        root = ET.parse(path).getroot()
        suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
        cases += [c for s in suites for c in s.iter("testcase")]
    rules = allowed(step)
    ran = skipped_ok = 0
    bad, unexpected = [], []
    for c in cases:
        tid = f"{c.get('classname')}::{c.get('name')}"
        if c.find("failure") is not None or c.find("error") is not None:
            bad.append(tid)
        skip = c.find("skipped")
        if skip is None:
            ran += 1
            continue
        why = next((r for p, r in rules if fnmatch.fnmatchcase(tid, p)), None)
        if why is None:
            unexpected.append(f"{tid}: {skip.get('message', '')}")
        else:
            skipped_ok += 1
            print(f"{step} step: allowed skip {tid} ({why})")
    if not cases:
        sys.exit(f"{step} step: no test ran (none selected): the step exercised nothing")
    if bad or unexpected:
        lines = [f"{step} step: {len(cases)} tests, {len(bad)} failed, {len(unexpected)} skipped unexpectedly"]
        lines += [f"  failed: {t}" for t in bad] + [f"  skipped: {t}" for t in unexpected]
        if unexpected:
            lines.append(f"  a skip that is expected belongs in .ci/{ALLOWLIST.name} with its reason")
        sys.exit("\n".join(lines))
    print(f"{step} step: {ran} tests ran" + (f", {skipped_ok} allowed skips" if skipped_ok else ", none skipped"))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], *sys.argv[2:])
