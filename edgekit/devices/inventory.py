"""The device inventory: named instances of target classes, in the user's config directory.

``$EDGEKIT_HOME/devices.yaml`` (else ``$XDG_CONFIG_HOME/edgekit``, else ``~/.config/edgekit``).
A device has a ``kind`` that says how it is reached: ``ssh`` (host, port, user, key, known_hosts),
``local`` (a folder on this host) or ``adb`` (its fields arrive with the ADB transport).
``open_device_transport`` dispatches on ``kind`` and takes the device's lock for the transport's life.
"""

from __future__ import annotations

import os
import re
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..agent.bundle import BundleDeployer
from ..agent.protocol import parse_agent_stdout
from ..config import load_model_file
from ..errors import BadInputError, ConfigError
from ..formats import spec_for_runtime
from ..fsutil import atomic_write_text
from ..inputs.targets import load_target
from ..paths import INVENTORY_FILE, edgekit_home, inventory_path, known_hosts_path
from ..sim.state import find_state
from ..transport.local import LocalTransport
from ..transport.ssh import SSHConfig, SSHTransport, user_known_hosts
from .lock import DeviceLock

if TYPE_CHECKING:
    from ..inputs.targets import TargetSpec
    from ..transport.base import Transport

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
# edgekit_home (and the other folders) live in the leaf paths.py; re-exported here for compatibility
edgekit_known_hosts = known_hosts_path


class DeviceEntry(BaseModel):
    """One device. Fields not used by its ``kind`` stay unset."""

    model_config = ConfigDict(extra="forbid")

    name: str
    kind: Literal["ssh", "adb", "local"] = "ssh"
    target: str = Field(description="target class (targets/*.yaml) this device is an instance of")
    # ssh
    host: str | None = None
    port: int = Field(22, ge=1, le=65535)
    user: str | None = None
    key: str | None = Field(None, description="private key file; unset = ssh-agent and ~/.ssh keys")
    known_hosts: str | None = Field(None, description="extra known_hosts file checked for this device")
    connect_timeout: float = Field(10.0, gt=0)
    # adb (edgekit/transport/adb.py); a relative workdir lies under /data/local/tmp
    serial: str | None = Field(None, description="adb serial (`adb devices`); unset with no adb_tcp = the only "
                               "attached device")
    adb_tcp: str | None = Field(None, description="HOST:PORT of a phone on Wi-Fi adb (`adb connect` first)")
    adb_path: str | None = Field(None, description="the adb client (default: $ADB, then adb on the PATH)")
    adb_isolated_server: bool = Field(False, description="a private adb server for this device (Wi-Fi devices, "
                                      "CI); never for USB phones")
    pin_big_cores: bool = Field(False, description="run the agent under taskset with the target's big_cores_mask")
    # every kind
    workdir: str = Field(".edgekit", description="folder on the device for the agent and bundle "
                         "(relative = under the login's home)")
    python: str | None = Field(None, description="the device's Python command (default: the target's)")
    sim: bool = Field(False, description="created by `edgekit sim up` (removed by `sim down`)")
    emulated: bool = Field(False, description="CPU emulation (e.g. an arm64 twin under qemu): timings "
                           "are not the real board's")
    notes: str = ""
    labels: list[str] = Field(default_factory=list, description="pool labels (`--pool TARGET:LABEL` selects by them)")

    @model_validator(mode="after")
    def _check(self) -> DeviceEntry:
        for label in self.labels:
            if not NAME_RE.match(label):
                raise ValueError(f"label {label!r} must be letters, digits, '.', '_' or '-' (max 63)")
        if not NAME_RE.match(self.name):
            raise ValueError(f"device name {self.name!r} must be letters, digits, '.', '_' or '-' (max 63)")
        if self.kind == "ssh" and not self.host:
            raise ValueError("an ssh device needs a host")
        if self.kind == "adb" and self.serial and self.adb_tcp:
            raise ValueError("an adb device has a serial (USB) or an adb_tcp address (Wi-Fi), not both")
        return self


