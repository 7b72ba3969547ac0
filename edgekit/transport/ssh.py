"""A Linux board reached over SSH (paramiko): commands on an exec channel, files over SFTP.

Security: the server's host key is checked against known_hosts (edgekit's own file plus the
user's ~/.ssh/known_hosts); an unknown host is refused unless it was trusted explicitly
(`edgekit devices add --trust`, which shows the fingerprint), and a changed key is always refused.
Commands are argv lists, each word quoted with shlex.quote for the remote shell.

Transient failures (connection refused/reset, timeouts while connecting or transferring) are
retried with exponential backoff; a command whose connection drops while it runs is NOT re-run
(it may be a measurement): that is a TransportError (exit 3).
"""

from __future__ import annotations

import base64
import hashlib
import os
import posixpath
import select
import shlex
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

from ..errors import BadInputError, TransportError, require
from ..fsutil import atomic_path
from .base import CommandResult, Transport

T = TypeVar("T")

DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_RETRIES = 3  # attempts after the first one, for connecting and for idempotent transfers
BACKOFF_S = 0.5  # first wait; doubles each attempt
KEEPALIVE_S = 5  # so a dead peer is noticed while a long command runs


def user_known_hosts() -> Path:
    return Path(os.path.expanduser("~/.ssh/known_hosts"))


def fingerprint(key) -> str:
    """OpenSSH-style SHA256 fingerprint of a paramiko public key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def host_key_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


@dataclass(frozen=True)
class SSHConfig:
    host: str
    port: int = 22
    user: str | None = None
    key: str | None = None  # private key file; None = ssh-agent and ~/.ssh default keys
    known_hosts: tuple[str, ...] = ()  # files checked for the host key (first is where trust is written)
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S
    retries: int = DEFAULT_RETRIES


def _paramiko():
    return require("paramiko", "ssh", "reaching a device over SSH")


class _RefuseUnknown:
    """paramiko missing-host-key policy: refuse, with the fingerprint and the way to trust it."""

    def missing_host_key(self, client, hostname, key):
        raise TransportError(
            f"host key of {hostname} is not known ({key.get_name()} {fingerprint(key)}); refusing to connect",
            hint="check the fingerprint with the device's owner, then `edgekit devices add ... --trust` "
                 "(or add it to ~/.ssh/known_hosts)")


def _is_transient(exc: BaseException) -> bool:
    paramiko = _paramiko()
    if isinstance(exc, (paramiko.AuthenticationException, paramiko.BadHostKeyException)):
        return False
    return isinstance(exc, (socket.timeout, TimeoutError, ConnectionError, EOFError,
                            paramiko.SSHException, OSError))


def fetch_host_key(host: str, port: int = 22, timeout: float = DEFAULT_CONNECT_TIMEOUT_S):
    """Connect only far enough to read the server's host key (for `devices add --trust`)."""
    paramiko = _paramiko()
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise TransportError(f"cannot reach {host}:{port}: {exc}",
                             hint="check the host, the port and that sshd runs on the device") from exc
    t = paramiko.Transport(sock)
    try:
        t.banner_timeout = timeout
        t.start_client(timeout=timeout)
        return t.get_remote_server_key()
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise TransportError(f"{host}:{port} did not complete an SSH handshake: {exc}") from exc
    finally:
        t.close()


def trust_host_key(host: str, port: int, key, known_hosts: str | Path) -> None:
    """Record ``key`` for host:port in ``known_hosts`` (edgekit's own file), replacing nothing:
    a different key already recorded for that host is a changed key, refused."""
    paramiko = _paramiko()
    path = Path(known_hosts)
    hk = paramiko.HostKeys()
    if path.is_file():
        hk.load(str(path))
    name = host_key_name(host, port)
    known = hk.lookup(name) or {}
    if key.get_name() in known:
        if known[key.get_name()] == key:
            return
        raise TransportError(
            f"{name} already has a different {key.get_name()} key in {path}; refusing to replace it",
            hint="if the device was really re-installed, remove its line from that file first")
    hk.add(name, key.get_name(), key)
    path.parent.mkdir(parents=True, exist_ok=True)

    with atomic_path(path) as tmp:
        hk.save(str(tmp))


