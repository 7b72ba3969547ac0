"""Energy readers of the device agent against sysfs trees the tests write (this machine has no
sensor): RAPL with wrap-around, hwmon INA3221 / INA219, Android battery in both sign conventions,
and an external meter command (a real subprocess)."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from tests.unit.agent_loader import AGENT_PATH, load_agent

A = load_agent()
MAX_RANGE = 262143328850  # a real package zone's max_energy_range_uj


def write_tree(root: Path, files: dict[str, object]) -> Path:
    for rel, value in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"{value}\n")
    return root


def samples(reader, values_by_time, path=None):
    """Feed the reader's file value by value at synthetic times: [(t, reading, read_seconds)]."""
    out = []
    for t, raw in values_by_time:
        if path is not None:
            Path(path).write_text(f"{raw}\n")
        out.append((t, reader.read(), 0.0))
    return out


# --------------------------------------------------------------------------- RAPL
def rapl_tree(root: Path, pkg_uj=1_000_000, dram_uj=0, psys=False) -> Path:
    files = {
        "sys/class/powercap/intel-rapl/enabled": 1,
        "sys/class/powercap/intel-rapl:0/name": "package-0",
        "sys/class/powercap/intel-rapl:0/energy_uj": pkg_uj,
        "sys/class/powercap/intel-rapl:0/max_energy_range_uj": MAX_RANGE,
        "sys/class/powercap/intel-rapl:0:0/name": "core",
        "sys/class/powercap/intel-rapl:0:0/energy_uj": 777,
        "sys/class/powercap/intel-rapl:0:0/max_energy_range_uj": MAX_RANGE,
        "sys/class/powercap/intel-rapl:0:1/name": "dram",
        "sys/class/powercap/intel-rapl:0:1/energy_uj": dram_uj,
        "sys/class/powercap/intel-rapl:0:1/max_energy_range_uj": MAX_RANGE,
        "sys/class/powercap/intel-rapl-mmio:0/name": "package-0",
        "sys/class/powercap/intel-rapl-mmio:0/energy_uj": 999999999,
    }
    if psys:
        files.update({"sys/class/powercap/intel-rapl:1/name": "psys",
                      "sys/class/powercap/intel-rapl:1/energy_uj": 5_000_000,
                      "sys/class/powercap/intel-rapl:1/max_energy_range_uj": MAX_RANGE})
    return write_tree(root, files)


def test_rapl_reads_package_and_dram_not_core_or_mmio(tmp_path):
    r = A.energy.RaplReader(str(rapl_tree(tmp_path, pkg_uj=2_000_000, dram_uj=500_000)))
    assert r.read() == pytest.approx(2.5)  # joules: core is inside the package, mmio duplicates it
    assert r.domains == ["intel-rapl:0 (package-0)", "intel-rapl:0:1 (dram)"]


def test_rapl_prefers_psys_which_already_includes_the_packages(tmp_path):
    r = A.energy.RaplReader(str(rapl_tree(tmp_path, psys=True)))
    assert r.domains == ["intel-rapl:1 (psys)"] and r.read() == pytest.approx(5.0)


def test_rapl_unwraps_at_max_energy_range(tmp_path):
    root = rapl_tree(tmp_path, pkg_uj=MAX_RANGE - 1000)
    pkg = tmp_path / "sys/class/powercap/intel-rapl:0/energy_uj"
    r = A.energy.RaplReader(str(root))
    first = r.read()
    pkg.write_text("500\n")  # wrapped: 1000 µJ to the top, then 500 more
    second = r.read()
    pkg.write_text("2500\n")
    third = r.read()
    assert second - first == pytest.approx(1500e-6) and third - second == pytest.approx(2000e-6)
    assert r.details()["wraps"] == 1


def test_rapl_energy_per_inference_across_a_wrap(tmp_path):
    """Baseline 2 W for 1 s, run 7 W for 2 s with the counter wrapping mid-run, 100 inferences:
    net (7 - 2) W x 2 s = 10 J -> 100 mJ per inference."""
    start = MAX_RANGE - 6_000_000  # wraps 6 J after the baseline start
    root = rapl_tree(tmp_path, pkg_uj=start)
    pkg = tmp_path / "sys/class/powercap/intel-rapl:0/energy_uj"
    r = A.energy.RaplReader(str(root))
    base_vals = [(0.1 * k, int(start + 2e6 * 0.1 * k)) for k in range(11)]
    run_vals = [(1.0 + 0.1 * k, int((start + 2e6 + 7e6 * 0.1 * k) % MAX_RANGE)) for k in range(21)]
    base = samples(r, base_vals, pkg)
    run = samples(r, run_vals, pkg)
    mj, info = A.energy.energy_result("energy", base, run, 100)
    assert r.details()["wraps"] == 1
    assert info["baseline_w"] == pytest.approx(2.0) and info["run_w"] == pytest.approx(7.0)
    assert mj == pytest.approx(100.0, rel=1e-6) and info["significant"]