class Inventory(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = 1
    devices: list[DeviceEntry] = []


def load_inventory() -> Inventory:
    p = inventory_path()
    if not p.is_file():
        return Inventory()

    inv = load_model_file(Inventory, p, hint="fix it with `edgekit devices add/remove`, or delete the file")
    seen: set[str] = set()
    for d in inv.devices:
        if d.name in seen:
            raise ConfigError(f"{p}: device '{d.name}' appears twice", hint="remove one of them")
        seen.add(d.name)
    return inv


def save_inventory(inv: Inventory) -> Path:
    import yaml


    p = inventory_path()
    doc = inv.model_dump(mode="json", exclude_defaults=False)
    # the locks/ folder beside it keeps the inventory's own folder writable only by this user
    p.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(p, yaml.safe_dump(doc, sort_keys=False))


def get_device(name: str) -> DeviceEntry:
    inv = load_inventory()
    for d in inv.devices:
        if d.name == name:
            return d
    known = ", ".join(d.name for d in inv.devices) or "(none)"
    raise BadInputError(f"unknown device '{name}' (inventory: {inventory_path()})",
                        hint=f"known devices: {known}; add one with `edgekit devices add NAME --target T --host H` "
                             "or `edgekit sim up NAME`")


def add_device(entry: DeviceEntry, *, replace: bool = False) -> DeviceEntry:
    load_target(entry.target)  # an unknown target class fails here, with the known ones
    inv = load_inventory()
    others = [d for d in inv.devices if d.name != entry.name]
    if len(others) != len(inv.devices) and not replace:
        raise BadInputError(f"device '{entry.name}' is already in the inventory",
                            hint="pass --replace to overwrite it, or `edgekit devices remove` it first")
    inv.devices = [*others, entry]
    save_inventory(inv)
    return entry


def remove_device(name: str) -> DeviceEntry:
    entry = get_device(name)
    inv = load_inventory()
    inv.devices = [d for d in inv.devices if d.name != name]
    save_inventory(inv)
    return entry


def select_devices(devices: list[str] | None = None, pool: str | None = None) -> list[DeviceEntry]:
    """The units of a fleet run: named devices (``pi-1,pi-2``), or a pool ``TARGET:LABEL`` (every
    inventory device of that target class carrying that label; ``TARGET`` alone = all of the class)."""
    if bool(devices) == bool(pool):
        raise BadInputError("a fleet run takes --devices A,B,C or --pool TARGET:LABEL (one of them)")
    if devices:
        names = list(dict.fromkeys(d.strip() for d in devices if d.strip()))
        return [get_device(n) for n in names]
    assert pool  # exactly one of the two was given (checked above)
    target, _, label = pool.partition(":")
    inv = load_inventory()
    found = [d for d in inv.devices if d.target == target and (not label or label in d.labels)]
    if not found:
        have = sorted({f"{d.target}:{lab}" for d in inv.devices for lab in d.labels}) or ["(no labels)"]
        raise BadInputError(f"pool '{pool}' is empty: no '{target}' device in the inventory"
                            + (f" has label '{label}'" if label else ""),
                            hint=f"pools in the inventory: {', '.join(have)}; label a device with "
                                 "`edgekit devices add NAME ... --label LABEL --replace`")
    return found


def host_lock_holder(name: str) -> dict[str, object] | None:
    """The lease record of the deploy on THIS host holding the device's flock, or None when free."""
    import fcntl


    lock = DeviceLock(name)
    if not lock.path.is_file():
        return None
    fd = os.open(lock.path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None  # nobody holds it (a record left by a crashed holder says nothing)
    except BlockingIOError:
        return lock.holder() or {}
    finally:
        os.close(fd)


def known_hosts_files(entry: DeviceEntry) -> tuple[str, ...]:
    files = [str(edgekit_known_hosts())]
    if entry.known_hosts:
        files.append(os.path.expanduser(entry.known_hosts))
    files.append(str(user_known_hosts()))
    return tuple(files)


def transport_for(entry: DeviceEntry, target_python: str = "python3") -> Transport:
    """A transport to ``entry`` (not connected yet, no lock)."""
    python = entry.python or target_python
    if entry.kind == "ssh":
        cfg = SSHConfig(host=entry.host or "", port=entry.port, user=entry.user, key=entry.key,
                        known_hosts=known_hosts_files(entry), connect_timeout=entry.connect_timeout)
        return SSHTransport(cfg, workdir=entry.workdir, python=python)
    if entry.kind == "local":
        return LocalTransport(entry.workdir, python=entry.python)
    if entry.kind == "adb":
        try:
            from ..transport import adb as _adb
        except ImportError as exc:
            raise BadInputError(f"device '{entry.name}' is an adb device, and this edgekit has no ADB transport") from exc
        return _adb.transport_for_device(entry, python)
    raise ConfigError(f"device '{entry.name}': unknown kind {entry.kind!r}")


def open_device_transport(device_name: str, target_spec: TargetSpec, *, wait: bool = True,
                          lock_timeout: float | None = None) -> Transport:
    """The transport the pipeline measures on: the device's lock is held until ``close()``."""

    entry = get_device(device_name)
    if entry.target != target_spec.name:
        raise BadInputError(
            f"device '{device_name}' is a '{entry.target}' device, not '{target_spec.name}'",
            hint=f"pass --target {entry.target}, or re-register it with `edgekit devices add {device_name} "
                 f"--target {target_spec.name} ... --replace`")
    lock = DeviceLock(device_name)
    lock.acquire(wait=wait, timeout=lock_timeout)
    try:
        t = transport_for(entry, target_spec.python)
    except BaseException:
        lock.release()
        raise
    _attach_lock(t, lock)
    return t


# the device lock each open transport holds (released by its close)
_HELD_LOCKS: weakref.WeakKeyDictionary[Transport, DeviceLock] = weakref.WeakKeyDictionary()


def held_lock(t: Transport) -> DeviceLock | None:
    """The device lock ``t`` holds until it closes (None for a transport opened without one)."""
    return _HELD_LOCKS.get(t)


def _attach_lock(t: Transport, lock: DeviceLock) -> None:
    """Release the lock when the transport closes (the pipeline closes what it opened)."""
    original = t.close

    def close() -> None:
        try:
            original()
        finally:
            lock.release()

    # this one instance's close releases the lock: a per-instance hook, not a new method for the class
    t.close = close  # type: ignore[method-assign]
    _HELD_LOCKS[t] = lock


# The agent's --probe says what the device is and can run; this stdlib snippet adds free disk in the
# workdir and available memory (a cgroup v1/v2 memory limit counts when it is lower).
_RESOURCES_PY = r"""
import json, os, shutil, sys
wd = sys.argv[1]
os.makedirs(wd, exist_ok=True)
mem = {}
try:
    for line in open('/proc/meminfo'):
        k, v = line.split(':', 1)
        mem[k] = int(v.split()[0]) / 1024.0
except OSError:
    pass
limit = None
try:
    for line in open('/proc/self/cgroup'):
        parts = line.strip().split(':', 2)
        if 'memory' in parts[1].split(',') or parts[1] == '':
            for f in ('/sys/fs/cgroup/memory' + parts[2] + '/memory.limit_in_bytes', '/sys/fs/cgroup' + parts[2] + '/memory.max'):
                try:
                    v = open(f).read().strip()
                    if v != 'max' and int(v) < (1 << 60):
                        limit = int(v) / 2.0 ** 20
                except (OSError, ValueError):
                    pass
except OSError:
    pass
avail = mem.get('MemAvailable')
if limit is not None and (avail is None or limit < avail):
    avail = limit
print(json.dumps({'disk_free_mb': shutil.disk_usage(wd).free / 2.0 ** 20, 'mem_total_mb': mem.get('MemTotal'),
                  'mem_available_mb': avail, 'memory_limit_mb': limit}))
"""

class DeviceCheck(TypedDict):
    """``edgekit devices check``'s answer (its --json document)."""

    name: str
    target: str
    transport: str
    workdir: str
    device: dict[str, Any]  # the agent's --probe "device" section, as the device sent it
    runtimes: dict[str, Any]  # runtime -> version, as the agent's probe reports it
    missing_runtimes: list[str]
    resources: dict[str, Any]  # free disk and memory in MB, or {"error": why}
    sim: bool
    matches_target: bool
    problems: list[str]
    notes: list[str]


_ARCH_ALIASES = {"arm64": "aarch64", "aarch64": "aarch64", "x86_64": "x86_64", "amd64": "x86_64", "armv7l": "armv7l"}


def check_device(entry: DeviceEntry, *, timeout: float = 60.0) -> DeviceCheck:
    """Connect, install the agent if needed, and describe the device against its target class."""
    import json as _json


    spec = load_target(entry.target)
    t = transport_for(entry, spec.python)
    try:
        dep = BundleDeployer(t, timeout=timeout)
        res = t.run([t.python, dep.agent, "--probe"], timeout=timeout)
        probe = parse_agent_stdout(res.stdout, res.stderr, res.returncode)
        r = t.run([t.python, "-c", _RESOURCES_PY, t.workdir], timeout=timeout)
        try:
            resources = _json.loads(r.stdout) if r.ok else {"error": (r.stderr or r.stdout).strip()[-300:]}
        except ValueError:
            resources = {"error": f"unreadable answer {r.stdout[:100]!r}"}
        where = t.describe()
        workdir = t.workdir
    finally:
        t.close()
    dev = probe.get("device") or {}
    runtimes = probe.get("runtimes") or {}
    problems = []
    got_arch = _ARCH_ALIASES.get(str(dev.get("arch")), dev.get("arch"))
    if got_arch != _ARCH_ALIASES.get(spec.arch, spec.arch):
        problems.append(f"arch is {dev.get('arch')}, target {spec.name} is {spec.arch}")
    if dev.get("os") and dev.get("os") != spec.os:
        problems.append(f"os is {dev.get('os')}, target {spec.name} is {spec.os}")

    # runtimes the agent drives (the registry's rows; Core ML is profiled from macOS, not by the agent)
    on_agent = [r for r in spec.runtimes if (row := spec_for_runtime(r)) is None or row.agent_runs]
    missing = [r for r in on_agent if r not in runtimes]
    if len(missing) == len(on_agent):
        problems.append(f"none of the target's runtimes ({', '.join(spec.runtimes)}) is installed"
                        f" (`edgekit devices provision {entry.name}`)")
    if spec.wheels and dev.get("python") and not str(dev["python"]).startswith(spec.wheels.python_version + "."):
        problems.append(f"Python is {dev['python']}, the target's wheels are for {spec.wheels.python_version}")
    notes = []
    if entry.sim:
        if not entry.emulated:  # an emulated arm64 twin must really be aarch64 with the target's Python
            # a simulated device runs this host's CPU and Python: those differences are expected
            notes = [p + " (expected: simulated device)" for p in problems if p.startswith(("arch is", "Python is"))]
            problems = [p for p in problems if not p.startswith(("arch is", "Python is"))]
        else:
            notes.append("emulated (qemu user mode): the CPU model and core count it reports are this host's, "
                         "and its timings are not the board's")

        st = find_state(entry.name)
        if st is not None and (st.cpu_quota or st.memory_bytes):
            # `ip netns exec` remounts /sys, so the device cannot see its own cgroup limits: say them here
            notes.append(f"simulator limits: CPU quota {st.cpu_quota or 'none'} core, memory "
                         f"{f'{st.memory_bytes / 2**20:.0f} MB' if st.memory_bytes else 'unlimited'} (cgroup v1)")
    return {"name": entry.name, "target": spec.name, "transport": where, "workdir": workdir,
            "device": dev, "runtimes": runtimes, "missing_runtimes": missing, "resources": resources,
            "sim": entry.sim, "matches_target": not problems, "problems": problems, "notes": notes}