class SSHTransport(Transport):
    kind = "ssh"

    def __init__(self, cfg: SSHConfig, *, workdir: str = ".edgekit", python: str = "python3",
                 sleep: Callable[[float], None] = time.sleep):
        super().__init__(workdir, python)
        self.cfg = cfg
        self._sleep = sleep
        self._client = None
        self._sftp = None
        self._workdir_resolved = False

    # --- connection -------------------------------------------------------------------------
    def describe(self) -> str:
        user = f"{self.cfg.user}@" if self.cfg.user else ""
        return f"ssh:{user}{self.cfg.host}:{self.cfg.port}"

    def _connect_once(self):
        paramiko = _paramiko()
        client = paramiko.SSHClient()
        files = [Path(p) for p in self.cfg.known_hosts] or [user_known_hosts()]
        for f in files:
            if f.is_file():
                try:
                    client.load_host_keys(str(f))  # later files add to earlier ones
                except (OSError, paramiko.SSHException) as exc:
                    raise BadInputError(f"cannot read known_hosts file {f}: {exc}") from exc
        client.set_missing_host_key_policy(_RefuseUnknown())
        key_filename = None
        if self.cfg.key:
            key_filename = os.path.expanduser(self.cfg.key)
            if not os.path.isfile(key_filename):
                raise BadInputError(f"SSH key {key_filename} does not exist",
                                    hint="fix the device's key with `edgekit devices add NAME ... --key PATH`")
        try:
            client.connect(self.cfg.host, port=self.cfg.port, username=self.cfg.user, key_filename=key_filename,
                           timeout=self.cfg.connect_timeout, banner_timeout=self.cfg.connect_timeout,
                           auth_timeout=self.cfg.connect_timeout, channel_timeout=self.cfg.connect_timeout,
                           allow_agent=True, look_for_keys=key_filename is None)
        except BaseException:
            client.close()
            raise
        t = client.get_transport()
        t.set_keepalive(KEEPALIVE_S)
        return client

    def _connect(self):
        if self._client is not None and self._client.get_transport() is not None \
                and self._client.get_transport().is_active():
            return self._client
        self._drop()
        paramiko = _paramiko()
        where = f"{self.cfg.host}:{self.cfg.port}"
        attempts = self.cfg.retries + 1
        last: BaseException | None = None
        for i in range(attempts):
            try:
                self._client = self._connect_once()
                break
            except TransportError:
                raise
            except paramiko.BadHostKeyException as exc:
                raise TransportError(
                    f"HOST KEY CHANGED for {where}: the server offers {exc.key.get_name()} {fingerprint(exc.key)}, "
                    f"known_hosts has {fingerprint(exc.expected_key)}; refusing to connect (this is what a "
                    "man-in-the-middle looks like)",
                    hint="if the device was re-installed, remove its old key from known_hosts and "
                         "`edgekit devices add ... --trust` again") from exc
            except paramiko.AuthenticationException as exc:
                raise TransportError(f"SSH authentication to {self.cfg.user or '(default user)'}@{where} failed: {exc}",
                                     hint="check the device's user and key (`edgekit devices list`), "
                                          "or load the key into ssh-agent") from exc
            except BadInputError:
                raise
            except Exception as exc:
                if not _is_transient(exc):
                    raise TransportError(f"cannot connect to {where}: {exc}") from exc
                last = exc
                if i + 1 < attempts:
                    self._sleep(BACKOFF_S * (2 ** i))
        else:
            raise TransportError(f"cannot connect to {where} after {attempts} attempts: {last or 'unknown error'}",
                                 hint="check that the device is on, reachable and runs sshd") from last
        if not self._workdir_resolved:
            self._resolve_workdir()
        return self._client

    def remote_path(self, rel: str) -> str:
        if not self._workdir_resolved and not rel.startswith("/"):
            self._connect()  # a relative workdir is only known once we know the login's home
        return super().remote_path(rel)

    def _resolve_workdir(self) -> None:
        """A relative or ~ workdir is relative to the login's home, which SFTP tells us."""
        wd = self.workdir
        if not wd.startswith("/"):
            home = self._sftp_client().normalize(".")
            rest = wd[2:] if wd.startswith("~/") else ("" if wd == "~" else wd)
            self.workdir = posixpath.normpath(posixpath.join(home, rest))
        self._workdir_resolved = True

    def _sftp_client(self):
        if self._sftp is None:
            self._sftp = self._client.open_sftp()
            self._sftp.get_channel().settimeout(max(self.cfg.connect_timeout, 30.0))
        return self._sftp

    def _drop(self) -> None:
        for obj in (self._sftp, self._client):
            if obj is not None:
                try:
                    obj.close()
                except Exception:  # closing a broken connection: nothing left to report
                    pass
        self._sftp = None
        self._client = None

    def close(self) -> None:
        self._drop()

    def connect(self) -> "SSHTransport":
        self._connect()
        return self

    # --- commands ---------------------------------------------------------------------------
    def command_line(self, argv: list[str], cwd: str | None = None) -> str:
        """The remote shell line: every word quoted; the inventory's python command may be several
        words (``env PYTHONPATH=... python3``), so it is split, then quoted word by word."""
        if not argv:
            raise ValueError("empty argv")
        head = shlex.split(argv[0]) if argv[0] == self.python else [argv[0]]
        line = " ".join(shlex.quote(w) for w in [*head, *argv[1:]])
        if cwd:
            line = f"cd {shlex.quote(self.remote_path(cwd))} && {line}"
        return line

    def run(self, argv: list[str], *, timeout: float, cwd: str | None = None) -> CommandResult:
        paramiko = _paramiko()
        client = self._connect()
        line = self.command_line(argv, cwd)
        start = time.perf_counter()
        try:
            chan = client.get_transport().open_session(timeout=self.cfg.connect_timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            # the command never started: reconnect once and start it
            self._drop()
            client = self._connect()
            try:
                chan = client.get_transport().open_session(timeout=self.cfg.connect_timeout)
            except (paramiko.SSHException, OSError, EOFError) as exc2:
                raise TransportError(f"cannot open a channel on {self.describe()}: {exc2}") from exc
        try:
            chan.exec_command(line)
            out, err = self._collect(chan, timeout, argv)
            if not chan.exit_status_ready():
                raise TransportError(
                    f"the connection to {self.describe()} closed while `{argv[0]} ...` ran (no exit status)",
                    hint="the device rebooted, sshd died or the link dropped; nothing from this command is used")
            rc = chan.recv_exit_status()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self._drop()
            raise TransportError(f"the connection to {self.describe()} failed while `{argv[0]} ...` ran: {exc}",
                                 hint="the device rebooted, sshd died or the link dropped; retry") from exc
        finally:
            chan.close()
        if rc == -1:
            raise TransportError(f"`{argv[0]} ...` on {self.describe()} ended without an exit status "
                                 "(killed by a signal or the connection dropped)")
        return CommandResult(tuple(argv), rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                             time.perf_counter() - start)

    def _collect(self, chan, timeout: float, argv: list[str]) -> tuple[bytes, bytes]:
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout
        transport = chan.get_transport()
        def drain():
            while chan.recv_ready():
                out.extend(chan.recv(65536))
            while chan.recv_stderr_ready():
                err.extend(chan.recv_stderr(65536))

        while True:
            drain()
            if chan.closed or (chan.eof_received and chan.exit_status_ready()):
                break
            if transport is None or not transport.is_active():
                break
            left = deadline - time.monotonic()
            if left <= 0:
                raise TransportError(f"command timed out after {timeout:.0f} s on {self.describe()}: {argv[0]} ...",
                                     hint="raise the timeout or lower runs/min_seconds; a slow link also counts")
            select.select([chan], [], [], min(left, 0.2))
        drain()
        return bytes(out), bytes(err)

    # --- files --------------------------------------------------------------------------------
    def _retrying(self, what: str, op: Callable[[], T]) -> T:
        """Re-run an idempotent transfer on a fresh connection after a transient failure."""
        attempts = self.cfg.retries + 1
        for i in range(attempts):
            try:
                self._connect()
                return op()
            except TransportError:
                raise
            except Exception as exc:
                if not _is_transient(exc) or i + 1 == attempts:
                    raise TransportError(f"{what} on {self.describe()} failed: {exc}",
                                         hint="check the link and the device's free disk") from exc
                self._drop()
                self._sleep(BACKOFF_S * (2 ** i))
        raise AssertionError("unreachable")

    def _mkdirs(self, sftp, path: str) -> None:
        parts, cur = [p for p in path.split("/") if p], "/" if path.startswith("/") else ""
        for p in parts:
            cur = posixpath.join(cur, p) if cur else p
            try:
                sftp.stat(cur)
            except FileNotFoundError:
                sftp.mkdir(cur)

    def push(self, local: Path, remote: str) -> None:
        local = Path(local)
        if not local.is_file():
            raise BadInputError(f"cannot push {local}: not a file")
        size = local.stat().st_size

        def op():
            self._connect()
            sftp = self._sftp_client()
            dest = self.remote_path(remote)
            self._mkdirs(sftp, posixpath.dirname(dest))
            tmp = posixpath.join(posixpath.dirname(dest), f".{posixpath.basename(dest)}.{uuid.uuid4().hex[:8]}.partial")
            try:
                with open(local, "rb") as fh:
                    sftp.putfo(fh, tmp, file_size=size, confirm=True)
                try:
                    sftp.posix_rename(tmp, dest)
                except OSError:
                    # an SFTP server without the posix-rename extension: plain rename refuses to overwrite
                    try:
                        sftp.remove(dest)
                    except FileNotFoundError:
                        pass
                    sftp.rename(tmp, dest)
            except BaseException:
                try:
                    sftp.remove(tmp)
                except Exception:  # the link is gone; a stray .partial never has a final name
                    pass
                raise
            self.bytes_sent += size

        self._retrying(f"copying {local.name}", op)

    def pull(self, remote: str, local: Path) -> None:
        local = Path(local)

        def op():
            sftp = self._sftp_client()
            tmp = local.with_name(f".{local.name}.partial")
            try:
                sftp.get(self.remote_path(remote), str(tmp))
                os.replace(tmp, local)
            except FileNotFoundError as exc:
                tmp.unlink(missing_ok=True)
                raise TransportError(f"{self.remote_path(remote)} does not exist on {self.describe()}") from exc
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise

        self._retrying(f"copying {remote} from the device", op)
