"""The CLI path for phones: `edgekit devices add NAME --adb-tcp ...` and `edgekit deploy --device NAME`,
with the real adb client and the test adbd (tests/integration/adbd.py)."""

from __future__ import annotations

import json
import sys

import pytest
from adb_fixtures import adb_device, adb_env, needs_adb  # noqa: F401
from adbd import Faults

pytestmark = needs_adb


def _add(cli, name, d, *extra):
    return cli("devices", "add", name, "--target", "pixel-arm64", "--adb-tcp", f"127.0.0.1:{d.port}",
               "--workdir", str(d.root / "data/local/tmp/edgekit"), "--python", sys.executable, *extra)


def test_devices_add_adb_and_list(cli, adb_device):
    r = _add(cli, "phone-a", adb_device, "--json")
    assert r.exit_code == 0, r.stderr
    entry = json.loads(r.stdout)
    assert entry["kind"] == "adb" and entry["adb_tcp"] == f"127.0.0.1:{adb_device.port}"
    listed = json.loads(cli("devices", "list", "--json").stdout)
    assert any(d["name"] == "phone-a" and d["kind"] == "adb" for d in listed)
    # --host and --adb together are refused
    r = cli("devices", "add", "bad", "--target", "pixel-arm64", "--host", "x", "--adb", "SERIAL", "--no-connect")
    assert r.exit_code == 2 and "one of --host" in r.stderr
    cli("devices", "remove", "phone-a")


def test_devices_add_offline_phone_exits_3_saying_offline(cli, adb_env, tmp_path):
    d = adb_env.device(tmp_path / "root", faults=Faults(offline=True))
    try:
        r = _add(cli, "phone-off", d)
        assert r.exit_code == 3
        assert "offline" in r.stderr and "reconnect" in r.stderr
        assert "phone-off" not in cli("devices", "list", "--json").stdout  # nothing registered
    finally:
        adb_env.adb("disconnect", f"127.0.0.1:{d.port}")
        d.stop()


@pytest.mark.slow
def test_deploy_to_an_adb_device_by_name(cli, adb_device, digits, tmp_path):
    assert _add(cli, "phone-b", adb_device).exit_code == 0
    try:
        out = tmp_path / "out"
        r = cli("deploy", digits.pt2, "--target", "pixel-arm64", "--device", "phone-b", "--eval-data", digits.eval,
                "--calib-data", digits.calib, "--runs", "10", "--min-seconds", "0", "--warmup", "1", "--out", out)
        assert r.exit_code in (0, 1), r.stderr  # the gate may fail; the run itself must succeed
        rep = json.loads((out / "report.json").read_text())
        assert rep["device"]["name"] == "phone-b" and rep["device"]["transport"] == "adb"
        assert rep["device"]["android"]["android_version"] == "14"
        assert all(v["accuracy"]["n"] > 0 for v in rep["variants"])
    finally:
        cli("devices", "remove", "phone-b")


@pytest.mark.slow
def test_deploy_dropped_mid_push_exits_3(cli, adb_env, digits, tmp_path):
    d = adb_env.device(tmp_path / "root")
    try:
        assert _add(cli, "phone-drop", d).exit_code == 0
        d.faults.drop_mid_push, d.faults.drop_after_bytes = True, 20_000
        out = tmp_path / "out"
        r = cli("deploy", digits.pt2, "--target", "pixel-arm64", "--device", "phone-drop", "--eval-data",
                digits.eval, "--out", out)
        assert r.exit_code == 3, r.stderr
        assert "pushing" in r.stderr and "check the cable" in r.stderr
        assert not (out / "report.json").exists()
    finally:
        cli("devices", "remove", "phone-drop")
        adb_env.adb("disconnect", f"127.0.0.1:{d.port}")
        d.stop()
