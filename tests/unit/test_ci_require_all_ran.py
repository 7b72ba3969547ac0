""".ci/require_all_ran.py: a CI step fails on a skip its allowlist does not name, on a failure, and on
selecting nothing; an allowed skip passes, for the steps the allowlist names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "require_all_ran.py"


def junit(tmp_path: Path, *cases: str) -> Path:
    p = tmp_path / "j.xml"
    p.write_text(f'<testsuites><testsuite name="pytest" tests="{len(cases)}">{"".join(cases)}</testsuite></testsuites>')
    return p


def ok(cls="tests.unit.test_a", name="test_x"):
    return f'<testcase classname="{cls}" name="{name}"/>'


def skipped(cls, name, msg="tool missing"):
    return f'<testcase classname="{cls}" name="{name}"><skipped message="{msg}"/></testcase>'


def run(step: str, path: Path):
    return subprocess.run([sys.executable, str(SCRIPT), step, str(path)], capture_output=True, text=True)


def test_all_ran_passes(tmp_path):
    r = run("slow", junit(tmp_path, ok(), ok(name="test_y")))
    assert r.returncode == 0 and "2 tests ran" in r.stdout


def test_an_unlisted_skip_fails_and_names_the_test(tmp_path):
    r = run("slow", junit(tmp_path, ok(), skipped("tests.integration.test_arm64_twin", "test_boot", "qemu missing")))
    assert r.returncode != 0
    assert "tests.integration.test_arm64_twin::test_boot: qemu missing" in r.stderr and "allowed_skips.txt" in r.stderr


def test_an_allowlisted_skip_passes_with_its_reason(tmp_path):
    line = next(ln for ln in SCRIPT.with_name("allowed_skips.txt").read_text().splitlines()
                if ln.strip() and not ln.startswith("#"))
    pattern = line.split("|")[0].strip()
    cls, name = pattern.split("::")
    r = run("default", junit(tmp_path, ok(), skipped(cls, name)))
    assert r.returncode == 0, r.stderr
    assert "allowed skip" in r.stdout


@pytest.mark.parametrize("cases", [(), (f'<testcase classname="a" name="t"><failure message="boom"/></testcase>',)])
def test_nothing_selected_or_a_failure_fails(tmp_path, cases):
    assert run("emu", junit(tmp_path, *cases)).returncode != 0


def test_a_steps_phases_are_judged_together(tmp_path):
    # .ci/pytest_step.sh: a parallel phase, then the `serial` tests alone, each with its own JUnit file
    par, ser = tmp_path / "par", tmp_path / "ser"
    par.mkdir(), ser.mkdir()
    failed = '<testcase classname="tests.integration.test_r" name="test_ab"><failure message="1.1x"/></testcase>'
    r = subprocess.run([sys.executable, str(SCRIPT), "slow", str(junit(par, ok())), str(junit(ser, failed))],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "test_ab" in (r.stdout + r.stderr)  # a failure in the second file fails the step
    r = subprocess.run([sys.executable, str(SCRIPT), "default", str(junit(par, ok())), str(junit(ser))],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "1 tests ran" in r.stdout  # no serial test in this step: fine
