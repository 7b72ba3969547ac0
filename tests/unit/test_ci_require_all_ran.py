""".ci/require_all_ran.py: a CI step fails on a skip its allowlist does not name, on a failure, and on
selecting nothing; an allowed skip passes, for the steps the allowlist names."""

from __future__ import annotations

import importlib.util
import re
import shutil
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
    assert run("slow", junit(tmp_path, *cases)).returncode != 0


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


TEST_STEPS = {"default", "slow", "litert-torch", "executorch", "llamacpp"}


def test_the_steps_that_judge_skips_are_read_from_the_ci_scripts():
    spec = importlib.util.spec_from_file_location("require_all_ran", SCRIPT)  # .ci/ is no package
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.judged_steps() == TEST_STEPS
    run_steps = set(re.findall(r"^step (\S+)", SCRIPT.with_name("run").read_text(), flags=re.M))
    assert TEST_STEPS <= run_steps  # each is a step of .ci/run, with its own time and budget
    # the allowlist's header names the same steps (it is what a person reads before adding a line)
    header = " ".join(ln for ln in SCRIPT.with_name("allowed_skips.txt").read_text().splitlines() if ln.startswith("#"))
    listed = re.search(r"the test steps \(([^:]+):", header)
    assert listed and {s.strip() for s in listed.group(1).split(",")} == TEST_STEPS


def ci_copy(tmp_path: Path, allowlist: str) -> Path:
    """.ci/'s scripts in a temporary folder, with ``allowlist`` as their allowed_skips.txt."""
    ci = tmp_path / "ci"
    ci.mkdir()
    for f in [SCRIPT, SCRIPT.with_name("run"), *SCRIPT.parent.glob("*.sh")]:
        shutil.copy(f, ci / f.name)
    (ci / "allowed_skips.txt").write_text(allowlist)
    return ci / SCRIPT.name


@pytest.mark.parametrize("steps", ["default, emu", "emu", "slow,nightly"])
def test_an_allowlist_line_naming_a_step_that_does_not_exist_fails_every_step(tmp_path, steps):
    lines = ["# header", "tests.unit.test_a::test_y | * | ok", f"tests.unit.test_a::test_z | {steps} | why"]
    script = ci_copy(tmp_path, "\n".join(lines) + "\n")
    for step in ("default", "slow"):  # whichever step runs, even one the line would allow
        r = subprocess.run([sys.executable, str(script), step, str(junit(tmp_path, ok()))], capture_output=True,
                           text=True)
        assert r.returncode != 0
        bad = next(s.strip() for s in steps.split(",") if s.strip() not in TEST_STEPS)
        assert f"allowed_skips.txt:3: no CI step is named '{bad}'" in r.stderr, r.stderr
        assert "llamacpp" in r.stderr  # the message lists the steps that exist


def test_an_allowlist_line_naming_existing_steps_passes(tmp_path):
    script = ci_copy(tmp_path, "tests.unit.test_a::test_z | slow, llamacpp | why\n")
    skip = skipped("tests.unit.test_a", "test_z")
    for step, rc in (("llamacpp", 0), ("slow", 0), ("default", 1)):  # allowed in the steps it names only
        r = subprocess.run([sys.executable, str(script), step, str(junit(tmp_path, ok(), skip))],
                           capture_output=True, text=True)
        assert r.returncode == rc, (step, r.stdout, r.stderr)
