"""The agent end to end (real subprocess, real onnxruntime) with energy sampled in its background
thread. The sensor is a fake (this machine has none): a test thread writes a RAPL counter that
rises at 2 W plus 10 W per busy CPU of the agent process, wrapping at a small range."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.unit.agent_loader import AGENT_PATH, tiny_onnx, tiny_request

IDLE_W, BUSY_W = 2.0, 10.0
RANGE_UJ = 3_000_000  # 3 J: the counter wraps several times during the run


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    import os

    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class FakeRaplSensor(threading.Thread):
    """Writes energy_uj = (2 W x wall + 10 W x agent CPU seconds) mod range, ~every 2 ms."""

    def __init__(self, path: Path):
        super().__init__(daemon=True)
        self.path, self.pid, self.stop = path, None, threading.Event()

    def run(self):
        t0 = time.perf_counter()
        while not self.stop.is_set():
            cpu = 0.0
            if self.pid:
                try:
                    cpu = _cpu_seconds(self.pid)
                except (OSError, IndexError):
                    pass
            uj = int((IDLE_W * (time.perf_counter() - t0) + BUSY_W * cpu) * 1e6) % RANGE_UJ
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(f"{uj}\n")
            tmp.replace(self.path)  # atomic, like a sysfs read never sees half a number
            time.sleep(0.002)


def run_agent(req: dict, tmp_path: Path, sensor: FakeRaplSensor | None = None) -> dict:
    rp = tmp_path / "req.json"
    rp.write_text(json.dumps(req))
    proc = subprocess.Popen([sys.executable, str(AGENT_PATH), str(rp)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if sensor:
        sensor.pid = proc.pid
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out)


# the fake sensor is a thread of this process: beside another worker it writes late, and agent CPU spent
# before the idle window lands in it (CI: baseline 3.9 W for 2.0 +- 1.5)
@pytest.mark.serial
def test_agent_reports_energy_per_inference_from_a_wrapping_rapl_counter(tmp_path):
    base = tmp_path / "sys/class/powercap/intel-rapl:0"
    base.mkdir(parents=True)
    (base / "name").write_text("package-0\n")
    (base / "max_energy_range_uj").write_text(f"{RANGE_UJ}\n")
    (base / "energy_uj").write_text("0\n")
    sensor = FakeRaplSensor(base / "energy_uj")
    sensor.start()
    try:
        req = tiny_request(tiny_onnx(tmp_path / "tiny.onnx"), min_seconds=1.5, max_runs=10_000_000,
                           energy={"sources": ["hwmon", "rapl"], "sysfs_root": str(tmp_path),
                                   "baseline_seconds": 0.5, "sample_hz": 50})
        doc = run_agent(req, tmp_path, sensor)
    finally:
        sensor.stop.set()
        sensor.join()
    e = doc["energy"]
    assert e["source"] == "rapl" and e["checked"][0].startswith("hwmon:")
    assert e["details"]["wraps"] >= 2, e
    assert e["energy_mj_per_inference"] is not None, e
    # the run keeps the agent busy: net power = 10 W x its CPU share, which a shared machine lowers
    net_w = e["net_j"] / e["run_seconds"]
    assert 0 < net_w < 1.3 * BUSY_W + 1.0 and e["significant"], e
    assert e["energy_mj_per_inference"] == pytest.approx(e["net_j"] / doc["latency_ms"]["runs"] * 1000)
    assert e["baseline_w"] == pytest.approx(IDLE_W, abs=1.5)
    assert 5 < e["sample_hz"] <= 60 and e["uncertainty_mj"] >= 0


def test_agent_on_this_machine_reports_null_energy_with_reasons(tmp_path):
    req = tiny_request(tiny_onnx(tmp_path / "tiny.onnx"),
                       energy={"sources": ["rapl", "hwmon", "android_battery", "external_command"],
                               "sysfs_root": str(tmp_path / "empty")})
    doc = run_agent(req, tmp_path)
    e = doc["energy"]
    assert e["energy_mj_per_inference"] is None and e["source"] is None
    for src in ("rapl:", "hwmon:", "android_battery:", "external_command:"):
        assert src in e["reason"]
    mem = doc["memory"]
    assert mem["peak_rss_mb"] >= mem["rss_after_load_mb"] > 0 and mem["load_delta_mb"] > 0
    assert mem["pss_mb"] is not None and 0 < mem["pss_mb"] <= mem["peak_rss_mb"]
    assert mem["arena_mb"] is None and "arena" in mem["arena_reason"]


@pytest.mark.serial  # the meter's clock against the agent's windows, as above
def test_agent_with_an_external_meter_at_constant_power_reports_null_not_noise(tmp_path):
    """A stand-in meter (a fake) whose joules grow at a constant 3 W whatever the device does: the run
    draws no more than the idle baseline, so the agent must say so instead of printing a number."""
    t0 = tmp_path / "t0"
    t0.write_text(repr(time.time()))
    meter = tmp_path / "meter.py"
    meter.write_text("import sys, time\nprint(3.0 * (time.time() - float(open(sys.argv[1]).read())))\n")
    req = tiny_request(tiny_onnx(tmp_path / "tiny.onnx"), min_seconds=0.3, max_runs=10_000_000,
                       energy={"sources": ["rapl", "external_command"], "sysfs_root": str(tmp_path / "none"),
                               "external_command": [sys.executable, str(meter), str(t0)], "baseline_seconds": 0.3})
    e = run_agent(req, tmp_path)["energy"]
    assert e["source"] == "external_command" and e["checked"][0].startswith("rapl:")
    assert e["baseline_w"] == pytest.approx(3.0, rel=0.3) and e["run_w"] == pytest.approx(3.0, rel=0.3)
    if e["energy_mj_per_inference"] is None:
        assert "no more power than idle" in e["reason"]
    else:  # timing jitter can leave a sliver above idle: then it must not claim significance
        assert not e["significant"], e
