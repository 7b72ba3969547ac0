"""Android devices over adb: the real `adb` client (platform-tools, or Debian's `adb`) drives them.

- Selection: ``serial`` (``adb -s``), or ``tcp="HOST:PORT"`` (``adb connect`` first), or the only
  attached device. Every adb state the client reports is an error that says what to do:
  ``offline``, ``unauthorized``, ``no permissions``, no devices, more than one device and no serial.
- Before anything is timed: ``wait-for-device``, then ``getprop sys.boot_completed`` == 1.
- Commands: ``adb shell`` with the shell protocol v2 (Android 7+), so the device command's exit code
  is adb's exit code. argv lists are quoted here, at the boundary (adb joins its arguments with
  spaces and hands them to the device's ``sh -c``). A non-zero exit is a result unless the device
  has gone (then TransportError, exit 3).
- Files: ``adb push`` to a temp name, SHA-256 on the device (toybox ``sha256sum``), then ``mv``;
  ``adb pull`` to a temp name, checked against the device's hash, then renamed.
- ``isolated_server=True`` runs a private adb server on a free port (``ANDROID_ADB_SERVER_PORT``)
  and kills only that one on close, never the user's own server. Keep it off for USB phones: two
  servers fight over USB interfaces; it is meant for Wi-Fi/TCP devices and CI.
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

from ..errors import TransportError
from ..fsutil import sha256_file
from ..inputs.targets import load_target
from .base import CommandResult, Transport

DEFAULT_WORKDIR = "/data/local/tmp/edgekit"  # writable by the shell user on every Android
ANDROID_TMP = "/data/local/tmp"
ADB_TIMEOUT_S = 30.0  # one adb housekeeping call (devices, connect, get-state)
PUSH_MIN_BYTES_PER_S = 1_000_000  # push/pull timeout = 120 s + size at 1 MB/s (slow USB 2 / Wi-Fi)
TCP_RE = re.compile(r"^[A-Za-z0-9.\-]+:\d{1,5}$|^\[[0-9a-fA-F:]+\]:\d{1,5}$")

# the device hashes the pushed temp file and renames it only when the hash matches; paths and the
# hash arrive as positional arguments, never pasted into the script
_VERIFY_AND_RENAME = (
    'command -v sha256sum >/dev/null 2>&1 || { rm -f "$1"; echo "no sha256sum on the device"; exit 3; }; '
    'h=$(sha256sum "$1") || { rm -f "$1"; exit 4; }; h=${h%% *}; '
    'if [ "$h" != "$3" ]; then rm -f "$1"; echo "sha256 $h"; exit 5; fi; mv -f "$1" "$2"'
)

# device facts in one round trip; a fixed script (no names from outside)
_FACTS_SCRIPT = r"""
for p in ro.product.model ro.product.manufacturer ro.product.device ro.board.platform ro.hardware \
         ro.soc.model ro.build.version.release ro.build.version.sdk ro.build.fingerprint ro.product.cpu.abi; do
  echo "prop|$p|$(getprop $p 2>/dev/null)"
done
for c in /sys/devices/system/cpu/cpu[0-9]*; do
  f=$c/cpufreq
  echo "cpu|${c##*/}|$(cat $f/scaling_governor 2>/dev/null)|$(cat $f/scaling_cur_freq 2>/dev/null)|$(cat $f/cpuinfo_min_freq 2>/dev/null)|$(cat $f/cpuinfo_max_freq 2>/dev/null)"
