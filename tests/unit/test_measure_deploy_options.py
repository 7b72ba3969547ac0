"""`edgekit deploy` with the measurement options, end to end on the local device (real agent
subprocess, real onnxruntime): --warmup-mode auto, --sustained and --energy-command (a stand-in
meter, a fake since this machine has none, whose joules follow the agent's CPU time)."""

from __future__ import annotations

import sys

import numpy as np

from edgekit.report.model import Report
from tests.unit.agent_loader import tiny_onnx

METER = """\
import os, sys, time
# The meter's parent is the agent: 2 W idle + 50 W per busy CPU second of the agent.
fields = open(f"/proc/{os.getppid()}/stat").read().rsplit(")", 1)[1].split()
cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
print(2.0 * time.time() + 50.0 * cpu)
"""


def test_deploy_with_auto_warmup_sustained_run_and_an_energy_command(cli, tmp_path):
    model = tiny_onnx(tmp_path / "tiny.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "eval.npz", x=rng.standard_normal((32, 64)).astype(np.float32),
             y=rng.integers(0, 64, 32))
    (tmp_path / "recipe.yaml").write_text("variants: []\n")
    (tmp_path / "meter.py").write_text(METER)
    out = tmp_path / "out"
    r = cli("deploy", model, "--target", "local", "--eval-data", tmp_path / "eval.npz", "--recipe",
            tmp_path / "recipe.yaml", "--out", out, "--warmup", "10", "--warmup-mode", "auto",
            "--sustained", "2", "--energy-command", f"{sys.executable} {tmp_path / 'meter.py'}")
    assert r.exit_code == 0, r.stderr
    v = Report.load(out / "report.json").variants[0]
    assert v.latency_ms.warmup_mode == "auto" and v.latency_ms.warmup >= 10
    s = v.sustained
    assert s["seconds"] >= 2.0 and s["segment_s"] == 0.5 and len(s["bins"]) >= 2
    assert s["slowdown"] > 0 and isinstance(s["warnings"], list)
    # local.yaml lists rapl and hwmon (absent here); the command comes after them
    assert v.energy_source == "external_command", v.energy
    assert v.energy["checked"][0].startswith("rapl:") and v.energy["checked"][1].startswith("hwmon:")
    assert v.energy_mj_per_inference is not None and v.energy_mj_per_inference > 0, v.energy
    assert v.energy["uncertainty_mj"] >= 0 and v.energy["sample_hz"] > 0


def test_bad_measurement_options_are_usage_errors(cli, tmp_path):
    model = tiny_onnx(tmp_path / "tiny.onnx")
    np.savez(tmp_path / "eval.npz", x=np.zeros((4, 64), np.float32), y=np.zeros(4, np.int64))
    (tmp_path / "recipe.yaml").write_text("variants: []\n")
    base = ["deploy", model, "--target", "local", "--eval-data", tmp_path / "eval.npz", "--recipe",
            tmp_path / "recipe.yaml", "--out", tmp_path / "out"]
    r = cli(*base, "--warmup-mode", "sometimes")
    assert r.exit_code == 2 and "warmup mode 'sometimes'" in (r.stderr + r.stdout)
    r = cli(*base, "--sustained", "0")
    assert r.exit_code == 2 and "must be > 0" in (r.stderr + r.stdout)
    assert not (tmp_path / "out" / "report.json").exists()