def test_rapl_absent_gives_the_reason(tmp_path):
    with pytest.raises(A.energy.EnergyUnavailable, match="powercap"):
        A.energy.RaplReader(str(tmp_path))


def test_rapl_root_only_counter_says_so(tmp_path):
    """Kernels since 5.10 make energy_uj root-only. Checked as an unprivileged user: directly when
    the tests run as one, else through `runuser -u nobody` with the system python (stdlib only,
    like a device)."""
    import shutil
    import subprocess
    import tempfile

    if os.geteuid() != 0:
        rapl_tree(tmp_path)
        os.chmod(tmp_path / "sys/class/powercap/intel-rapl:0/energy_uj", 0)
        with pytest.raises(A.energy.EnergyUnavailable, match="root"):
            A.energy.RaplReader(str(tmp_path))
        return
    if not shutil.which("runuser") or not os.path.exists("/usr/bin/python3"):
        pytest.skip("needs runuser and /usr/bin/python3 to read as an unprivileged user")
    root = Path(tempfile.mkdtemp(prefix="edgekit-rapl-"))
    try:
        rapl_tree(root)
        for p in [root, *root.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        (root / "sys/class/powercap/intel-rapl:0/energy_uj").chmod(0o400)
        pyz = root / "agent.pyz"  # the built agent, where the unprivileged user can read it
        shutil.copy(AGENT_PATH, pyz)
        pyz.chmod(0o644)
        code = ("import sys\nsys.path.insert(0, sys.argv[1])\nfrom edgekit_agent import energy as m\n"
                "try:\n m.RaplReader(sys.argv[2]); print('READ')\n"
                "except m.EnergyUnavailable as e: print(e)\n")
        out = subprocess.run(["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c", code, str(pyz),
                              str(root)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "readable only by root" in out.stdout and "chmod o+r" in out.stdout, out.stdout
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------- hwmon
def ina3221_tree(root: Path, with_vdd_in=True) -> Path:
    h = "sys/class/hwmon/hwmon2/"
    files = {
        "sys/class/hwmon/hwmon0/name": "coretemp",
        "sys/class/hwmon/hwmon0/temp1_input": 45000,
        h + "name": "ina3221",
        h + "in1_input": 5000, h + "curr1_input": 1200,  # mV, mA -> 6.0 W
        h + "in2_label": "VDD_CPU_GPU_CV", h + "in2_input": 5000, h + "curr2_input": 400,  # 2.0 W
        h + "in3_label": "VDD_SOC", h + "in3_input": 5000, h + "curr3_input": 300,  # 1.5 W
        h + "in4_input": 12, h + "in5_input": 4, h + "in6_input": 3,  # shunt voltages (mV)
        h + "in7_input": 19, h + "curr4_input": 1900,  # summed shunt channel: must not pair
    }
    if with_vdd_in:
        files[h + "in1_label"] = "VDD_IN"
    return write_tree(root, files)


def test_hwmon_ina3221_uses_the_board_input_channel(tmp_path):
    r = A.energy.HwmonReader(str(ina3221_tree(tmp_path)))
    assert r.read() == pytest.approx(6.0)
    assert r.details() == {"channels": ["ina3221:VDD_IN"], "rule": "board input channel"}


def test_hwmon_ina3221_sums_rails_without_an_input_channel_and_skips_shunt_channels(tmp_path):
    r = A.energy.HwmonReader(str(ina3221_tree(tmp_path, with_vdd_in=False)))
    assert r.read() == pytest.approx(9.5)  # 6 + 2 + 1.5; in4/curr4 (shunt mV x summed mA) excluded
    assert r.details()["rule"] == "sum of all channels" and len(r.details()["channels"]) == 3


def test_hwmon_channels_named_in_the_request(tmp_path):
    r = A.energy.HwmonReader(str(ina3221_tree(tmp_path)), channels=["VDD_CPU_GPU_CV", "VDD_SOC"])
    assert r.read() == pytest.approx(3.5)
    with pytest.raises(A.energy.EnergyUnavailable, match="VDD_GPU.*available"):
        A.energy.HwmonReader(str(tmp_path), channels=["VDD_GPU"])


def test_hwmon_ina219_prefers_its_power_register(tmp_path):
    h = "sys/class/hwmon/hwmon1/"
    write_tree(tmp_path, {h + "name": "ina219", h + "in0_input": 10, h + "in1_input": 5100,
                          h + "curr1_input": 800, h + "power1_input": 4080000})
    r = A.energy.HwmonReader(str(tmp_path))
    assert r.read() == pytest.approx(4.08)


def test_hwmon_power_samples_integrate_to_energy(tmp_path):
    root = ina3221_tree(tmp_path)
    curr = tmp_path / "sys/class/hwmon/hwmon2/curr1_input"
    r = A.energy.HwmonReader(str(root))
    base = samples(r, [(0.02 * k, 1000) for k in range(51)], curr)  # 5 W idle for 1 s
    run = samples(r, [(1.0 + 0.02 * k, 1400) for k in range(101)], curr)  # 7 W for 2 s
    mj, info = A.energy.energy_result("power", base, run, 200)
    assert mj == pytest.approx(2.0 * 2.0 / 200 * 1000)  # 2 W above idle x 2 s / 200 runs = 20 mJ
    assert info["uncertainty_mj"] == pytest.approx(0.0)  # constant readings: no spread


def test_hwmon_with_only_temperature_sensors_names_them(tmp_path):
    write_tree(tmp_path, {"sys/class/hwmon/hwmon0/name": "coretemp", "sys/class/hwmon/hwmon0/temp1_input": 1})
    with pytest.raises(A.energy.EnergyUnavailable, match="sensors: coretemp"):
        A.energy.HwmonReader(str(tmp_path))


# --------------------------------------------------------------------------- Android battery
def battery_tree(root: Path, current, status="Discharging", voltage=3_850_000) -> Path:
    b = "sys/class/power_supply/battery/"
    return write_tree(root, {b + "type": "Battery", b + "status": status, b + "current_now": current,
                             b + "voltage_now": voltage, "sys/class/power_supply/usb/type": "USB"})


@pytest.mark.parametrize("discharge_sign", [1, -1], ids=["discharge_positive", "discharge_negative"])
def test_android_battery_sign_is_calibrated_from_the_idle_baseline(tmp_path, discharge_sign):
    root = battery_tree(tmp_path, discharge_sign * 400_000)
    cur = tmp_path / "sys/class/power_supply/battery/current_now"
    r = A.energy.AndroidBatteryReader(str(root))
    base = samples(r, [(0.05 * k, discharge_sign * 400_000) for k in range(21)], cur)  # 400 mA idle
    sign = r.calibrate([v for _, v, _ in base])
    run = samples(r, [(1.0 + 0.05 * k, discharge_sign * 900_000) for k in range(41)], cur)  # 900 mA
    mj, info = A.energy.energy_result("power", base, run, 100, sign)
    # 0.5 A above idle x 3.85 V x 2 s = 3.85 J over 100 runs
    assert mj == pytest.approx(38.5) and info["baseline_w"] == pytest.approx(0.4 * 3.85)
    assert r.details()["sign"] == ("discharge_positive" if discharge_sign == 1 else "discharge_negative")
    assert r.details()["sign_source"] == "calibrated while Discharging"


def test_android_battery_charging_is_not_consumption(tmp_path):
    battery_tree(tmp_path, -800_000, status="Charging")
    with pytest.raises(A.energy.EnergyUnavailable, match="external power.*unplug"):
        A.energy.AndroidBatteryReader(str(tmp_path))


def test_android_battery_without_discharging_status_needs_an_explicit_sign(tmp_path):
    battery_tree(tmp_path, 400_000, status="Not charging")
    with pytest.raises(A.energy.EnergyUnavailable, match="energy.android.sign"):
        A.energy.AndroidBatteryReader(str(tmp_path))
    r = A.energy.AndroidBatteryReader(str(tmp_path), sign="discharge_positive")
    assert r.calibrate([1.0]) == 1 and r.details()["sign_source"] == "request"


def test_android_battery_current_flipping_mid_run_gives_no_figure(tmp_path):
    root = battery_tree(tmp_path, 400_000)
    cur = tmp_path / "sys/class/power_supply/battery/current_now"
    r = A.energy.AndroidBatteryReader(str(root))
    base = samples(r, [(0.1 * k, 400_000) for k in range(11)], cur)
    sign = r.calibrate([v for _, v, _ in base])
    run = samples(r, [(1.0 + 0.1 * k, 500_000 if k < 5 else -300_000) for k in range(11)], cur)
    mj, info = A.energy.energy_result("power", base, run, 10, sign)
    assert mj is None and "charging" in info["reason"]


def test_android_battery_current_in_milliamps_is_recognised(tmp_path):
    battery_tree(tmp_path, 450)  # an older kernel reporting mA
    r = A.energy.AndroidBatteryReader(str(tmp_path))
    assert r.details()["current_unit"] == "mA" and r.read() == pytest.approx(0.45 * 3.85)


# --------------------------------------------------------------------------- external meter command
@pytest.fixture
def meter(tmp_path):
    """A stand-in USB meter CLI (a fake: no meter here) that prints the joules in a state file."""
    state = tmp_path / "joules.txt"
    state.write_text("12.5")
    script = tmp_path / "meter.py"
    script.write_text(textwrap.dedent("""
        import sys
        text = open(sys.argv[1]).read().strip()
        if text == "fail":
            print("meter not connected", file=sys.stderr); sys.exit(3)
        print("Joulescope v1 ready")
        print(text + " J")
    """))
    return [sys.executable, str(script), str(state)], state


def test_external_command_reads_cumulative_joules(meter):
    argv, state = meter
    r = A.energy.ExternalCommandReader(argv)
    assert r.read() == pytest.approx(12.5)
    state.write_text("20.0")
    assert r.read() == pytest.approx(20.0)
    # a single string is split like a shell would, but runs without one
    assert A.energy.ExternalCommandReader(" ".join(argv)).read() == pytest.approx(20.0)


def test_external_command_failures_say_why(meter):
    argv, state = meter
    state.write_text("fail")
    with pytest.raises(A.energy.EnergyUnavailable, match="exited 3.*meter not connected"):
        A.energy.ExternalCommandReader(argv)
    state.write_text("about twelve")
    with pytest.raises(A.energy.EnergyUnavailable, match="expected cumulative joules"):
        A.energy.ExternalCommandReader(argv)
    with pytest.raises(A.energy.EnergyUnavailable, match="failed to run"):
        A.energy.ExternalCommandReader(["/nonexistent/meter-cli"])
    with pytest.raises(A.energy.EnergyUnavailable, match="no external meter command"):
        A.energy.ExternalCommandReader(None)


# --------------------------------------------------------------------------- priority and reasons
def test_sources_are_tried_in_the_targets_order(tmp_path, meter):
    ina3221_tree(tmp_path)
    rapl_tree(tmp_path)
    r, reasons = A.energy.open_energy_reader({"sources": ["hwmon", "rapl"]}, str(tmp_path))
    assert r.name == "hwmon" and reasons == []
    r, reasons = A.energy.open_energy_reader({"sources": ["android_battery", "external_command", "rapl"],
                                       "external_command": meter[0]}, str(tmp_path))
    assert r.name == "external_command" and reasons[0].startswith("android_battery: ") and "power_supply" in reasons[0]


def test_no_source_is_null_with_every_reason(tmp_path):
    r, reasons = A.energy.open_energy_reader({"sources": ["rapl", "hwmon", "made_up"]}, str(tmp_path))
    assert r is None
    out = A.energy.no_energy(reasons, ["rapl", "hwmon", "made_up"])
    assert out["energy_mj_per_inference"] is None and out["source"] is None
    assert "rapl:" in out["reason"] and "hwmon:" in out["reason"] and "unknown source" in out["reason"]
    assert A.energy.no_energy([], [])["reason"] == "the target lists no energy source"


def test_no_more_power_than_idle_is_null_not_a_made_up_number():
    base = [(0.1 * k, 3.0, 0.0) for k in range(11)]
    run = [(1.0 + 0.1 * k, 3.0, 0.0) for k in range(11)]
    mj, info = A.energy.energy_result("power", base, run, 50)
    assert mj is None and "no more power than idle" in info["reason"]
    mj, info = A.energy.energy_result("power", base, run[:1], 50)
    assert mj is None and "raise min_seconds" in info["reason"]


def test_a_sensor_that_vanishes_mid_run_costs_the_figure_not_the_run(tmp_path):
    rapl_tree(tmp_path)
    r = A.energy.RaplReader(str(tmp_path))
    s = A.energy.EnergySampler(r, hz=0.1)  # marks only: the thread stays asleep
    s.mark()
    (tmp_path / "sys/class/powercap/intel-rapl:0/energy_uj").write_text("garbage\n")
    with pytest.raises(A.energy.EnergyUnavailable, match="reading rapl failed"):
        s.mark()


def test_measure_with_energy_survives_a_sensor_failing_during_the_run(tmp_path):
    rapl_tree(tmp_path)
    counter = tmp_path / "sys/class/powercap/intel-rapl:0/energy_uj"
    calls = {"n": 0}

    def run_once():
        calls["n"] += 1
        if calls["n"] == 5:
            counter.write_text("garbage\n")

    req = {"runs": 10, "min_seconds": 0.0, "energy": {"sources": ["rapl"], "baseline_seconds": 0.01, "sample_hz": 0.1}}
    raw, sus, energy = A.timing.measure_with_energy(run_once, req, str(tmp_path))
    assert len(raw) == 10 and sus is None
    assert energy["energy_mj_per_inference"] is None and energy["source"] == "rapl"
    assert "reading rapl failed" in energy["reason"]
