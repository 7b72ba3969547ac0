"""A network namespace joined to this host by a veth pair, so a simulated device has its own
address (10.213.N.2, this host is 10.213.N.1 on a /30 that exists only between the two)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from ..errors import DeviceError

SUBNET = "10.213"


@dataclass
class Netns:
    name: str
    host_if: str
    host_addr: str
    dev_addr: str

    def to_dict(self) -> dict:
        return {"name": self.name, "host_if": self.host_if, "host_addr": self.host_addr, "dev_addr": self.dev_addr}


class NameTaken(DeviceError):
    """The namespace or host interface exists already (taken by another user of this host)."""


def _ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30, check=check)


def available() -> bool:
    import os

    return os.geteuid() == 0 and shutil.which("ip") is not None


def create(name: str, index: int, *, subnet: str = SUBNET, host_if: str | None = None) -> Netns:
    """Namespace ``name`` with the device's veth end named eth0 inside it."""
    ns = Netns(name=name, host_if=host_if or f"eksim{index}", host_addr=f"{subnet}.{index}.1",
               dev_addr=f"{subnet}.{index}.2")
    steps = [("netns", "add", ns.name),
             ("link", "add", ns.host_if, "type", "veth", "peer", "name", "eth0", "netns", ns.name),
             ("addr", "add", f"{ns.host_addr}/30", "dev", ns.host_if),
             ("link", "set", ns.host_if, "up"),
             ("netns", "exec", ns.name, "ip", "addr", "add", f"{ns.dev_addr}/30", "dev", "eth0"),
             ("netns", "exec", ns.name, "ip", "link", "set", "eth0", "up"),
             ("netns", "exec", ns.name, "ip", "link", "set", "lo", "up")]
    for n, step in enumerate(steps):
        try:
            _ip(*step)
        except subprocess.CalledProcessError as exc:
            # undo only what this call made: a name or interface that already existed is someone else's
            # (another edgekit home on this host took the slot between the check and here)
            if n >= 2:
                _ip("link", "del", ns.host_if, check=False)
            if n >= 1:
                _ip("netns", "del", ns.name, check=False)
            if n <= 1 and "exists" in (exc.stderr or "").lower():
                raise NameTaken(f"{ns.name if n == 0 else ns.host_if} already exists") from exc
            raise DeviceError(f"`ip {' '.join(step)}` failed: {exc.stderr.strip()}",
                              hint="needs root and iproute2 (apt-get install -y iproute2)") from exc
    return ns


def delete(ns: Netns) -> None:
    _ip("link", "del", ns.host_if, check=False)
    _ip("netns", "del", ns.name, check=False)


def exists(name: str) -> bool:
    out = _ip("netns", "list", check=False).stdout
    return any(line.split()[0] == name for line in out.splitlines() if line.strip())
