"""Device state, warmup and sustained mode of the agent: thermal zones, per-CPU clocks and throttle
counters from a written sysfs tree, `vcgencmd get_throttled` from a stand-in vcgencmd (a fake: no
Pi here), the throttled/busy warnings, auto warmup, and a short sustained run on real onnxruntime."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.unit.agent_loader import AGENT_PATH, load_agent, tiny_onnx, tiny_request

A = load_agent()


def state_tree(root: Path, temp_mc=48500, freq_khz=1500000, throttles=0) -> Path:
    files = {
        "sys/class/thermal/thermal_zone0/type": "cpu-thermal", "sys/class/thermal/thermal_zone0/temp": temp_mc,
        "sys/class/thermal/thermal_zone1/type": "gpu-thermal", "sys/class/thermal/thermal_zone1/temp": 41000,
        "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor": "ondemand",
        "sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq": freq_khz,
        "sys/devices/system/cpu/cpu1/cpufreq/scaling_cur_freq": 600000,
        "sys/devices/system/cpu/cpu0/thermal_throttle/core_throttle_count": throttles,
        "sys/devices/system/cpu/cpu1/thermal_throttle/core_throttle_count": 0,
    }
    for rel, v in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"{v}\n")
    return root


@pytest.fixture
def fake_vcgencmd(tmp_path, monkeypatch):
    """A stand-in for the Pi firmware tool on PATH; the test sets what get_throttled answers."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    answer = tmp_path / "throttled.txt"
    answer.write_text("0x0")
    exe = bindir / "vcgencmd"
    exe.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import sys
        cmd = sys.argv[1:]
        if cmd == ["get_throttled"]:
            print("throttled=" + open({str(answer)!r}).read().strip())
        elif cmd == ["measure_temp"]:
            print("temp=61.3'C")
        elif cmd == ["measure_clock", "arm"]:
            print("frequency(48)=1500345728")
        else:
            sys.exit(2)
    """))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return answer


def test_device_state_reads_governor_clocks_temperatures_and_throttle_counters(tmp_path):
    s = A.device.device_state(str(state_tree(tmp_path, throttles=3)))
    assert s["governor"] == "ondemand" and s["frequency_mhz"] == 1500.0
    assert s["frequencies_mhz"] == {"cpu0": 1500.0, "cpu1": 600.0}
    assert s["temperatures_c"] == {"cpu-thermal": 48.5, "gpu-thermal": 41.0} and s["temperature_c"] == 48.5
    assert s["throttle_events"] == 3 and s["loadavg"] is not None


def test_device_state_on_a_bare_tree_is_null_not_invented(tmp_path):
    s = A.device.device_state(str(tmp_path))
    assert s["governor"] is None and s["frequency_mhz"] is None and s["temperature_c"] is None
    assert s["throttle_events"] is None and s["frequencies_mhz"] == {}


def test_vcgencmd_throttled_flags_are_decoded_and_warned(tmp_path, fake_vcgencmd):
    before = A.device.device_state(str(tmp_path))
    assert before["vcgencmd"]["throttled"] == "0x0" and before["vcgencmd"]["arm_mhz"] == pytest.approx(1500.345728)
    assert before["temperatures_c"]["vcgencmd"] == 61.3
    fake_vcgencmd.write_text("0x50005")  # under-voltage + throttled now, and both since boot
    after = A.device.device_state(str(tmp_path))
    assert after["vcgencmd"]["throttled_flags"] == {"now": ["under-voltage", "throttled"],
                                                    "since_boot": ["under-voltage", "throttled"]}
    w = A.device.state_warnings(before, after, None)
    assert len(w) == 1 and "throttled during the run" in w[0] and "0x50005" in w[0]
    assert A.device.state_warnings(after, after, None)  # still throttled now: still a warning


def test_sticky_throttle_bits_from_before_the_run_are_not_blamed_on_it(tmp_path, fake_vcgencmd):
    fake_vcgencmd.write_text("0x50000")  # happened since boot, not now
    s = A.device.device_state(str(tmp_path))
    assert A.device.state_warnings(s, s, None) == []


def test_throttle_counter_increase_and_busy_device_warn(tmp_path):
    b = A.device.device_state(str(state_tree(tmp_path / "b", throttles=3)))
    a = A.device.device_state(str(state_tree(tmp_path / "a", throttles=7)))
    w = A.device.state_warnings(b, a, 0.40)
    assert any("4 thermal throttle event" in x for x in w) and any("busy" in x and "40%" in x for x in w)
    assert A.device.state_warnings(b, b, 0.05) == []


def test_auto_warmup_stops_once_latency_settles():
    # a stand-in workload that starts 20x slow and settles geometrically (cold caches, clocks ramping)
    calls = {"n": 0}

    def run_once():
        calls["n"] += 1
        x = 0
        for _ in range(int(20000 * (1 + 20 * 0.85 ** calls["n"]))):
            x += 1

    out = A.timing.warmup_runs(run_once, {"warmup_mode": "auto", "warmup": 10, "warmup_window": 10,
                                   "warmup_tolerance": 0.2, "max_warmup": 500})
    assert out["warmup_mode"] == "auto" and out["warmup_stable"] is True
    assert 30 <= out["warmup"] < 500 and out["warmup"] == calls["n"]
    fixed = A.timing.warmup_runs(run_once, {"warmup": 7})
    assert fixed == {"warmup": 7, "warmup_mode": "fixed"}
    with pytest.raises(A.AgentFailure, match="warmup_mode"):
        A.timing.warmup_runs(run_once, {"warmup_mode": "sometimes"})


def test_auto_warmup_that_never_settles_says_so():
    import itertools

    counter = itertools.count()

    def run_once():  # every window twice as slow as the last: never stable
        n = next(counter)
        x = 0
        for _ in range(200 * 2 ** (n // 5)):
            x += 1

    out = A.timing.warmup_runs(run_once, {"warmup_mode": "auto", "warmup": 0, "warmup_window": 5,
                                   "warmup_tolerance": 0.05, "max_warmup": 40})
    assert out["warmup_stable"] is False and out["warmup"] == 40


def test_sustained_run_bins_latency_over_time_on_real_onnxruntime(tmp_path):
    root = state_tree(tmp_path / "sysfs")
    req = tiny_request(tiny_onnx(tmp_path / "tiny.onnx"), sysfs_root=str(root), max_raw=2000,
                       sustained={"seconds": 1.2, "bin_s": 0.3, "segment_s": 0.3})
    rp = tmp_path / "req.json"
    rp.write_text(json.dumps(req))
    proc = subprocess.run([sys.executable, str(AGENT_PATH), str(rp)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    s = doc["sustained"]
    assert s["seconds"] >= 1.2 and 4 <= len(s["bins"]) <= 5
    assert all(b["temperature_c"] == 48.5 and b["frequency_mhz"] == 1500.0 for b in s["bins"])
    assert sum(b["runs"] for b in s["bins"]) == doc["latency_ms"]["runs"]
    assert s["first"]["runs"] > 0 and s["last"]["runs"] > 0 and s["p50_ratio_last_first"] > 0
    lat = doc["latency_ms"]
    if lat["runs"] > 2000:  # long runs come back as every k-th timing, said so
        assert lat["raw_decimation"] > 1 and len(lat["raw"]) <= 2000
    assert doc["device_state"]["before"]["governor"] == "ondemand"


def test_sustained_analysis_warns_on_a_slowdown_with_rising_temperature():
    from edgekit.agent.protocol import SustainedRequest
    from edgekit.measure.sustained import analyze

    assert SustainedRequest.for_seconds(600).model_dump() == {"seconds": 600.0, "bin_s": 20.0, "segment_s": 60.0}
    assert SustainedRequest.for_seconds(20).segment_s == 5.0 and SustainedRequest.for_seconds(20).bin_s == 1.0
    summary = {"seconds": 300, "segment_s": 60, "first": {"p50": 10.0}, "last": {"p50": 13.0},
               "bins": [{"temperature_c": 55.0, "frequency_mhz": 1800.0}, {"temperature_c": 82.0, "frequency_mhz": 1200.0}]}
    out = analyze(summary)
    assert out["slowdown"] == pytest.approx(1.3) and out["temperature_rise_c"] == pytest.approx(27.0)
    assert out["frequency_change_pct"] == pytest.approx(-100 / 3)
    assert len(out["warnings"]) == 1 and "rose 30%" in out["warnings"][0] and "thermal throttling likely" in out["warnings"][0]
    steady = analyze({**summary, "last": {"p50": 10.2}})
    assert steady["warnings"] == [] and analyze(None) is None
