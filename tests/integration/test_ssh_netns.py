"""Devices with their own address (network namespaces), a throttled link, packet loss, and
`edgekit sim up/down`. Root only: namespaces, tc, nftables, cgroups."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import run_edgekit_subprocess
from sshd import (  # noqa: F401
    delete_netns,
    make_netns,
    needs_root,
    needs_sshd,
    netns_link,
    register,
    start_netns_sshd,
)

pytestmark = [needs_sshd]
FAST = ["--runs", "5", "--min-seconds", "0", "--warmup", "1"]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def netns_device(netns_link, tmp_path, home):
    """A real sshd inside its own namespace at 10.251.N.2, registered as device 'nsdev'."""
    s = start_netns_sshd(tmp_path / "sshd", netns_link)
    register(s, "nsdev", target="local", workdir=tmp_path / "device")
    yield netns_link, s
    s.stop()


def _deploy(digits, out, timeout):
    t0 = time.monotonic()
    r = run_edgekit_subprocess("deploy", digits.pt2, "--target", "local", "--device", "nsdev",
                               "--eval-data", digits.eval, "--out", out, *FAST, "--no-search", "--json",
                               timeout=timeout)  # fixed variants: the link is under test
    return r, time.monotonic() - t0


@needs_root
@pytest.mark.root
@pytest.mark.slow
def test_deploy_over_a_rate_limited_link_completes(digits, netns_device, tmp_path):
    link, _ = netns_device
    link.rate_limit("2mbit", burst="32kbit", latency="500ms")
    r, secs = _deploy(digits, tmp_path / "out", timeout=600)
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)
    sent = rep["settings"]["delivery"]["bytes_sent"]
    assert sent > 100_000 and rep["device"]["transport"] == "ssh"
    print(f"\n2 Mbit/s tbf link: deploy {secs:.1f} s, {sent} bytes sent")


@needs_root
@pytest.mark.root
@pytest.mark.slow
def test_deploy_under_20_percent_packet_loss_completes_or_fails_cleanly(digits, netns_device, tmp_path):
    link, _ = netns_device
    link.packet_loss(20)
    out = tmp_path / "out"
    r, secs = _deploy(digits, out, timeout=900)
    # TCP retransmits through the loss; if it cannot, the run is a transport failure, never a result
    assert r.exit_code in (0, 3), (r.exit_code, r.stderr)
    if r.exit_code == 3:
        assert not (out / "report.json").exists()
    print(f"\n20% packet loss: exit {r.exit_code} after {secs:.1f} s")


@needs_root
@pytest.mark.root
def test_sim_up_check_down_leaves_nothing_behind(cli, home):
    from edgekit.devices.inventory import get_device, load_inventory
    from edgekit.devices.sim_device import load_states, sim_root
    from edgekit.sim.procs import alive

    r = cli("sim", "up", "t-sim", "--cpu-quota", "0.5", "--memory", "512M", "--json")
    assert r.exit_code == 0, r.stderr
    st = json.loads(r.stdout)
    try:
        assert st["mode"] == "netns" and st["running"] and st["host"].startswith("10.213.")
        ns, pid = st["netns"]["name"], st["pid"]
        assert ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        cpu_cg = next(p for p in st["cgroups"] if "/cpu/" in p)
        assert Path(cpu_cg, "cpu.cfs_quota_us").read_text().strip() == "10000"  # 0.5 of the 20 ms period
        assert str(pid) in Path(cpu_cg, "cgroup.procs").read_text().split()
        mem_cg = next(p for p in st["cgroups"] if "/memory/" in p)
        assert Path(mem_cg, "memory.limit_in_bytes").read_text().strip() == str(512 << 20)
        entry = get_device("t-sim")
        assert entry.sim and entry.target == "rpi4" and entry.host == st["host"]
        r = cli("devices", "check", "t-sim", "--json")
        assert r.exit_code == 0, r.stderr
        chk = json.loads(r.stdout)
        assert chk["matches_target"] and chk["device"]["arch"] == os.uname().machine
        assert any("CPU quota 0.5" in n for n in chk["notes"])
        r = cli("sim", "up", "t-sim")
        assert r.exit_code == 2 and "already up" in r.stderr
    finally:
        r = cli("sim", "down", "t-sim")
    assert r.exit_code == 0, r.stderr
    assert not alive(pid)
    assert ns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not Path(cpu_cg).exists() and not Path(mem_cg).exists()
    assert st["netns"]["host_if"] not in subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
    assert load_states() == [] and not (sim_root() / "t-sim").exists()
    assert [d.name for d in load_inventory().devices] == []


@needs_root
@pytest.mark.root
@pytest.mark.slow
def test_user_path_sim_up_then_deploy_rpi4(digits, home, tmp_path):
    """The README's path, as a user runs it: sim up, deploy --target rpi4 --device pi, sim down."""
    env = {"EDGEKIT_HOME": str(home)}
    r = run_edgekit_subprocess("sim", "up", "pi", "--cpu-quota", "1", env=env, timeout=120)
    assert r.exit_code == 0, r.stderr
    try:
        r = run_edgekit_subprocess("deploy", digits.pt2, "--target", "rpi4", "--device", "pi", "--eval-data",
                                   digits.eval, "--calib-data", digits.calib, "--out", tmp_path / "out", *FAST,
                                   "--json", env=env, timeout=900)
        assert r.exit_code in (0, 1), r.stderr  # a gate verdict, not a device failure
        rep = json.loads(r.stdout)
        assert rep["target"] == "rpi4" and rep["device"]["name"] == "pi" and rep["device"]["transport"] == "ssh"
        assert all(v["latency_ms"]["p50"] > 0 for v in rep["variants"])
    finally:
        down = run_edgekit_subprocess("sim", "down", "pi", env=env, timeout=120)
    assert down.exit_code == 0, down.stderr


def test_sim_falls_back_to_loopback_without_root(cli, home, monkeypatch):
    from edgekit.sim import netns as simnetns
    from edgekit.sim.procs import alive

    monkeypatch.setattr(simnetns, "available", lambda: False)  # what a non-root user gets
    r = cli("sim", "up", "lo-sim", "--cpu-quota", "0.25", "--json")
    assert r.exit_code == 0, r.stderr
    st = json.loads(r.stdout)
    try:
        assert st["mode"] == "loopback" and st["host"] == "127.0.0.1" and st["cgroups"] == []
        assert st["cpu_quota"] is None and "fallback" in r.stderr and "not applied" in r.stderr
        r = cli("devices", "check", "lo-sim", "--json")
        assert r.exit_code == 0, r.stderr
    finally:
        r = cli("sim", "down", "lo-sim")
    assert r.exit_code == 0 and not alive(st["pid"])
