"""AdbTransport against the real adb client (Debian's adb 1.0.41) and the test device daemon.

Everything here goes client -> adb server -> TCP -> tests/integration/adbd.py, the same wire
protocol a phone's adbd speaks (CNXN, OPEN/OKAY/WRTE/CLSE, shell v2, sync).
"""

from __future__ import annotations

import threading
import time

import pytest
from adb_fixtures import adb_device, adb_env, needs_adb  # noqa: F401
from adbd import Faults

from edgekit.errors import TransportError
from edgekit.fsutil import sha256_file
from edgekit.transport.adb import AdbStateError, AdbTransport, parse_devices, parse_facts

pytestmark = needs_adb


def _transport(d, **kw) -> AdbTransport:
    kw.setdefault("workdir", str(d.root / "data/local/tmp/edgekit"))
    return AdbTransport(tcp=f"127.0.0.1:{d.port}", boot_timeout=kw.pop("boot_timeout", 20), **kw)


def test_shell_exit_codes_and_quoting(adb_device):
    with _transport(adb_device) as t:
        assert t.describe().startswith(f"adb:127.0.0.1:{adb_device.port}:")
        r = t.run(["sh", "-c", 'echo out; echo err >&2; exit 7'], timeout=20)
        assert (r.returncode, r.stdout, r.stderr) == (7, "out\n", "err\n")
        # names with spaces, quotes and shell metacharacters arrive as one argument each
        weird = ["a b", "it's", "$HOME", "x;rm -rf /", "`id`", ""]
        r = t.run(["python3", "-c", "import sys, json; print(json.dumps(sys.argv[1:]))", *weird], timeout=20)
        assert r.ok, r.stderr
        import json

        assert json.loads(r.stdout) == weird
        # commands run in the workdir
        assert t.run(["pwd"], timeout=20).stdout.strip() == t.workdir


def test_push_pull_verified_and_atomic(adb_device, tmp_path):
    src = tmp_path / "model.bin"
    src.write_bytes(bytes(range(256)) * 2000)  # 512 KB: several sync DATA chunks
    with _transport(adb_device) as t:
        t.push(src, "files/model.bin")
        on_dev = adb_device.root / "data/local/tmp/edgekit/files/model.bin"
        assert sha256_file(on_dev) == sha256_file(src)
        assert t.bytes_sent == src.stat().st_size
        assert not [p for p in on_dev.parent.iterdir() if "partial" in p.name]
        back = tmp_path / "back.bin"
        t.pull("files/model.bin", back)
        assert back.read_bytes() == src.read_bytes()
        with pytest.raises(TransportError, match="missing|does not exist"):
            t.pull("files/nope.bin", tmp_path / "nope.bin")
        assert not (tmp_path / "nope.bin").exists()


def test_waits_for_boot_completed(adb_device):
    adb_device.set_prop("sys.boot_completed", "")
    threading.Timer(2.0, adb_device.set_prop, ("sys.boot_completed", "1")).start()
    t0 = time.monotonic()
    with _transport(adb_device):
        assert time.monotonic() - t0 >= 2.0  # nothing ran before the device said it had booted


def test_boot_never_completes_is_a_transport_error(adb_device):
    adb_device.set_prop("sys.boot_completed", "0")
    with pytest.raises(TransportError, match="has not finished booting") as ei:
        _transport(adb_device, boot_timeout=2)
    assert ei.value.exit_code == 3


def test_timeout_kills_the_device_command(adb_device):
    with _transport(adb_device) as t:
        marker = adb_device.root / "still-running"
        with pytest.raises(TransportError, match="timed out after 2 s"):
            t.run(["sh", "-c", f"sleep 4; touch {marker}"], timeout=2)
        time.sleep(3)
        assert not marker.exists()  # the stream's CLSE stopped the device process


def test_android_facts_from_getprop(adb_device):
    adb_device.set_prop("ro.product.model", "Pixel 7")
    adb_device.set_prop("ro.board.platform", "gs201")
    with _transport(adb_device, pin_mask="f0") as t:
        facts = t.device_facts()
    assert facts["model"] == "Pixel 7"
    assert facts["soc"] == "gs201"
    assert facts["android_version"] == "14" and facts["android_sdk"] == 34
    assert facts["pinned_cores_mask"] == "f0"
    # this host has no battery: null with the reason, never a made-up figure
    assert facts["battery_temperature_c"] is None
    assert "battery_temperature_c" in facts["unavailable"]


def test_taskset_prefix_only_on_the_agent(adb_device):
    with _transport(adb_device, pin_mask="1", python="python3") as t:
        # on this 2-core host, mask 1 = cpu 0 only: the agent's python sees exactly that affinity
        r = t.run(["python3", "-c", "import os; print(sorted(os.sched_getaffinity(0)))"], timeout=20)
        assert r.stdout.strip() == "[0]"
        r = t.run(["sh", "-c", "echo not pinned"], timeout=20)
        assert r.ok


