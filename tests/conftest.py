"""Shared fixtures: a trained digits model (real training, a few seconds), an isolated local
'device' folder, and a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def _isolated_local_device(tmp_path_factory):
    """Keep the local transport's device folder and caches out of the user's home."""
    d = tmp_path_factory.mktemp("local-device")
    old = {k: os.environ.get(k) for k in ("EDGEKIT_LOCAL_DEVICE_DIR", "EDGEKIT_HOME", "EDGEKIT_NO_MEASURE_CACHE")}
    os.environ["EDGEKIT_LOCAL_DEVICE_DIR"] = str(d)
    os.environ["EDGEKIT_HOME"] = str(tmp_path_factory.mktemp("edgekit-home"))
    # Every test measures for real (a reused measurement would hide a device fault a test injects);
    # tests of the measurement cache turn it back on with monkeypatch.delenv.
    os.environ["EDGEKIT_NO_MEASURE_CACHE"] = "1"
    yield d
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(autouse=True)
def _fresh_onnx2tf_runs():
    """Each test converts for itself: onnx2tf runs kept by an earlier test (edgekit/convert/onnx2tf_runs.py)
    are dropped, so a test of onnx2tf's behaviour never passes on another test's run."""
    import sys

    runs = sys.modules.get("edgekit.convert.onnx2tf_runs")
    if runs is not None:
        runs.forget()
    yield


@dataclass(frozen=True)
class DigitsArtifacts:
    dir: Path
    pt2: Path
    pth: Path
    eval: Path
    calib: Path
    train: Path


@pytest.fixture(scope="session")
def digits(tmp_path_factory) -> DigitsArtifacts:
    """DigitsCNN trained for real on scikit-learn's digits (12 epochs, ~3 s on 2 cores)."""
    import train as digits_train  # examples/digits/train.py (pyproject.toml: pytest's pythonpath)

    out = tmp_path_factory.mktemp("digits")
    digits_train.main(["--out", str(out), "--epochs", "12"])
    return DigitsArtifacts(out, out / "model.pt2", out / "model.pth", out / "eval.npz", out / "calib.npz",
                           out / "train.npz")


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(capsys):
    """Run `edgekit ...` in-process (fast) and return its exit code and output."""
    from edgekit.cli.main import main

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return run


def run_edgekit_subprocess(*args: str, timeout: float = 600, env=None) -> CliResult:
    """Run the installed `edgekit` console script as a user would."""
    exe = Path(sys.executable).with_name("edgekit")
    proc = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    return CliResult(proc.returncode, proc.stdout, proc.stderr)
