"""A per-device lock, so two deploys never measure on one device at the same time.

The lock is an ``flock`` on ``$EDGEKIT_HOME/locks/<device>.lock``, held for the transport's life:
it works across processes, and the kernel releases it the moment its holder dies (a crash never
leaves a device locked). The file also holds a lease record (holder PID, host, command, start and
expiry) so a waiting deploy can say who holds the device and whether that holder overran its lease.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from types import TracebackType

from ..errors import DeviceError
from ..paths import locks_dir

DEFAULT_LEASE_S = 3600.0  # a deploy longer than this is reported as overrunning, not broken into
POLL_S = 0.2


class DeviceLockedError(DeviceError):
    """Another deploy holds the device (exit 3)."""


class DeviceLock:
    def __init__(self, device: str, *, lease_s: float = DEFAULT_LEASE_S, directory: Path | None = None):
        self.device = device
        self.lease_s = lease_s
        self.path = (directory or locks_dir()) / f"{device}.lock"
        self._fd: int | None = None
        self.waited_s = 0.0

    @property
    def held(self) -> bool:
        return self._fd is not None

    def holder(self) -> dict[str, object] | None:
        """The lease record of the current (or last) holder, if readable."""
        try:
            text = self.path.read_text(encoding="utf-8").strip()
            return json.loads(text) if text else None
        except (OSError, ValueError):
            return None

    def _describe_holder(self) -> str:
        h = self.holder()
        if not h:
            return "another edgekit process"
        now = time.time()
        desc = f"PID {h.get('pid')} on {h.get('host')} since {h.get('started')}"
        expires = h.get("expires_unix")
        if isinstance(expires, (int, float)) and expires and now > expires:
            desc += f" (lease expired {now - expires:.0f} s ago: that deploy is overrunning or hung)"
        return desc

    def acquire(self, *, wait: bool = True, timeout: float | None = None) -> "DeviceLock":
        if self._fd is not None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        start = time.monotonic()
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not wait:
                        raise DeviceLockedError(
                            f"device '{self.device}' is busy: {self._describe_holder()}",
                            hint="wait for that deploy to finish (drop --no-wait to queue behind it)") from None
                    if timeout is not None and time.monotonic() - start >= timeout:
                        raise DeviceLockedError(
                            f"device '{self.device}' stayed busy for {timeout:.0f} s: {self._describe_holder()}",
                            hint="raise --lock-timeout, or stop the other deploy") from None
                    time.sleep(POLL_S)
        except BaseException:
            os.close(fd)
            raise
        self.waited_s = time.monotonic() - start
        now = time.time()
        record = {"device": self.device, "pid": os.getpid(), "host": socket.gethostname(),
                  "command": " ".join(sys.argv[:3]),
                  "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                  "started_unix": now, "expires_unix": now + self.lease_s}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)  # the record describes a holder; there is none now
        except OSError:
            pass
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __enter__(self) -> "DeviceLock":
        return self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
