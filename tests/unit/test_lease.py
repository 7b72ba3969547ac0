"""The device-side lease (edgekit/devices/lease.py) through a real transport (the local one: the same snippet,
run by a real Python, as over SSH): exclusion, refusal naming the holder, waiting, renewal, stale
take-over, release, and many processes racing for one lease."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgekit.devices.lease import DeviceLease, DeviceLeaseHeld, describe_holder, read_holder
from edgekit.transport.local import LocalTransport


@pytest.fixture
def dev(tmp_path):
    return LocalTransport(tmp_path / "device")


def test_acquire_refuse_names_holder_then_release(dev):
    a = DeviceLease(dev, "pi-1", ttl_s=30).acquire(wait=False)
    holder, _ = read_holder(dev)
    assert holder["token"] == a.owner["token"] and holder["pid"] and holder["host"] and holder["run_id"]
    with pytest.raises(DeviceLeaseHeld) as ei:
        DeviceLease(dev, "pi-1", ttl_s=30).acquire(wait=False)
    msg = ei.value.message
    assert f"PID {a.owner['pid']}" in msg and a.owner["host"] in msg and "expires in" in msg, msg
    assert ei.value.exit_code == 3
    t0 = time.monotonic()
    with pytest.raises(DeviceLeaseHeld, match="stayed leased for 1 s"):
        DeviceLease(dev, "pi-1", ttl_s=30).acquire(wait=True, timeout=1.0)
    assert time.monotonic() - t0 >= 1.0
    a.release()
    assert read_holder(dev)[0] is None
    b = DeviceLease(dev, "pi-1", ttl_s=30).acquire(wait=False)
    assert b.took_over is None
    b.release()


def test_renewal_keeps_the_lease_past_its_ttl_and_a_stale_one_is_taken_over(dev):
    a = DeviceLease(dev, "pi-1", ttl_s=1.5).acquire()
    time.sleep(2.5)  # longer than the ttl: only the renewing thread keeps it
    with pytest.raises(DeviceLeaseHeld):
        DeviceLease(dev, "pi-1", ttl_s=1.5).acquire(wait=False)
    # a holder that stops renewing (crashed): its lease goes stale and the next one takes over
    a._stop.set()
    a._thread.join()
    time.sleep(1.7)
    holder, now = read_holder(dev)
    assert "EXPIRED" in describe_holder(holder, now)
    b = DeviceLease(dev, "pi-1", ttl_s=30).acquire(wait=False)
    assert b.took_over["pid"] == a.owner["pid"], b.took_over
    # the old holder's renewal and release must not touch the new lease
    assert read_holder(dev)[0]["token"] == b.owner["token"]
    a.release()
    assert read_holder(dev)[0]["token"] == b.owner["token"]
    b.release()


def test_a_taken_over_lease_is_reported_lost(dev):
    a = DeviceLease(dev, "pi-1", ttl_s=0.6).acquire()
    a._stop.set()
    a._thread.join()
    time.sleep(0.8)
    b = DeviceLease(dev, "pi-1", ttl_s=30).acquire()
    a._stop.clear()
    import threading

    a._thread = threading.Thread(target=a._renew_loop, daemon=True)
    a._thread.start()
    time.sleep(0.6)
    assert a.lost and f"PID {b.owner['pid']}" in a.lost, a.lost
    a.release()
    b.release()


RACER = r"""
import sys, time
sys.path.insert(0, {root!r})
from edgekit.devices.lease import DeviceLease
from edgekit.transport.local import LocalTransport
t = LocalTransport({dev!r})
for i in range({rounds}):
    l = DeviceLease(t, "pi-1", ttl_s=30).acquire(wait=True, timeout=120)
    start = time.time()
    time.sleep(0.05)
    with open({log!r}, "a") as f:
        f.write("%r %r\n" % (start, time.time()))
    l.release()
"""


def test_four_processes_racing_never_overlap(tmp_path):
    dev, log = tmp_path / "device", tmp_path / "intervals.txt"
    root = str(Path(__file__).resolve().parents[2])
    code = RACER.format(root=root, dev=str(dev), rounds=5, log=str(log))
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(4)]
    assert all(p.wait(timeout=300) == 0 for p in procs)
    spans = sorted(tuple(map(float, line.split())) for line in log.read_text().splitlines())
    assert len(spans) == 20
    overlaps = sum(1 for (s0, e0), (s1, e1) in zip(spans, spans[1:]) if s1 < e0)
    assert overlaps == 0, spans
