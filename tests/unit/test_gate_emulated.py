"""On an emulated device (the arm64 twin) latency budgets are not applicable: the gate says so
instead of failing a release on emulation speed; accuracy is still judged."""

import os
import stat

from report_factory import variant

from edgekit.fsutil import atomic_write_text
from edgekit.inputs.recipe import GateConfig
from edgekit.report.gate import evaluate_gate


def test_latency_budget_skipped_on_emulated_device_but_accuracy_judged():
    vs = [variant("fp32", median=50.0, acc=99.0), variant("int8", median=40.0, acc=95.0, seed=1)]
    cfg = GateConfig(latency_ms_p50=1.0, max_accuracy_drop=1.0)
    real = evaluate_gate(vs, "fp32", cfg)
    emu = evaluate_gate(vs, "fp32", cfg, latency_representative=False)
    lat_real = next(c for c in real.checks if c.name == "latency_p50_budget")
    lat_emu = next(c for c in emu.checks if c.name == "latency_p50_budget")
    assert not lat_real.passed and lat_emu.passed and lat_emu.skipped and "emulated" in lat_emu.message
    acc = next(c for c in emu.checks if c.name == "accuracy_drop")
    assert not acc.passed and not emu.passed  # the 4-point drop still fails the release


def test_atomic_files_get_normal_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        p = atomic_write_text(tmp_path / "report.html", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(p.stat().st_mode) == 0o644
