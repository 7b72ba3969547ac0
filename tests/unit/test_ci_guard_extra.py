""".ci/guard_extra.py: an extra whose install would move a package of the main stack (torch, numpy, ...) is
refused by name before it goes into the venv; OpenVINO's and NCNN's extras leave this stack as it is."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "guard_extra.py"


def _guard():
    spec = importlib.util.spec_from_file_location("guard_extra", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _item(name, version):
    return {"metadata": {"name": name, "version": version}}


def test_a_plan_that_moves_a_guarded_package_is_named():
    guard = _guard()
    numpy, torch = md.version("numpy"), md.version("torch")
    plan = [_item("numpy", "1.26.4" if numpy != "1.26.4" else "2.0.0"), _item("Torch", torch), _item("nncf", "9.9"),
            _item("pydantic_core", "0.1")]
    moved = guard.changes(plan)
    # numpy moves; torch reinstalled at its own version does not; nncf and pydantic-core are not guarded
    assert moved == [f"numpy {numpy} -> {plan[0]['metadata']['version']}"]
    assert guard.changes([_item("onnx", md.version("onnx"))]) == []


def test_openvino_and_ncnn_extras_leave_the_stack_as_it_is():
    run = subprocess.run([sys.executable, str(SCRIPT), "openvino,ncnn"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "leaves torch, onnx" in run.stdout


def test_without_an_extra_it_says_how_to_call_it():
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert run.returncode == 2 and "guard_extra.py EXTRA" in run.stderr