def test_offline_device_is_reported_as_offline(adb_env, tmp_path):
    d = adb_env.device(tmp_path / "root", faults=Faults(offline=True))
    try:
        with pytest.raises(AdbStateError) as ei:
            _transport(d)
        assert ei.value.state == "offline"
        assert ei.value.exit_code == 3
        assert "offline" in str(ei.value) and "reconnect" in ei.value.hint
    finally:
        adb_env.adb("disconnect", f"127.0.0.1:{d.port}")
        d.stop()


def test_unauthorized_device_says_accept_the_prompt(adb_env, tmp_path):
    d = adb_env.device(tmp_path / "root", faults=Faults(unauthorized=True))
    try:
        with pytest.raises(AdbStateError) as ei:
            _transport(d)
        assert ei.value.state == "unauthorized"
        assert "Allow USB debugging" in ei.value.hint
    finally:
        adb_env.adb("disconnect", f"127.0.0.1:{d.port}")
        d.stop()


def test_connection_dropped_mid_push(adb_env, tmp_path):
    d = adb_env.device(tmp_path / "root", faults=Faults(drop_mid_push=True, drop_after_bytes=200_000))
    src = tmp_path / "big.bin"
    src.write_bytes(b"\x5a" * 1_000_000)
    try:
        t = _transport(d)
        with pytest.raises(TransportError) as ei:
            t.push(src, "files/big.bin")
        assert ei.value.exit_code == 3
        assert "pushing big.bin" in str(ei.value) and "failed" in str(ei.value)
        assert not (d.root / "data/local/tmp/edgekit/files/big.bin").exists()
        t.close()
    finally:
        adb_env.adb("disconnect", f"127.0.0.1:{d.port}")
        d.stop()


def test_selection_errors(adb_env, tmp_path):
    # no device at all
    with pytest.raises(TransportError, match="no adb devices are attached") as ei:
        AdbTransport(workdir="/tmp")
    assert ei.value.exit_code == 3
    a = adb_env.device(tmp_path / "a")
    b = adb_env.device(tmp_path / "b")
    try:
        for d in (a, b):
            assert "connected" in adb_env.adb("connect", f"127.0.0.1:{d.port}").stdout
        with pytest.raises(TransportError, match="more than one adb device") as ei:
            AdbTransport(workdir=str(tmp_path / "a"))
        assert "--adb SERIAL" in ei.value.hint
        with pytest.raises(AdbStateError, match="is not attached"):
            AdbTransport(serial="emulator-5554", workdir="/tmp")
        # with a serial, the right one is used
        with AdbTransport(serial=f"127.0.0.1:{b.port}", workdir=str(tmp_path / "b" / "wd")) as t:
            assert t.run(["true"], timeout=20).ok
        assert (tmp_path / "b" / "wd").is_dir()
    finally:
        for d in (a, b):
            adb_env.adb("disconnect", f"127.0.0.1:{d.port}")
            d.stop()


def test_isolated_server_leaves_the_users_server_alone(adb_env, adb_device):
    # adb_env's server stands for the user's own; it must survive an isolated transport's close
    with _transport(adb_device, isolated_server=True) as t:
        assert t.env["ANDROID_ADB_SERVER_PORT"] != str(adb_env.port)
        assert t.run(["true"], timeout=20).ok
    assert "daemon not running" not in adb_env.adb("devices").stderr
    assert adb_env.adb("devices").returncode == 0


def test_parse_devices_and_facts_units():
    text = ("List of devices attached\n0123456789ABCDEF\tdevice\nemulator-5554\toffline\n"
            "192.168.1.5:5555\tunauthorized\nR58M\tno permissions (user in plugdev group; see "
            "[http://developer.android.com/tools/device.html])\n\n")
    assert parse_devices(text) == {"0123456789ABCDEF": "device", "emulator-5554": "offline",
                                   "192.168.1.5:5555": "unauthorized", "R58M": "no permissions"}
    facts = parse_facts("prop|ro.product.model|Pixel 7\nprop|ro.board.platform|gs201\n"
                        "cpu|cpu0|schedutil|1803000|300000|1803000\ncpu|cpu7|schedutil|2850000|500000|2850000\n"
                        "battery_temp|312\ndumpsys_battery_temp|\ntaskset|/system/bin/taskset\n")
    assert facts["battery_temperature_c"] == 31.2
    assert facts["governors"] == ["schedutil"]
    assert facts["cluster_max_mhz"] == [1803.0, 2850.0]
    assert "unavailable" not in facts
