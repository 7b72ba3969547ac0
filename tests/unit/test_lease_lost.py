"""A device-side lease lost while measuring (another host took the device over) is a warning in the
report a user reads, not a silent overlap (edgekit/devices/session.py: ``lease_lost`` -> ``warnings()``).

A real deploy on an inventory device (kind ``local``: the same lease snippet run by a real Python, as
over SSH) with a short lease TTL so the renewing thread checks often. When the first variant is about to
be measured, another holder's record replaces the lease file on the device (what a second host does
when it judges the lease stale, e.g. its clock runs ahead); the session's next renewal is refused, and
the report's warnings, its Markdown view and the deploy's exit must say so."""

from __future__ import annotations

import json
import time

import pytest

from edgekit.report.model import Report

THIEF = {"device": "leased", "host": "other-ci-host", "pid": 424242, "user": "ci", "run_id": "thief0run000",
         "token": "f" * 32, "command": "edgekit deploy"}


@pytest.fixture
def leased_device(tmp_path, monkeypatch):
    from edgekit.devices.inventory import DeviceEntry, add_device

    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("EDGEKIT_DEVICE_LEASE", raising=False)  # leases on (the default)
    monkeypatch.delenv("EDGEKIT_COORDINATOR", raising=False)
    monkeypatch.setenv("EDGEKIT_LEASE_TTL_S", "0.9")  # renewed every 0.3 s
    add_device(DeviceEntry(name="leased", kind="local", target="local", workdir=str(tmp_path / "dev")))
    return tmp_path / "dev"


def _steal_on_first_measure(monkeypatch, seen: dict):
    from edgekit.devices.lease import LEASE_FILE
    from edgekit.devices.session import DeviceSession

    real = DeviceSession.measure

    def measure(self, name, art, settings, *a, **kw):
        if "stolen" not in seen:
            lease = self.lease
            assert lease is not None and lease.lost is None, "the session holds a live lease before the take-over"
            seen["own_token"] = lease.owner["token"]
            path = self.transport.remote_path(LEASE_FILE)
            import fcntl
            import os

            # under the device's guard flock and atomically, as another host's lease snippet writes: without the
            # guard, a renewal that read the old record just before could write it back over the thief's (seen
            # once in CI: no loss noticed in 60 s)
            guard = os.open(path + ".guard", os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(guard, fcntl.LOCK_EX)
                now = time.time()
                with open(path + ".tmp-thief", "w") as f:
                    json.dump({**THIEF, "acquired": now, "renewed": now, "expires": now + 3600}, f)
                os.replace(path + ".tmp-thief", path)
            finally:
                os.close(guard)  # releases the flock
            seen["stolen"] = name
            deadline = time.monotonic() + 60  # a renewal round on a busy host: no timing is asserted
            while lease.lost is None and time.monotonic() < deadline:
                time.sleep(0.05)
            seen["lost"] = lease.lost
            seen["last_error"] = lease.last_error  # why renewals failed, if they did (for a failure's message)
        return real(self, name, art, settings, *a, **kw)

    monkeypatch.setattr(DeviceSession, "measure", measure)


def test_a_lease_taken_over_mid_measurement_is_a_report_warning(cli, digits, leased_device, tmp_path, monkeypatch):
    seen: dict = {}
    _steal_on_first_measure(monkeypatch, seen)
    out = tmp_path / "out"
    r = cli("deploy", digits.pt2, "--target", "local", "--device", "leased", "--eval-data", digits.eval,
            "--calib-data", digits.calib, "--out", out, "--no-search", "--runs", "10", "--min-seconds", "0",
            "--warmup", "1")
    assert seen.get("stolen") and seen.get("lost"), seen  # the take-over happened while measuring
    assert r.exit_code in (0, 1), r.stdout + r.stderr  # measured to the end: the warning does not abort the run
    rep = Report.load(out / "report.json")
    lost = [w for w in rep.warnings if "lease lost while measuring" in w]
    assert len(lost) == 1, rep.warnings
    w = lost[0]
    # which device, who holds it now, and what it means for the figures
    assert w.startswith("device leased: lease lost while measuring: now held by ci@other-ci-host PID 424242"), w
    assert "thief0run000" in w and "may overlap another host's run" in w, w
    assert "lease lost while measuring" in (out / "report.md").read_text()
    # the session released nothing of the new holder's: the thief's lease is still on the device
    rec = json.loads((leased_device / "device.lease").read_text())
    assert rec["token"] == THIEF["token"] and rec["token"] != seen["own_token"]


def test_a_lease_kept_to_the_end_gives_no_such_warning(cli, digits, leased_device, tmp_path):
    """The control: the same deploy with nobody taking the lease over says nothing of a lost lease, and
    releases its lease at the end."""
    out = tmp_path / "out"
    r = cli("deploy", digits.pt2, "--target", "local", "--device", "leased", "--eval-data", digits.eval,
            "--calib-data", digits.calib, "--out", out, "--no-search", "--runs", "10", "--min-seconds", "0",
            "--warmup", "1")
    assert r.exit_code in (0, 1), r.stdout + r.stderr
    rep = Report.load(out / "report.json")
    assert not [w for w in rep.warnings if "lease" in w], rep.warnings
    assert not (leased_device / "device.lease").exists()  # released