done
echo "battery_temp|$(cat /sys/class/power_supply/battery/temp 2>/dev/null)"
echo "dumpsys_battery_temp|$(dumpsys battery 2>/dev/null | grep -m1 -i 'temperature:' | tr -dc 0-9-)"
echo "taskset|$(command -v taskset 2>/dev/null)"
"""

_STATE_HINTS = {
    "offline": "the device is attached but does not answer: reconnect the cable (or `adb reconnect`), "
               "re-enable USB/Wireless debugging, and check `adb devices` shows 'device'",
    "unauthorized": "unlock the phone and accept the 'Allow USB debugging?' prompt (tick 'Always allow'); "
                    "if no prompt shows, revoke USB debugging authorizations in Developer options and replug",
    "no permissions": "this user may not open the USB device: install the Android udev rules "
                      "(Debian: apt install android-sdk-platform-tools-common) and replug",
    "recovery": "the device is in recovery: boot it into Android",
    "sideload": "the device is in sideload mode: boot it into Android",
    "bootloader": "the device is in the bootloader: boot it into Android",
    "authorizing": "the device is still authorizing this host: accept the prompt on the phone and retry",
    "connecting": "adb is still connecting: retry in a few seconds",
}


class AdbStateError(TransportError):
    """The device is in a state edgekit cannot use (``state`` is adb's word for it)."""

    def __init__(self, serial: str | None, state: str, message: str | None = None, hint: str | None = None):
        super().__init__(message or f"adb device '{serial}' is {state}",
                         hint=hint or _STATE_HINTS.get(state, "check `adb devices`"))
        self.serial = serial
        self.state = state


def find_adb(adb: str | None = None) -> str:
    """The adb client: ``adb`` argument, else $ADB, else `adb` on the PATH."""
    cand = adb or os.environ.get("ADB") or "adb"
    path = shutil.which(cand) if os.sep not in cand else (cand if os.access(cand, os.X_OK) else None)
    if not path:
        raise TransportError(f"the adb client '{cand}' was not found",
                             hint="install Android platform-tools (Debian/Ubuntu: apt install adb) "
                                  "or point $ADB / the device's adb_path at it")
    return path


def free_server_port() -> int:
    """A free TCP port for a private adb server (outside 5555-5585, which adb treats as emulators)."""
    for _ in range(20):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not 5555 <= port <= 5585 and port != 5037:
            return port
    raise TransportError("no free TCP port for a private adb server")


def parse_devices(text: str) -> dict[str, str]:
    """`adb devices` output -> {serial: state}."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("List of devices", "*", "adb server")):
            continue
        parts = line.split(None, 1)
        if len(parts) == 2:
            state = parts[1].strip()
            out[parts[0]] = "no permissions" if state.startswith("no permissions") else state.split()[0]
    return out


class AdbTransport(Transport):
    kind = "adb"

    def __init__(self, *, serial: str | None = None, tcp: str | None = None, workdir: str = DEFAULT_WORKDIR,
                 python: str = "python3", adb: str | None = None, isolated_server: bool = False,
                 pin_mask: str | None = None, boot_timeout: float = 120.0, connect: bool = True):
        if tcp and not TCP_RE.match(tcp):
            raise TransportError(f"'{tcp}' is not HOST:PORT", hint="e.g. --adb-tcp 192.168.1.23:5555")
        if pin_mask is not None and not re.fullmatch(r"(0x)?[0-9a-fA-F]+", pin_mask):
            raise TransportError(f"CPU mask '{pin_mask}' is not hexadecimal", hint="e.g. f0 for cores 4-7")
        workdir = workdir if workdir.startswith("/") else posixpath.join(ANDROID_TMP, workdir)
        super().__init__(workdir, python)
        self.adb = find_adb(adb)
        self.serial = serial or tcp
        self.tcp = tcp
        self.pin_mask = pin_mask
        self.boot_timeout = boot_timeout
        self.env = dict(os.environ)
        self._own_server_port: int | None = None
        self._connected_by_us = False
        self._closed = False
        if isolated_server:
            self._own_server_port = free_server_port()
            self.env["ANDROID_ADB_SERVER_PORT"] = str(self._own_server_port)
        if connect:
            try:
                self.open()
            except BaseException:
                self.close()
                raise

    # --- adb housekeeping --------------------------------------------------------------------------
    def _adb(self, *args: str, timeout: float = ADB_TIMEOUT_S, serial: bool = True) -> subprocess.CompletedProcess:
        argv = [self.adb, *(["-s", self.serial] if serial and self.serial else []), *args]
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=self.env,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise TransportError(f"`adb {' '.join(args[:2])}` did not answer within {timeout:.0f} s "
                                 f"(device {self.serial or '?'})",
                                 hint="check `adb devices`; a hung adb server is fixed by `adb kill-server`") from exc
        except OSError as exc:
            raise TransportError(f"cannot run {self.adb}: {exc}") from exc

    def devices(self) -> dict[str, str]:
        res = self._adb("devices", serial=False)
        if res.returncode != 0:
            raise TransportError(f"`adb devices` failed: {(res.stderr or res.stdout).strip()[-300:]}")
        return parse_devices(res.stdout)

    def open(self) -> None:
        """Connect (TCP), select the device, wait for it and for the end of boot; make the workdir."""
        if self._own_server_port is not None:
            res = self._adb("start-server", serial=False)
            if res.returncode != 0:
                raise TransportError(f"cannot start a private adb server on port {self._own_server_port}: "
                                     f"{(res.stderr or res.stdout).strip()[-300:]}")
        if self.tcp:
            self._connect_tcp()
        self._select()
        self.wait_ready()
        self._check_features()
        res = self.run(["mkdir", "-p", self.workdir], timeout=ADB_TIMEOUT_S, cwd="/")
        if not res.ok:
            raise TransportError(f"cannot create {self.workdir} on {self.serial}: {res.stderr.strip()[-300:]}",
                                 hint=f"pick a writable folder (under {ANDROID_TMP}) as the device's workdir")

    def _connect_tcp(self) -> None:
        before = self.devices().get(self.tcp)
        res = self._adb("connect", self.tcp, serial=False, timeout=ADB_TIMEOUT_S)
        text = (res.stdout + res.stderr).strip()
        if "unable to connect" in text or "failed to connect" in text or "cannot connect" in text \
                or res.returncode != 0:
            state = self.devices().get(self.tcp)
            if state and state != "device":
                raise AdbStateError(self.tcp, state, f"adb device '{self.tcp}' is {state} "
                                    f"(`adb connect`: {text[-200:]})")
            raise TransportError(f"cannot connect to the adb device at {self.tcp}: {text[-300:]}",
                                 hint="is Wireless debugging (or `adb tcpip 5555`) on, and is the phone on the "
                                      "same network? Android 11+ pairs first: `adb pair HOST:PAIRPORT`")
        if "failed to authenticate" in text:
            raise AdbStateError(self.tcp, "unauthorized", f"adb device '{self.tcp}' is unauthorized ({text})")
        self._connected_by_us = before is None

    def _select(self) -> None:
        devs = self.devices()
        if self.serial is None:
            if not devs:
                raise TransportError("no adb devices are attached",
                                     hint="plug the phone in with USB debugging on (Developer options), or give "
                                          "--adb-tcp HOST:PORT for a phone on Wi-Fi; check with `adb devices`")
            if len(devs) > 1:
                listing = ", ".join(f"{s} ({st})" for s, st in sorted(devs.items()))
                raise TransportError(f"more than one adb device is attached: {listing}",
                                     hint="name one with its serial: `edgekit devices add NAME --target T "
                                          "--adb SERIAL`")
            self.serial = next(iter(devs))
        state = devs.get(self.serial)
        if state is None:
            listing = ", ".join(f"{s} ({st})" for s, st in sorted(devs.items())) or "none"
            raise AdbStateError(self.serial, "not found", f"adb device '{self.serial}' is not attached "
                                f"(attached: {listing})",
                                hint="check the serial with `adb devices`; for a Wi-Fi phone use --adb-tcp HOST:PORT")
        if state != "device":
            raise AdbStateError(self.serial, state)

    def state(self) -> str:
        """adb's word for the device now: device, offline, unauthorized, ... or 'not found'."""
        try:
            return self.devices().get(self.serial or "", "not found")
        except TransportError:
            return "unknown (adb server not answering)"

    def wait_ready(self) -> None:
        res = self._adb("wait-for-device", timeout=self.boot_timeout)
        if res.returncode != 0:
            raise AdbStateError(self.serial, self.state(), f"adb device '{self.serial}' did not come online: "
                                f"{(res.stderr or res.stdout).strip()[-300:]}")
        deadline = time.monotonic() + self.boot_timeout
        value = ""
        while True:
            res = self.run(["getprop", "sys.boot_completed"], timeout=ADB_TIMEOUT_S, cwd="/")
            value = res.stdout.strip()
            if res.ok and value == "1":
                return
            if time.monotonic() > deadline:
                raise TransportError(f"adb device '{self.serial}' has not finished booting after "
                                     f"{self.boot_timeout:.0f} s (sys.boot_completed={value!r})",
                                     hint="wait for the phone to finish booting, then retry")
            time.sleep(1.0)

    def _check_features(self) -> None:
        res = self._adb("features")
        feats = set(res.stdout.split()) if res.returncode == 0 else set()
        if "shell_v2" not in feats:
            raise TransportError(f"adb device '{self.serial}' has no shell protocol v2 (features: "
                                 f"{' '.join(sorted(feats)) or 'none'}), so exit codes would be lost",
                                 hint="edgekit needs Android 7.0 or later")

    # --- the Transport contract --------------------------------------------------------------------
    def _remote_command(self, argv: list[str], cwd: str | None) -> str:
        prefix: list[str] = []
        if self.pin_mask and argv and argv[0] == self.python:
            prefix = ["taskset", self.pin_mask]  # the agent's process (and its threads) on the big cores
        cmd = " ".join(shlex.quote(a) for a in [*prefix, *argv])
        return f"cd {shlex.quote(self.remote_path(cwd) if cwd else self.workdir)} && {cmd}"

    def run(self, argv: list[str], *, timeout: float, cwd: str | None = None) -> CommandResult:
        if not argv:
            raise TransportError("empty command")
        start = time.perf_counter()
        full = [self.adb, "-s", self.serial or "", "shell", self._remote_command(argv, cwd)]
        try:
            proc = subprocess.run(full, capture_output=True, timeout=timeout, env=self.env, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            # killing the client closes the stream; adbd then hangs up the device process
            raise TransportError(f"command timed out after {timeout:.0f} s on adb device '{self.serial}': "
                                 f"{argv[0]} ...", hint="raise the timeout or lower runs/min_seconds") from exc
        except OSError as exc:
            raise TransportError(f"cannot run {self.adb}: {exc}") from exc
        out = proc.stdout.decode("utf-8", "replace")
        err = proc.stderr.decode("utf-8", "replace")
        if proc.returncode != 0:
            state = self.state()
            if state != "device":  # adb's own failure, not the command's
                raise AdbStateError(self.serial, state, f"adb device '{self.serial}' went {state} while running "
                                    f"{argv[0]}: {err.strip()[-300:]}")
        return CommandResult(tuple(argv), proc.returncode, out, err, time.perf_counter() - start)

    def push(self, local: Path, remote: str) -> None:
        local = Path(local)
        if local.is_dir():
            for f in sorted(p for p in local.rglob("*") if p.is_file()):
                self.push(f, posixpath.join(remote, f.relative_to(local).as_posix()))
            return
        dest = self.remote_path(remote)
        tmp = posixpath.join(posixpath.dirname(dest), f".{posixpath.basename(dest)}.partial-{uuid.uuid4().hex[:8]}")
        size = local.stat().st_size
        digest = sha256_file(local)
        res = self._adb("push", str(local), tmp, timeout=120.0 + size / PUSH_MIN_BYTES_PER_S)
        if res.returncode != 0:
            state = self.state()
            msg = (res.stderr or res.stdout).strip().splitlines()
            first = msg[0] if msg else "no message"
            # adb reconnects TCP devices by itself, so the state may read 'device' again already
            link = state != "device" or re.search(r"couldn't read|connection|closed|offline|not found", first)
            if state == "device":
                self._quiet_rm(tmp)
            raise AdbStateError(self.serial, state, f"pushing {local.name} to adb device '{self.serial}' failed "
                                f"({first}); the device is now {state}",
                                hint="the link to the device broke: check the cable or the Wi-Fi link and retry; "
                                     "nothing was left under the final name on the device" if link else
                                     f"check free space on the device (`adb shell df {ANDROID_TMP}`)")
        check = self.run(["sh", "-c", _VERIFY_AND_RENAME, "edgekit-push", tmp, dest, digest],
                         timeout=60.0 + size / 50e6, cwd="/")
        if check.returncode == 5:
            raise TransportError(f"{local.name} arrived corrupted on adb device '{self.serial}' "
                                 f"({check.stdout.strip()[:20]}... != {digest[:12]}...)",
                                 hint="the link or the device's storage corrupts data; retry")
        if not check.ok:
            raise TransportError(f"cannot verify/rename {dest} on adb device '{self.serial}': "
                                 f"{(check.stdout + check.stderr).strip()[-300:]}")
        self.bytes_sent += size

    def pull(self, remote: str, local: Path) -> None:
        src = self.remote_path(remote)
        local = Path(local)
        tmp = local.with_name(f".{local.name}.partial-{uuid.uuid4().hex[:8]}")
        try:
            res = self._adb("pull", src, str(tmp), timeout=600.0)
            if res.returncode != 0:
                state = self.state()
                raise AdbStateError(self.serial, state, f"pulling {src} from adb device '{self.serial}' failed: "
                                    f"{(res.stderr or res.stdout).strip()[-300:]}",
                                    hint="the file is missing on the device" if state == "device" else None)
            h = self.run(["sha256sum", src], timeout=120.0, cwd="/")
            want = h.stdout.split()[0] if h.ok and h.stdout.split() else None
            if want is None:
                raise TransportError(f"cannot hash {src} on adb device '{self.serial}': {h.stderr.strip()[-200:]}")
            got = sha256_file(tmp)
            if got != want:
                raise TransportError(f"{src} arrived corrupted from adb device '{self.serial}' "
                                     f"({got[:12]}... != {want[:12]}...)", hint="retry; check the cable")
            os.replace(tmp, local)
        finally:
            tmp.unlink(missing_ok=True)

    def _quiet_rm(self, path: str) -> None:
        try:
            self.run(["rm", "-f", path], timeout=ADB_TIMEOUT_S, cwd="/")
        except TransportError:
            pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._own_server_port is not None:
            # only our private server: the user's own adb server (5037 or theirs) is never touched
            try:
                self._adb("kill-server", serial=False, timeout=10)
            except TransportError:
                pass
        elif self._connected_by_us and self.tcp:
            try:
                self._adb("disconnect", self.tcp, serial=False, timeout=10)
            except TransportError:
                pass

    def describe(self) -> str:
        return f"adb:{self.serial}:{self.workdir}"

    # --- Android facts for the report -----------------------------------------------------------
    def device_facts(self) -> dict:
        """Model, SoC, Android version, per-core governor/frequencies, battery temperature, pinning.
        Anything the device does not expose is null, with the reason in ``unavailable``."""
        res = self.run(["sh", "-c", _FACTS_SCRIPT], timeout=ADB_TIMEOUT_S, cwd="/")
        return parse_facts(res.stdout, pin_mask=self.pin_mask)


def parse_facts(text: str, pin_mask: str | None = None) -> dict:
    props: dict[str, str] = {}
    cores = []
    battery_raw = dumpsys_raw = taskset = ""
    for line in text.splitlines():
        parts = line.split("|")
        if parts[0] == "prop" and len(parts) >= 3:
            props[parts[1]] = "|".join(parts[2:]).strip()
        elif parts[0] == "cpu" and len(parts) == 6:
            def khz(v):
                return int(v) / 1000.0 if v.strip().isdigit() else None
            cores.append({"cpu": parts[1], "governor": parts[2].strip() or None, "cur_mhz": khz(parts[3]),
                          "min_mhz": khz(parts[4]), "max_mhz": khz(parts[5])})
        elif parts[0] == "battery_temp" and len(parts) == 2:
            battery_raw = parts[1].strip()
        elif parts[0] == "dumpsys_battery_temp" and len(parts) == 2:
            dumpsys_raw = parts[1].strip()
        elif parts[0] == "taskset" and len(parts) == 2:
            taskset = parts[1].strip()
    unavailable: dict[str, str] = {}
    battery_c, battery_src = None, None
    for raw, src in ((battery_raw, "/sys/class/power_supply/battery/temp"), (dumpsys_raw, "dumpsys battery")):
        if re.fullmatch(r"-?\d+", raw or ""):
            battery_c, battery_src = int(raw) / 10.0, src  # Android reports tenths of a degree C
            break
    if battery_c is None:
        unavailable["battery_temperature_c"] = "no /sys/class/power_supply/battery/temp and no `dumpsys battery`"
    if not cores or not any(c["governor"] for c in cores):
        unavailable["governor"] = "no readable cpufreq (/sys/devices/system/cpu/cpu*/cpufreq)"
    maxes = sorted({c["max_mhz"] for c in cores if c["max_mhz"]})
    facts = {
        "model": props.get("ro.product.model") or None,
        "manufacturer": props.get("ro.product.manufacturer") or None,
        "soc": props.get("ro.soc.model") or props.get("ro.board.platform") or props.get("ro.hardware") or None,
        "board_platform": props.get("ro.board.platform") or None,
        "android_version": props.get("ro.build.version.release") or None,
        "android_sdk": int(props["ro.build.version.sdk"]) if props.get("ro.build.version.sdk", "").isdigit() else None,
        "build_fingerprint": props.get("ro.build.fingerprint") or None,
        "abi": props.get("ro.product.cpu.abi") or None,
        "governors": sorted({c["governor"] for c in cores if c["governor"]}) or None,
        "cpu_frequencies_mhz": cores or None,
        "cluster_max_mhz": maxes or None,
        "battery_temperature_c": battery_c,
        "battery_temperature_source": battery_src,
        "pinned_cores_mask": pin_mask,
    }
    if pin_mask and not taskset:
        unavailable["pinned_cores_mask"] = "taskset is not on the device's PATH"
    if unavailable:
        facts["unavailable"] = unavailable
    return facts


def transport_for_device(entry, python: str) -> AdbTransport:
    """The inventory's adb device -> a connected AdbTransport (devices.py holds the lock)."""
    mask = None
    if getattr(entry, "pin_big_cores", False):
        mask = load_target(entry.target).big_cores_mask
        if not mask:
            raise TransportError(f"device '{entry.name}' asks for big-core pinning, and target '{entry.target}' "
                                 "has no big_cores_mask", hint="add big_cores_mask to the target file")
    workdir = entry.workdir if entry.workdir not in (None, ".edgekit") else DEFAULT_WORKDIR
    return AdbTransport(serial=getattr(entry, "serial", None), tcp=getattr(entry, "adb_tcp", None),
                        workdir=workdir, python=python, adb=getattr(entry, "adb_path", None),
                        isolated_server=bool(getattr(entry, "adb_isolated_server", False)), pin_mask=mask)
