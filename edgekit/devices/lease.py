"""A lease held ON the device, so two hosts never measure one device at once without a coordinator.

The host lock (``lock.py``) is an ``flock`` on the host running edgekit: two CI runners on two hosts
do not see each other's. The lease lives in the device's workdir (``WORKDIR/device.lease``, JSON) and
every change to it is made by a small stdlib snippet run with the device's Python through the
transport (argv only). The snippet holds an ``flock`` on ``device.lease.guard`` on the device while it
reads and replaces the lease, so acquire / renew / release are atomic on the device's own kernel,
whichever host asks. Expiry is in the device's clock (host clocks may disagree).

The record names its owner (host, pid, user, edgekit run id) and a random token; while a session
measures, a background thread renews it (over its own connection: the measuring one stays the
session's). A lease past its expiry (its holder crashed or lost the link) is taken over, and the
take-over is recorded. A refusal names the holder and when its lease expires (exit 3); waiting
follows the host lock's options (``--no-wait``, ``--lock-timeout``).

Hosts that share a device must use the same workdir on it (the inventory's ``workdir``).
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import DeviceError, TransportError
from ..inputs.targets import load_target
from ..transport.base import Transport
from .inventory import DeviceEntry, get_device, transport_for
from .lock import DeviceLockedError

LEASE_FILE = "device.lease"
DEFAULT_TTL_S = 60.0  # a holder that stops renewing (crash, lost link) frees the device this long after
POLL_S = 0.5
RUN_ID = os.environ.get("EDGEKIT_RUN_ID") or uuid.uuid4().hex[:12]  # one per edgekit process unless CI sets it
# a JSON object the device-side lease snippet printed (its answer, or a lease record inside it)
LeaseDoc = dict[str, Any]

# op path owner_json ttl -> one JSON line. Every op holds the guard's flock (device kernel) around
# read-decide-write; the lease file is replaced atomically (temp + rename), never edited in place.
SNIPPET = r"""
import fcntl, json, os, sys, time
op, path, owner, ttl = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), float(sys.argv[4])
d = os.path.dirname(path)
if d:
    os.makedirs(d, exist_ok=True)
g = os.open(path + '.guard', os.O_RDWR | os.O_CREAT, 0o666)
fcntl.flock(g, fcntl.LOCK_EX)
now = time.time()
try:
    cur = json.load(open(path))
except (OSError, ValueError):
    cur = None
def put(rec):
    tmp = '%s.%d.tmp' % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, 'w') as f:
        json.dump(rec, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
mine = cur is not None and cur.get('token') == owner.get('token')
live = cur is not None and float(cur.get('expires', 0)) > now
out = {'ok': False, 'now': now, 'holder': cur}
if op == 'acquire':
    if mine or not live:
        rec = dict(owner, acquired=cur.get('acquired', now) if mine else now, renewed=now, expires=now + ttl)
        if cur is not None and not mine:
            rec['took_over'] = {k: cur.get(k) for k in ('host', 'pid', 'user', 'run_id', 'expires')}
        put(rec)
        out.update(ok=True, lease=rec, took_over=rec.get('took_over'))
elif op == 'renew':
    if mine:
        cur.update(renewed=now, expires=now + ttl)
        put(cur)
        out.update(ok=True, lease=cur)
elif op == 'release':
    if mine:
        os.unlink(path)
    out.update(ok=mine or cur is None)
elif op == 'show':
    out.update(ok=True)
print(json.dumps(out))
"""


class DeviceLeaseHeld(DeviceLockedError):
    """Another host holds the device's lease (exit 3)."""


def _when(holder: LeaseDoc, now: float) -> str:
    left = float(holder.get("expires", 0)) - now
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() + left))
    return f"lease expires in {left:.0f} s (at {stamp}) unless renewed"


def describe_holder(holder: LeaseDoc | None, now: float | None = None) -> str:
    if not holder:
        return "nobody"
    now = time.time() if now is None else now
    who = (f"{holder.get('user')}@{holder.get('host')} PID {holder.get('pid')} (edgekit run {holder.get('run_id')}"
           + (f", {holder.get('command')}" if holder.get("command") else "") + ")")
    if float(holder.get("expires", 0)) <= now:
        return who + f", lease EXPIRED {now - float(holder.get('expires', 0)):.0f} s ago (stale: the next deploy takes over)"
    return f"{who}, {_when(holder, now)}"


def owner_record(device: str, command: str | None = None) -> dict[str, object]:
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry (containers): the uid says enough
        user = str(os.getuid())
    return {"device": device, "host": socket.gethostname(), "pid": os.getpid(), "user": user, "run_id": RUN_ID,
            "token": uuid.uuid4().hex, **({"command": command} if command else {})}


def lease_op(transport: Transport, op: str, owner: dict[str, object], ttl_s: float, path: str = LEASE_FILE,
             timeout: float = 30.0) -> LeaseDoc:
    """Run one lease operation on the device; its JSON answer."""
    remote = transport.remote_path(path)
    r = transport.run([transport.python, "-c", SNIPPET, op, remote, json.dumps(owner), repr(float(ttl_s))],
                      timeout=timeout)
    doc: object
    try:
        doc = json.loads(r.stdout.strip().splitlines()[-1]) if r.ok else None
    except (ValueError, IndexError):
        doc = None
    if not isinstance(doc, dict):
        raise DeviceError(f"the device-side lease ({op}) failed on {transport.describe()}: "
                          f"{(r.stderr or r.stdout).strip()[-300:] or f'exit {r.returncode}'}",
                          hint="the device needs a Python with fcntl (Linux); check `edgekit devices check`")
    return doc


