"""A throwaway OpenSSH server: its own host key, its own authorized client key, its own config and
PID file in one folder. Used by `edgekit sim` and by the integration tests (tests/integration/sshd.py).
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import DeviceError
from .procs import alive, kill_tree

SSHD = "/usr/sbin/sshd"


def sshd_binary() -> str:
    exe = shutil.which("sshd") or (SSHD if os.path.exists(SSHD) else None)
    if not exe:
        raise DeviceError("OpenSSH's sshd is not installed on this machine",
                          hint="apt-get install -y --no-install-recommends openssh-server")
    return exe


def keygen(path: Path) -> Path:
    """An ed25519 key pair at ``path`` / ``path``.pub (ssh-keygen, no passphrase)."""
    exe = shutil.which("ssh-keygen")
    if not exe:
        raise DeviceError("ssh-keygen is not installed", hint="apt-get install -y openssh-client")
    path.unlink(missing_ok=True)
    Path(f"{path}.pub").unlink(missing_ok=True)
    subprocess.run([exe, "-q", "-t", "ed25519", "-N", "", "-C", "edgekit-sim", "-f", str(path)],
                   check=True, capture_output=True, timeout=30)
    return path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class Sshd:
    dir: Path
    host: str  # the address clients use
    port: int
    user: str
    client_key: Path
    host_key: Path
    pid: int | None = None
    proc: subprocess.Popen | None = None

    @property
    def host_public_line(self) -> str:
        """``type base64`` of the server's host key, as in a known_hosts line."""
        return " ".join(Path(f"{self.host_key}.pub").read_text().split()[:2])

    def write_known_hosts(self, path: Path) -> Path:
        name = self.host if self.port == 22 else f"[{self.host}]:{self.port}"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{name} {self.host_public_line}\n")
        return path

    def running(self) -> bool:
        return self.pid is not None and alive(self.pid)

    def stop(self) -> None:
        if self.pid is not None and alive(self.pid):
            kill_tree(self.pid)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def prepare(dir: Path, *, host: str, port: int, listen: str | None = None, user: str | None = None,
            host_key: Path | None = None) -> Sshd:
    """Write keys and sshd_config into ``dir`` (created); nothing is started."""
    dir.mkdir(parents=True, exist_ok=True)
    os.chmod(dir, 0o700)
    hk = host_key or keygen(dir / "host_ed25519")
    ck = keygen(dir / "client_ed25519")
    shutil.copyfile(f"{ck}.pub", dir / "authorized_keys")
    user = user or getpass.getuser()
    root = os.geteuid() == 0
    lines = [
        f"Port {port}",
        f"ListenAddress {listen or host}",
        f"HostKey {hk}",
        f"AuthorizedKeysFile {dir / 'authorized_keys'}",
        f"PidFile {dir / 'sshd.pid'}",
        "UsePAM no",
        "StrictModes no",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes",
        f"PermitRootLogin {'prohibit-password' if root else 'no'}",
        "Subsystem sftp internal-sftp",
        "LogLevel ERROR",
        "MaxStartups 50:30:100",
        "MaxSessions 50",
    ]
    (dir / "sshd_config").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return Sshd(dir=dir, host=host, port=port, user=user, client_key=ck, host_key=hk)


def start(s: Sshd, *, netns: str | None = None, preexec: Callable[[], None] | None = None,
          ready_timeout: float = 15.0, detach: bool = False) -> Sshd:
    """Start sshd in the foreground mode (``-D -e``), inside ``netns`` when given, and wait until it
    answers with an SSH banner. ``preexec`` runs in the child before exec (e.g. joining a cgroup).
    ``detach`` lets it outlive this process (for `edgekit sim up`)."""
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege separation directory
    argv = [sshd_binary(), "-D", "-e", "-f", str(s.dir / "sshd_config")]
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]  # ip execs sshd: the PID stays the same
    log = open(s.dir / "sshd.log", "ab")
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True, preexec_fn=preexec, close_fds=True)
    finally:
        log.close()
    s.pid = proc.pid
    s.proc = None if detach else proc
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (s.dir / "sshd.log").read_text(errors="replace")[-800:]
            raise DeviceError(f"sshd exited at start (code {proc.returncode}): {tail.strip()}")
        try:
            with socket.create_connection((s.host, s.port), timeout=1.0) as c:
                c.settimeout(2.0)
                if c.recv(64).startswith(b"SSH-"):
                    return s
        except OSError:
            time.sleep(0.1)
    s.stop()
    raise DeviceError(f"sshd did not answer on {s.host}:{s.port} within {ready_timeout:.0f} s "
                      f"(log: {s.dir / 'sshd.log'})")
