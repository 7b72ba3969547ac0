"""The per-device lock: exclusive across processes, released when its holder dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from edgekit.devices.lock import DeviceLock, DeviceLockedError
from edgekit.errors import DeviceError


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path / "home"))


HOLDER = textwrap.dedent("""
    import sys, time
    from edgekit.devices.lock import DeviceLock
    DeviceLock(sys.argv[1]).acquire()
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
""")


def hold_in_subprocess(device: str, seconds: float = 60.0) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLDER, device, str(seconds)], stdout=subprocess.PIPE, text=True,
                         env=os.environ.copy())
    assert p.stdout.readline().strip() == "held"
    return p


def test_second_holder_fails_fast_with_no_wait_and_names_the_holder():
    with DeviceLock("pi") as first:
        assert first.held
        with pytest.raises(DeviceLockedError) as e:
            DeviceLock("pi").acquire(wait=False)
        assert isinstance(e.value, DeviceError) and e.value.exit_code == 3
        assert f"PID {os.getpid()}" in e.value.message and "--no-wait" in e.value.hint
    DeviceLock("pi").acquire(wait=False).release()  # free again after release


def test_locks_are_per_device():
    with DeviceLock("pi"):
        DeviceLock("jetson").acquire(wait=False).release()


def test_lock_held_by_another_process_and_released_when_it_is_killed():
    p = hold_in_subprocess("pi")
    try:
        with pytest.raises(DeviceLockedError, match=f"PID {p.pid}"):
            DeviceLock("pi").acquire(wait=False)
        with pytest.raises(DeviceLockedError, match="stayed busy"):
            DeviceLock("pi").acquire(wait=True, timeout=0.3)
        p.send_signal(signal.SIGKILL)  # a crash: no release code runs
        p.wait(timeout=10)
        lock = DeviceLock("pi").acquire(wait=False)
        assert lock.holder()["pid"] == os.getpid()
        lock.release()
    finally:
        if p.poll() is None:
            p.kill()


def test_a_waiting_acquire_gets_the_lock_after_the_holder_ends():
    p = hold_in_subprocess("pi", seconds=0.5)
    try:
        lock = DeviceLock("pi").acquire(wait=True, timeout=60)
        assert p.poll() is not None  # the holder had finished before we got it
        lock.release()
    finally:
        if p.poll() is None:
            p.kill()


def test_expired_lease_is_reported_as_overrunning():
    first = DeviceLock("pi", lease_s=0.0).acquire()
    try:
        time.sleep(0.01)
        with pytest.raises(DeviceLockedError, match="lease expired"):
            DeviceLock("pi").acquire(wait=False)
    finally:
        first.release()
