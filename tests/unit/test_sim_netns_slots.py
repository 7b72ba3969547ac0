"""Two edgekit homes on one host (two CI runners, or two test workers) claim simulated-device slots from the
same pool of network namespaces: a slot taken between the check and the creation is skipped, and the
other's namespace and interface are left alone (the cleanup used to delete them)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from edgekit.devices import sim_device
from edgekit.sim import netns

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and iproute2")


def _names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


def test_a_slot_taken_meanwhile_is_skipped_and_the_others_namespace_survives(monkeypatch):
    free = sim_device._free_index()
    theirs = netns.create(f"edgekit-sim{free}", free)  # another home claimed it after our check
    ours = None
    try:
        # the first check still saw the slot free (the race); the next one is the real check
        real, raced = sim_device._free_index, iter([free])
        monkeypatch.setattr(sim_device, "_free_index", lambda: next(raced, None) or real())
        index, ours = sim_device.create_netns()
        assert index != free and ours.name == f"edgekit-sim{index}"
        assert theirs.name in _names() and _link_exists(theirs.host_if)  # not torn down by our failed try
    finally:
        for ns in (ours, theirs):
            if ns is not None:
                netns.delete(ns)
    assert theirs.name not in _names()


def test_an_interface_taken_is_named_and_our_half_made_namespace_removed():
    free = sim_device._free_index()
    subprocess.run(["ip", "link", "add", "ektaken0", "type", "veth", "peer", "name", "ektaken1"], check=True)
    try:
        with pytest.raises(netns.NameTaken, match="ektaken0"):
            netns.create(f"edgekit-sim{free}", free, host_if="ektaken0")
        assert f"edgekit-sim{free}" not in _names() and _link_exists("ektaken0")
    finally:
        subprocess.run(["ip", "link", "del", "ektaken0"], check=False)