def read_holder(transport: Transport, path: str = LEASE_FILE) -> tuple[LeaseDoc | None, float]:
    """The current lease record (or None) and the device's clock."""
    doc = lease_op(transport, "show", {}, 0.0, path)
    return doc.get("holder"), float(doc.get("now", time.time()))


@dataclass
class DeviceLease:
    """The device-side lease of one session. ``renew_transport`` makes the connection the renewing
    thread uses (None: renew on ``transport``, for transports that are safe to share between threads)."""

    transport: Transport
    device: str
    ttl_s: float = DEFAULT_TTL_S
    renew_transport: Callable[[], Transport] | None = None
    path: str = LEASE_FILE
    command: str | None = None
    owner: dict[str, object] = field(default_factory=dict)
    record: LeaseDoc | None = None
    took_over: LeaseDoc | None = None
    lost: str | None = None  # why the lease was lost while held (someone took it over), else None
    waited_s: float = 0.0
    last_error: str | None = None  # the last renewal that failed (retried on the next round)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _renewer: Transport | None = None

    def acquire(self, *, wait: bool = True, timeout: float | None = None) -> "DeviceLease":
        self.owner = owner_record(self.device, self.command)
        start = time.monotonic()
        while True:
            doc = lease_op(self.transport, "acquire", self.owner, self.ttl_s, self.path)
            if doc.get("ok"):
                break
            holder = describe_holder(doc.get("holder"), float(doc.get("now", time.time())))
            if not wait:
                raise DeviceLeaseHeld(f"device '{self.device}' is leased by another host: {holder}",
                                      hint="wait for that deploy (drop --no-wait to queue behind it)")
            if timeout is not None and time.monotonic() - start >= timeout:
                raise DeviceLeaseHeld(f"device '{self.device}' stayed leased for {timeout:.0f} s: {holder}",
                                      hint="raise --lock-timeout, or stop the other deploy")
            time.sleep(POLL_S)
        self.waited_s = time.monotonic() - start
        self.record, self.took_over = doc.get("lease"), doc.get("took_over")
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name=f"lease-{self.device}", daemon=True)
        self._thread.start()
        return self

    def _renew_loop(self) -> None:
        every = max(0.2, self.ttl_s / 3.0)
        while not self._stop.wait(every):
            try:
                if self._renewer is None:
                    self._renewer = self.renew_transport() if self.renew_transport else self.transport
                doc = lease_op(self._renewer, "renew", self.owner, self.ttl_s, self.path)
            except (DeviceError, TransportError, OSError) as exc:  # a missed renewal: retry next round
                self._drop_renewer()
                self.last_error = str(exc)
                continue
            if not doc.get("ok"):
                self.lost = f"lease lost while measuring: now held by {describe_holder(doc.get('holder'))}"
                return
            self.record = doc.get("lease")

    def _drop_renewer(self) -> None:
        r, self._renewer = self._renewer, None
        if r is not None and r is not self.transport:
            try:
                r.close()
            except Exception:  # closing a broken connection: nothing to report
                pass

    def release(self) -> None:
        """Stop renewing and remove the lease (only if still ours). Never raises: a device that is gone
        keeps a lease that expires by itself."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=35)
            self._thread = None
        self._drop_renewer()
        if self.record is None:
            return
        try:
            lease_op(self.transport, "release", self.owner, self.ttl_s, self.path, timeout=15)
        except (DeviceError, TransportError, OSError):
            pass
        self.record = None


def session_lease(transport: Transport, device: str, *, wait: bool, timeout: float | None) -> DeviceLease | None:
    """The lease a DeviceSession takes on an inventory device (None when leases are off:
    ``EDGEKIT_DEVICE_LEASE=0``). The renewing thread gets its own connection to the device."""
    if os.environ.get("EDGEKIT_DEVICE_LEASE", "1") == "0":
        return None

    entry = get_device(device)
    ttl = float(os.environ.get("EDGEKIT_LEASE_TTL_S", DEFAULT_TTL_S))
    python = transport.python
    renew = None if transport.kind == "local" else (lambda: _with_python(transport_for(entry), python))
    import sys

    return DeviceLease(transport, device, ttl_s=ttl, renew_transport=renew,
                       command=" ".join(os.path.basename(a) for a in sys.argv[:2])).acquire(wait=wait, timeout=timeout)


def _with_python(t: Transport, python: str) -> Transport:
    t.python = python
    return t


def device_lease_holder(entry: DeviceEntry, timeout: float = 15.0) -> str:
    """Who holds an inventory device's lease, in words (connects to the device; never raises)."""

    try:
        t = transport_for(entry, load_target(entry.target).python)
        try:
            holder, now = read_holder(t)
        finally:
            t.close()
    except Exception as exc:  # listing: an unreachable device is a row, not a failure
        return f"unknown ({type(exc).__name__}: {str(getattr(exc, 'message', exc))[:80]})"
    return "free" if holder is None else describe_holder(holder, now)
