"""Reusable throwaway sshd for integration tests (real OpenSSH, loopback or a test network namespace).

Use from a test module::

    from sshd import sshd_server, netns_link  # noqa: F401  (pytest puts tests/integration on sys.path)

or call ``start_loopback_sshd(tmp_path)`` / ``NetnsDevice(...)`` directly (e.g. for a chroot'd arm64
twin: pass ``sshd_binary``-compatible settings through ``edgekit.sim.sshd``). Everything started here
is stopped by PID in teardown: sshd and its session children, network namespaces, cgroups.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from edgekit.sim import netns as _netns
from edgekit.sim import sshd as _sshd

HAVE_SSHD = shutil.which("sshd") is not None or os.path.exists(_sshd.SSHD)
IS_ROOT = os.geteuid() == 0

needs_sshd = pytest.mark.skipif(not HAVE_SSHD, reason="OpenSSH server not installed "
                                "(apt-get install -y --no-install-recommends openssh-server)")
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root (network namespaces, tc, nftables, cgroups)")


def start_loopback_sshd(dir: Path, port: int | None = None) -> _sshd.Sshd:
    """A real sshd on 127.0.0.1 with its own host key and client key, started and ready."""
    s = _sshd.prepare(dir, host="127.0.0.1", port=port or _sshd.free_port())
    return _sshd.start(s)


class NetnsLink(_netns.Netns):
    """A network namespace joined to the host by a veth pair with test-only addresses (10.251.N.0/30),
    plus the fault injectors the tests use."""

    @property
    def ns_addr(self) -> str:
        return self.dev_addr

    def exec(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.name, *argv], check=check,
                              capture_output=True, text=True, timeout=30)

    def rate_limit(self, rate: str = "1mbit", burst: str = "32kbit", latency: str = "400ms") -> None:
        """Bandwidth limit (tc tbf) on both ends of the link."""
        args = ["root", "tbf", "rate", rate, "burst", burst, "latency", latency]
        self.exec("tc", "qdisc", "replace", "dev", "eth0", *args)
        subprocess.run(["tc", "qdisc", "replace", "dev", self.host_if, *args], check=True, capture_output=True,
                       timeout=30)

    def packet_loss(self, percent: int = 20) -> None:
        """Random loss of ``percent`` % of the packets the device receives and sends (nftables)."""
        rules = (f"table inet edgekit_loss {{\n chain in {{ type filter hook input priority 0; "
                 f"numgen random mod 100 < {percent} drop\n }}\n chain out {{ type filter hook output "
                 f"priority 0; numgen random mod 100 < {percent} drop\n }}\n}}\n")
        subprocess.run(["ip", "netns", "exec", self.name, "nft", "-f", "-"], input=rules, text=True,
                       check=True, capture_output=True, timeout=30)


def make_netns(tag: str | None = None) -> NetnsLink:
    """Create a namespace and a veth pair with addresses in 10.251.N.0/30."""
    tag = tag or uuid.uuid4().hex[:6]
    n = (int(tag[:4], 16) % 250) + 1
    base = _netns.create(f"ektest-{tag}", n, subnet="10.251", host_if=f"ekt{tag}"[:15])
    return NetnsLink(**base.to_dict())


def delete_netns(link: NetnsLink) -> None:
    _netns.delete(link)


def start_netns_sshd(dir: Path, link: NetnsLink) -> _sshd.Sshd:
    s = _sshd.prepare(dir, host=link.ns_addr, port=22)
    return _sshd.start(s, netns=link.name)


def register(s: _sshd.Sshd, name: str, *, target: str = "local", workdir: Path | None = None,
             trust: bool = True) -> None:
    """Put ``s`` in the (test-isolated) inventory as device ``name``, running this venv's Python."""
    from edgekit.devices.inventory import DeviceEntry, add_device, edgekit_known_hosts

    if trust:
        s.write_known_hosts(edgekit_known_hosts())
    add_device(DeviceEntry(name=name, kind="ssh", target=target, host=s.host, port=s.port, user=s.user,
                           key=str(s.client_key), workdir=str(workdir or (s.dir / "device")),
                           python=sys.executable), replace=True)


@pytest.fixture
def sshd_server(tmp_path):
    """A started loopback sshd (edgekit.sim.sshd.Sshd); stopped with its sessions in teardown."""
    if not HAVE_SSHD:
        pytest.skip("OpenSSH server not installed (apt-get install -y --no-install-recommends openssh-server)")
    s = start_loopback_sshd(tmp_path / "sshd")
    yield s
    s.stop()


@pytest.fixture
def netns_link():
    """A fresh network namespace + veth pair (root only); deleted in teardown."""
    if not IS_ROOT:
        pytest.skip("needs root (network namespaces)")
    link = make_netns()
    yield link
    delete_netns(link)
