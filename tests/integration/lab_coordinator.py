"""A real labgrid coordinator for tests and benchmarks, and a small lab network of namespaces.

``start_coordinator(dir)`` runs ``python -m labgrid.remote.coordinator --listen HOST:PORT`` (labgrid's own
coordinator, gRPC) with its working folder (places.yaml) in ``dir``; ``stop()`` ends it by PID.
``LabNet`` (root): a bridge with a test-only /24 and namespaces attached to it by veth pairs, so
"hosts" in different namespaces reach each other and the coordinator (bound to the bridge's address)
without IP forwarding or any address outside what the test made; deleted by name in ``close()``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from edgekit.sim.sshd import free_port


@dataclass
class CoordinatorProc:
    proc: subprocess.Popen
    host: str
    port: int
    dir: Path

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def log(self) -> str:
        try:
            return (self.dir / "coordinator.log").read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=8)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)


def start_coordinator(dir: Path, host: str = "127.0.0.1", port: int | None = None,
                      timeout: float = 20.0) -> CoordinatorProc:
    dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port(host)
    log = open(dir / "coordinator.log", "ab")
    try:
        proc = subprocess.Popen([sys.executable, "-m", "labgrid.remote.coordinator", "--listen", f"{host}:{port}"],
                                cwd=dir, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    finally:
        log.close()
    c = CoordinatorProc(proc, host, port, dir)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"labgrid-coordinator exited ({proc.returncode}): {c.log()[-800:]}")
        if "listening on" in c.log():
            try:
                socket.create_connection((host, port), timeout=1).close()
                return c
            except OSError:
                pass
        time.sleep(0.05)
    c.stop()
    raise RuntimeError(f"labgrid-coordinator did not listen on {host}:{port} within {timeout:.0f} s: {c.log()[-800:]}")


def _ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30, check=check)


@dataclass
class LabNet:
    """A bridge (``addr(1)`` on this host) and member namespaces at ``addr(10 + i)``."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:5])
    subnet: str = ""
    members: dict[str, str] = field(default_factory=dict)  # namespace -> address

    def __post_init__(self):
        self.subnet = self.subnet or f"10.252.{int(self.tag[:4], 16) % 250 + 1}"
        self.bridge = f"eklb{self.tag}"
        _ip("link", "add", "name", self.bridge, "type", "bridge")
        try:
            _ip("addr", "add", f"{self.host_addr}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except subprocess.CalledProcessError:
            self.close()
            raise

    @property
    def host_addr(self) -> str:
        return f"{self.subnet}.1"

    def add(self, role: str) -> tuple[str, str]:
        """A namespace on the bridge; returns (namespace name, its address)."""
        i = len(self.members)
        ns, addr = f"eklab-{self.tag}-{role}", f"{self.subnet}.{10 + i}"
        host_if = f"eklv{self.tag}{i}"[:15]
        steps = [("netns", "add", ns),
                 ("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns),
                 ("link", "set", host_if, "master", self.bridge),
                 ("link", "set", host_if, "up"),
                 ("netns", "exec", ns, "ip", "addr", "add", f"{addr}/24", "dev", "eth0"),
                 ("netns", "exec", ns, "ip", "link", "set", "eth0", "up"),
                 ("netns", "exec", ns, "ip", "link", "set", "lo", "up")]
        self.members[ns] = addr
        for step in steps:
            _ip(*step)
        return ns, addr

    def close(self) -> None:
        for ns in list(self.members):
            _ip("netns", "del", ns, check=False)  # its veth end goes with it, and the peer with that
        self.members.clear()
        _ip("link", "del", self.bridge, check=False)
