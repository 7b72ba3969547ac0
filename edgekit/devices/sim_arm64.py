"""An arm64 Raspberry Pi OS twin: Debian bookworm arm64 (what Raspberry Pi OS 64-bit is built on,
Python 3.11) run under qemu user emulation, so the rpi4 path runs on its own software: aarch64
wheels, the Debian Python, the Debian OpenSSH.

- **rootfs** (built once, cached): ``debootstrap --arch=arm64 --variant=minbase --include=python3,
  openssh-server bookworm`` into ``$EDGEKIT_ROOTFS_CACHE`` (else ``$EDGEKIT_HOME/cache/rootfs``, else
  ``$XDG_CACHE_HOME/edgekit/rootfs``). The build runs in a temporary folder that is renamed into
  place after a smoke check, so a crashed build is never reused. ``sim down --purge`` deletes it.
- **a twin**: the cached rootfs is the read-only lower layer of an overlay whose upper layer is the
  twin's own folder (``$EDGEKIT_HOME/sim/NAME/upper``): its keys, its provisioned wheels, a fake
  ``/sys/devices/system/cpu`` and ``/proc/cpuinfo`` of the board's cores (onnxruntime segfaults under qemu
  when it reads the host's /sys; OpenVINO's CPU plugin needs the cores' MIDR_EL1 and topology). The
  overlay, /proc and /dev are mounted inside a private mount namespace made for the twin's sshd
  (``unshare --mount``): they vanish with its processes, so a crash leaves no mount on the host.
- sshd runs chrooted, inside its own network namespace (no route out: the twin cannot reach any
  network), in the CPU/memory cgroups of `sim up`, every aarch64 binary executed by the kernel's
  binfmt_misc handler ``qemu-aarch64`` (registered with the F flag, so the chroot needs no qemu).
- runtimes: edgekit downloads the aarch64 wheels on the host (the target's ``wheels:`` section) and
  installs them over SSH (edgekit/devices/provision.py): the twin never reaches an index.

Timing on an emulated CPU is meaningless as a figure for real hardware (qemu is ~8x slower for Python
and up to ~500x for vectorised numpy); the inventory entry says ``emulated: true`` and deploy reports
mark the device and warn. Accuracy, parity and the whole deploy path are real.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BadInputError, DeviceError
from ..fsutil import atomic_write_text
from ..inputs.targets import TargetSpec
from ..paths import cache_dir, sim_root
from ..sim import cgroup as _cg
from ..sim import netns as _netns
from ..sim.procs import kill_tree
from ..sim.sshd import keygen
from ..sim.state import SimState, load_states
from ..sim.state import state_file as _state_file
from .inventory import DeviceEntry, add_device, transport_for
from .provision import ensure_wheelhouse, provision
from .sim_device import check_new_sim, create_netns

SUITE = "bookworm"
DEB_ARCH = "arm64"
PACKAGES = ("python3", "openssh-server")
ROOTFS_VERSION = 1  # bump when the build steps change: a new folder name, the old one is never trusted
DEFAULT_MIRROR = "http://deb.debian.org/debian"
BUILD_TIMEOUT_S = 1800
READY_TIMEOUT_S = 90.0  # sshd's start under emulation (key loading, privsep) takes seconds
APT_PACKAGES = "qemu-user-static binfmt-support debootstrap"
BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")
STAMP = ".edgekit-rootfs.json"
TWIN_USER = "root"
TWIN_PYTHON = "/usr/bin/python3"
TWIN_WORKDIR = ".edgekit"  # under /root in the twin
# The CPU qemu emulates, per target. The Pi 4's Cortex-A72 (ARMv8.0-A) makes the runtimes pick the
# kernels a Pi 4 runs; qemu's default `max` CPU advertises SVE2/I8MM/dot-product, and with it (qemu
# 7.2) LiteRT's XNNPACK int8 kernels returned wrong results (digits int8: 9.7% instead of 99.4%).
QEMU_CPUS = {"rpi4": "cortex-a72", "rpi5": "cortex-a76"}  # the boards' cores (ISA features differ: v8.0 / v8.2)
DEFAULT_QEMU_CPU = "cortex-a72"
# What the twin's fake /proc/cpuinfo and sysfs say about each core: (MIDR_EL1, the kernel's Features line), as
# on the boards (the Pi 4's BCM2711 has no crypto extensions). OpenVINO's CPU plugin reads MIDR_EL1 from sysfs
# and the cores' topology through hwloc (it segfaults without them); onnxruntime's cpuinfo reads the same files.
CPU_IDS = {
    "cortex-a72": (0x410FD083, "fp asimd evtstrm crc32 cpuid"),
    "cortex-a76": (0x414FD0B1, ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm "
                                "lrcpc dcpop asimddp")),
}

# Runs inside `ip netns exec NS unshare --mount --propagation private`: every mount below lives in
# that private mount namespace only. Paths arrive as positional arguments, never inside the string.
_LAUNCH_SH = r"""set -eu
root=$1; lower=$2; upper=$3; work=$4; cfg=$5; name=$6
printf '%s\n' "$name" > /proc/sys/kernel/hostname
mount -t overlay edgekit-twin -o "lowerdir=$lower,upperdir=$upper,workdir=$work" "$root"
mount -t proc proc "$root/proc"
# the board's /proc/cpuinfo, not this host's (qemu-user passes the host's through)
[ -f "$root/etc/edgekit-sim/$name/cpuinfo" ] && mount --bind "$root/etc/edgekit-sim/$name/cpuinfo" "$root/proc/cpuinfo"
mount --rbind /dev "$root/dev"
exec chroot "$root" /usr/sbin/sshd -D -e -f "$cfg"
"""

Say = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


# --------------------------------------------------------------------------- host requirements
def rootfs_cache_root() -> Path:
    env = os.environ.get("EDGEKIT_ROOTFS_CACHE")
    if env:
        return Path(env)

    return cache_dir("rootfs")


def rootfs_dir() -> Path:
    return rootfs_cache_root() / f"debian-{SUITE}-{DEB_ARCH}-v{ROOTFS_VERSION}"


def _need_tool(name: str, package: str) -> str:
    exe = shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/sbin/{name}") if os.path.exists(p)), None)
    if not exe:
        raise DeviceError(f"the arm64 twin needs `{name}`, which is not installed",
                          hint=f"apt-get install -y --no-install-recommends {package}")
    return exe


def qemu_binfmt() -> Path | None:
    """The kernel's binfmt_misc entry that runs aarch64 ELF files through qemu, if enabled."""
    entry = BINFMT_DIR / "qemu-aarch64"
    try:
        return entry if entry.read_text().splitlines()[0].strip() == "enabled" else None
    except (OSError, IndexError):
        return None


def ensure_host() -> dict[str, str | None]:
    """Check root and the tools, and register qemu-aarch64 with binfmt_misc when it is not
    (mounting binfmt_misc first where the machine has not). Returns what was found."""
    if os.geteuid() != 0:
        raise DeviceError("the arm64 twin needs root (chroot, mount and network namespaces)",
                          hint="run `edgekit sim up NAME --arch arm64` as root (e.g. in the CI container)")
    if platform.machine() not in ("x86_64", "aarch64"):
        raise DeviceError(f"the arm64 twin is not supported on a {platform.machine()} host")
    for tool, pkg in (("debootstrap", "debootstrap"), ("unshare", "util-linux"), ("chroot", "coreutils"),
                      ("ip", "iproute2"), ("ssh-keygen", "openssh-client")):
        _need_tool(tool, pkg)
    if platform.machine() == "aarch64":
        return {"emulator": None, "note": "native aarch64 host: no emulation"}
    qemu = _need_tool("qemu-aarch64-static", "qemu-user-static")
    if qemu_binfmt() is None:
        if not (BINFMT_DIR / "register").exists():
            r = subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT_DIR)],
                               capture_output=True, text=True, timeout=30)
            if r.returncode != 0:
                raise DeviceError(f"cannot mount binfmt_misc: {r.stderr.strip()}",
                                  hint="the kernel needs binfmt_misc; in a container run it --privileged")
        exe = _need_tool("update-binfmts", "binfmt-support")
        r = subprocess.run([exe, "--enable", "qemu-aarch64"], capture_output=True, text=True, timeout=60)
        if qemu_binfmt() is None:
            raise DeviceError(f"cannot enable the qemu-aarch64 binfmt handler: {(r.stderr or r.stdout).strip()}",
                              hint=f"apt-get install -y {APT_PACKAGES}; then update-binfmts --enable qemu-aarch64")
    flags = ""
    for line in (BINFMT_DIR / "qemu-aarch64").read_text().splitlines():
        if line.startswith("flags:"):
            flags = line.split(":", 1)[1].strip()
    if "F" not in flags:
        raise DeviceError(f"the qemu-aarch64 binfmt handler lacks the F (fix binary) flag (flags: {flags or 'none'})",
                          hint="use Debian's qemu-user-static, which registers it with F, so a chroot needs no "
                               "qemu binary inside")
    ver = subprocess.run([qemu, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()
    return {"emulator": ver[0].strip() if ver else "qemu-aarch64", "binfmt_flags": flags}


# --------------------------------------------------------------------------- the cached rootfs
@dataclass
class Rootfs:
    path: Path
    built: bool  # False: the cached one was reused
    seconds: float
    info: dict[str, object] = field(default_factory=dict)


def _check_path_chars(p: Path) -> None:
    # the overlay mount options are comma- and colon-separated lists
    if any(c in str(p) for c in ",:\n"):
        raise BadInputError(f"path {p} contains ',' or ':', which an overlay mount cannot take",
                            hint="set EDGEKIT_HOME / EDGEKIT_ROOTFS_CACHE to a plain path")


def _chroot_python(root: Path, code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["chroot", str(root), TWIN_PYTHON, "-c", code], capture_output=True, text=True,
                          timeout=timeout)


def ensure_rootfs(say: Say = _quiet, *, mirror: str | None = None) -> Rootfs:
    """The cached rootfs, built first if there is none (under a lock: two `sim up` build it once)."""
    final = rootfs_dir()
    _check_path_chars(final)
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(root / ".build.lock", "w") as lockf:
        fcntl.flock(lockf, fcntl.LOCK_EX)
        stamp = final / STAMP
        if stamp.is_file():
            return Rootfs(final, False, time.perf_counter() - started, json.loads(stamp.read_text()))
        for old in root.glob(f".{final.name}.building-*"):  # a crashed build: never trusted
            shutil.rmtree(old, ignore_errors=True)
        if final.exists():  # no stamp: unfinished
            shutil.rmtree(final)
        tmp = root / f".{final.name}.building-{os.getpid()}"
        # debootstrap's second stage runs arm64 binaries in the chroot: the qemu binfmt handler first (a fresh
        # machine has none registered until something asks; CI's prewarm builds this before any twin starts)
        ensure_host()
        mirror = mirror or os.environ.get("EDGEKIT_DEBIAN_MIRROR") or DEFAULT_MIRROR
        say(f"building the arm64 rootfs (debootstrap {SUITE} {DEB_ARCH} + {', '.join(PACKAGES)}; "
            f"once, cached in {final})")
        # its own mount namespace: the /proc and /sys debootstrap mounts cannot outlive it
        argv = ["unshare", "--mount", "--propagation", "private", "--",
                _need_tool("debootstrap", "debootstrap"), f"--arch={DEB_ARCH}", "--variant=minbase",
                f"--include={','.join(PACKAGES)}", SUITE, str(tmp), mirror]
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            if r.returncode != 0:
                log = (tmp / "debootstrap" / "debootstrap.log")
                tail = log.read_text(errors="replace")[-1500:] if log.is_file() else (r.stderr or r.stdout)[-1500:]
                raise DeviceError(f"debootstrap of the arm64 rootfs failed (exit {r.returncode}): {tail.strip()}",
                                  hint=f"it needs the Debian mirror ({mirror}; EDGEKIT_DEBIAN_MIRROR changes it) "
                                       f"and the qemu-aarch64 binfmt handler")
            info = _finish_rootfs(tmp)
            info.update({"suite": SUITE, "arch": DEB_ARCH, "packages": list(PACKAGES), "mirror": mirror,
                         "version": ROOTFS_VERSION, "build_seconds": round(time.perf_counter() - started, 1)})
            (tmp / STAMP).write_text(json.dumps(info, indent=2))
            os.rename(tmp, final)
        except subprocess.TimeoutExpired as exc:
            raise DeviceError(f"building the arm64 rootfs took over {BUILD_TIMEOUT_S} s") from exc
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return Rootfs(final, True, time.perf_counter() - started, info)


def _finish_rootfs(root: Path) -> dict[str, object]:
    """Trim the fresh rootfs, and check that it runs: aarch64, Python 3.11."""
    for p in (root / "etc" / "ssh").glob("ssh_host_*"):
        p.unlink()  # each twin gets its own host key in its upper layer
    for p in (root / "var" / "cache" / "apt" / "archives").glob("*.deb"):
        p.unlink()
    (root / "run" / "sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation folder
    r = _chroot_python(root, "import json, platform; print(json.dumps([platform.machine(), platform.python_version()]))")
    if r.returncode != 0:
        raise DeviceError(f"the new arm64 rootfs does not run python3: {r.stderr.strip()[-600:]}",
                          hint="is the qemu-aarch64 binfmt handler enabled? (update-binfmts --display qemu-aarch64)")
    machine, pyver = json.loads(r.stdout.strip().splitlines()[-1])
    if machine != "aarch64" or not pyver.startswith("3.11."):
        raise DeviceError(f"the new rootfs reports {machine}, Python {pyver}; expected aarch64, Python 3.11")
    return {"machine": machine, "python": pyver}


def purge_rootfs(say: Say = _quiet) -> list[Path]:
    """Delete the cached rootfs (refused while a twin runs on it)."""

    users = [s.name for s in load_states() if getattr(s, "arch", None) == "arm64"]
    if users:
        raise BadInputError(f"the arm64 rootfs is in use by {', '.join(users)}",
                            hint="`edgekit sim down` those twins first")
    root = rootfs_cache_root()
    gone = []
    if root.is_dir():
        with open(root / ".build.lock", "w") as lockf:
            fcntl.flock(lockf, fcntl.LOCK_EX)
            for p in sorted(root.glob(f"*debian-{SUITE}-{DEB_ARCH}-v*")):
                shutil.rmtree(p)
                gone.append(p)
                say(f"deleted {p}")
    return gone


# --------------------------------------------------------------------------- one twin
@dataclass
class Twin:
    dir: Path  # $EDGEKIT_HOME/sim/NAME
    name: str
    host: str
    port: int
    sshd_config: str  # its path inside the twin (also the mark that identifies our sshd's PID)
    client_key: Path
    host_key: Path
    qemu_cpu: str = DEFAULT_QEMU_CPU
    pid: int | None = None

    @property
    def upper(self) -> Path:
        return self.dir / "upper"

    @property
    def merged(self) -> Path:
        return self.dir / "root"

    @property
    def work(self) -> Path:
        return self.dir / "work"

    def write_known_hosts(self, path: Path) -> Path:
        line = " ".join(Path(f"{self.host_key}.pub").read_text().split()[:2])
        name = self.host if self.port == 22 else f"[{self.host}]:{self.port}"
        path.write_text(f"{name} {line}\n", encoding="utf-8")
        return path


def fake_cpuinfo(n: int, qemu_cpu: str) -> str:
    """/proc/cpuinfo of ``n`` cores of ``qemu_cpu`` as an arm64 kernel writes it."""
    midr, features = CPU_IDS.get(qemu_cpu, CPU_IDS[DEFAULT_QEMU_CPU])
    return "".join(
        f"processor\t: {i}\nBogoMIPS\t: 108.00\nFeatures\t: {features}\nCPU implementer\t: {midr >> 24:#x}\n"
        f"CPU architecture: 8\nCPU variant\t: {(midr >> 20) & 0xF:#x}\nCPU part\t: {(midr >> 4) & 0xFFF:#05x}\n"
        f"CPU revision\t: {midr & 0xF}\n\n" for i in range(n))


def fake_cpu_topology(root: Path, n: int, qemu_cpu: str) -> None:
    """``n`` cores of ``qemu_cpu`` in ``root``/sys: one package, one NUMA node, one thread per core, each with
    its MIDR_EL1, its topology (lists and masks: hwloc reads the masks), its L1 data cache and its maximum
    frequency (2.4 GHz, the Pi 5's; nothing here times by it)."""
    midr, _ = CPU_IDS.get(qemu_cpu, CPU_IDS[DEFAULT_QEMU_CPU])
    every = f"0-{n - 1}" if n > 1 else "0"
    mask = f"{(1 << n) - 1:x}"
    cpu = root / "sys" / "devices" / "system" / "cpu"
    cpu.mkdir(parents=True, exist_ok=True)
    for f in ("possible", "present", "online"):
        (cpu / f).write_text(f"{every}\n")
    bus = root / "sys" / "bus" / "cpu" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    files: dict[str, Callable[[int], str]] = {"regs/identification/midr_el1": lambda i: f"{midr:#018x}",
             "topology/core_id": str, "topology/physical_package_id": lambda i: "0",
             "topology/core_cpus_list": str, "topology/thread_siblings_list": str,
             "topology/core_cpus": lambda i: f"{1 << i:x}", "topology/thread_siblings": lambda i: f"{1 << i:x}",
             "topology/package_cpus_list": lambda i: every, "topology/core_siblings_list": lambda i: every,
             "topology/package_cpus": lambda i: mask, "topology/core_siblings": lambda i: mask,
             "cache/index0/level": lambda i: "1", "cache/index0/type": lambda i: "Data",
             "cache/index0/size": lambda i: "64K", "cache/index0/shared_cpu_list": str,
             "cpufreq/cpuinfo_max_freq": lambda i: "2400000"}
    for i in range(n):
        for rel, value in files.items():
            path = cpu / f"cpu{i}" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{value(i)}\n")
        link = bus / f"cpu{i}"
        if not link.is_symlink():
            link.symlink_to(f"../../../devices/system/cpu/cpu{i}")
    node = root / "sys" / "devices" / "system" / "node" / "node0"
    node.mkdir(parents=True, exist_ok=True)
    (node / "cpulist").write_text(f"{every}\n")


def prepare_twin(d: Path, name: str, host: str, port: int = 22, cores: int | None = None,
                 qemu_cpu: str = DEFAULT_QEMU_CPU) -> Twin:
    """The twin's own layer: host key, authorized client key, sshd_config, fake cpu topology,
    machine-id. Written into the (not yet mounted) overlay upper folder."""

    _check_path_chars(d)
    for sub in ("upper", "work", "root"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    up = d / "upper"
    etc_rel = f"etc/edgekit-sim/{name}"
    etc = up / etc_rel
    etc.mkdir(parents=True, exist_ok=True)
    os.chmod(etc, 0o700)
    keygen(etc / "host_ed25519")  # the twin's host key, read by its sshd
    ck = keygen(d / "client_ed25519")  # the client key stays on the host
    shutil.copyfile(f"{ck}.pub", etc / "authorized_keys")
    cfg = f"/{etc_rel}/sshd_config"
    lines = [
        f"Port {port}",
        f"ListenAddress {host}",
        f"HostKey /{etc_rel}/host_ed25519",
        f"AuthorizedKeysFile /{etc_rel}/authorized_keys",
        f"PidFile /{etc_rel}/sshd.pid",
        "UsePAM no",
        "StrictModes no",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes",
        "PermitRootLogin prohibit-password",
        "Subsystem sftp internal-sftp",
        "LogLevel ERROR",
        "MaxStartups 50:30:100",
        "MaxSessions 50",
        "UseDNS no",
        f"SetEnv QEMU_CPU={qemu_cpu}",  # every session's processes are emulated as the same CPU
    ]
    (etc / "sshd_config").write_text("\n".join(lines) + "\n", encoding="utf-8")
    # A small fake cpu topology instead of the host's /sys (onnxruntime's cpuinfo segfaults under qemu when it
    # finds the host's full sysfs), and the board's /proc/cpuinfo (bound over /proc/cpuinfo at launch)
    n = max(1, cores or os.cpu_count() or 1)
    fake_cpu_topology(up, n, qemu_cpu)
    (etc / "cpuinfo").write_text(fake_cpuinfo(n, qemu_cpu))
    (up / "etc" / "machine-id").write_text(os.urandom(16).hex() + "\n")
    (up / "etc" / "hostname").write_text(f"{name}\n")
    return Twin(dir=d, name=name, host=host, port=port, sshd_config=cfg, client_key=ck,
                host_key=etc / "host_ed25519", qemu_cpu=qemu_cpu)


def start_twin(twin: Twin, rootfs: Path, *, netns: str, preexec: Callable[[], None] | None = None,
               ready_timeout: float = READY_TIMEOUT_S) -> Twin:
    """Start the twin's sshd (detached: it outlives this process) and wait for its SSH banner."""
    argv = ["ip", "netns", "exec", netns, "unshare", "--mount", "--uts", "--propagation", "private", "--",
            "/bin/sh", "-c", _LAUNCH_SH, "edgekit-twin",
            str(twin.merged), str(rootfs), str(twin.upper), str(twin.work), twin.sshd_config, twin.name]
    # a small environment: QEMU_CPU reaches sshd's qemu (sshd_config's SetEnv carries it to sessions)
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
           "QEMU_CPU": twin.qemu_cpu}
    log = open(twin.dir / "sshd.log", "ab")
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                preexec_fn=preexec, close_fds=True, env=env)
    finally:
        log.close()
    twin.pid = proc.pid
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (twin.dir / "sshd.log").read_text(errors="replace")[-800:]
            raise DeviceError(f"the arm64 twin's sshd exited at start (code {proc.returncode}): {tail.strip()}",
                              hint="see `update-binfmts --display qemu-aarch64`; the twin needs root and overlayfs")
        try:
            with socket.create_connection((twin.host, twin.port), timeout=1.0) as c:
                c.settimeout(5.0)
                if c.recv(64).startswith(b"SSH-"):
                    return twin
        except OSError:
            time.sleep(0.2)

    kill_tree(proc.pid)
    raise DeviceError(f"the arm64 twin's sshd did not answer on {twin.host}:{twin.port} within "
                      f"{ready_timeout:.0f} s (log: {twin.dir / 'sshd.log'})")


# --------------------------------------------------------------------------- sim up --arch arm64
@dataclass
class TwinTimings:
    rootfs_seconds: float
    rootfs_built: bool
    start_seconds: float
    provision_seconds: float | None = None
    wheels_downloaded: bool = False


def up(name: str, *, target: str = "rpi4", cpu_quota: float | None = None, memory: str | None = None,
       provision: bool = True, wheelhouse: Path | None = None, say: Say = _quiet,
       runtimes: Sequence[str] = ()) -> tuple[SimState, DeviceEntry, TwinTimings]:
    """Build (once) and start an arm64 twin, register it as a ``target`` device (emulated), and
    install the target's runtimes on it from a host-side wheelhouse (plus the extra wheels of the
    named ``runtimes``, e.g. executorch). Returns (state, entry, timings)."""

    spec, mem_bytes = check_new_sim(name, target, cpu_quota, memory)
    if spec.arch not in ("aarch64", "arm64"):
        raise BadInputError(f"target '{spec.name}' is {spec.arch}; an arm64 twin stands in for an aarch64 target",
                            hint="e.g. --target rpi4")
    host = ensure_host()
    rootfs = ensure_rootfs(say)
    say(f"arm64 rootfs: {'built' if rootfs.built else 'cached'} in {rootfs.seconds:.1f} s ({rootfs.path})")
    d = sim_root() / name
    if d.exists():
        shutil.rmtree(d)  # leftovers of a crashed `sim up` with no state: nothing runs from them
    d.mkdir(parents=True)
    t0 = time.perf_counter()
    made_ns = None
    cgs = None
    twin: Twin | None = None
    try:
        index, made_ns = create_netns()
        cgs = _cg.create(f"edgekit-sim-{name}", cpu_quota=cpu_quota, memory_bytes=mem_bytes) \
            if (cpu_quota is not None or mem_bytes is not None) else None
        qemu_cpu = QEMU_CPUS.get(spec.name, DEFAULT_QEMU_CPU)
        twin = prepare_twin(d, name, made_ns.dev_addr, qemu_cpu=qemu_cpu)
        start_twin(twin, rootfs.path, netns=made_ns.name, preexec=cgs.join if cgs and cgs.paths else None)
        emulator = host.get("emulator")
        say(f"sshd (aarch64{f', {emulator}, CPU {qemu_cpu}' if emulator else ''}) in network namespace {made_ns.name} "
            f"at {made_ns.dev_addr}:22" + (f", CPU quota {cpu_quota:g} core" if cpu_quota else "")
            + (f", memory limit {memory}" if memory else ""))
        kh = twin.write_known_hosts(d / "known_hosts")  # we made the key: trusted by construction
        notes = [f"arm64 twin: Debian {SUITE} {DEB_ARCH} rootfs {rootfs.path}"
                 + (f", emulated by {emulator} as a {qemu_cpu}" if emulator else ""),
                 "latency and memory figures under emulation are not representative of real hardware"]
        state = SimState(name=name, mode="netns", target=spec.name, host=twin.host, port=twin.port,
                         pid=twin.pid or 0, sshd_config=twin.sshd_config, index=index,
                         netns=made_ns.to_dict(), cgroups=cgs.paths if cgs else [], cpu_quota=cpu_quota,
                         memory_bytes=mem_bytes, notes=notes, arch="arm64", rootfs=str(rootfs.path))
        entry = DeviceEntry(name=name, kind="ssh", target=spec.name, host=twin.host, port=twin.port,
                            user=TWIN_USER, key=str(twin.client_key), known_hosts=str(kh), workdir=TWIN_WORKDIR,
                            python=TWIN_PYTHON, sim=True, emulated=emulator is not None,
                            connect_timeout=30.0,
                            notes=f"simulated {spec.name}: arm64 twin"
                                  + (f" under qemu user emulation ({qemu_cpu})" if emulator else ""))
        add_device(entry)
        atomic_write_text(_state_file(name), state.model_dump_json(indent=2))
        timings = TwinTimings(rootfs_seconds=round(rootfs.seconds, 1), rootfs_built=rootfs.built,
                              start_seconds=round(time.perf_counter() - t0, 1))
    except BaseException:
        if twin is not None and twin.pid:
            kill_tree(twin.pid)
        if cgs is not None:
            cgs.remove()
        if made_ns is not None:
            _netns.delete(made_ns)
        shutil.rmtree(d, ignore_errors=True)
        raise
    if provision:
        # the twin is up and registered: a failure here leaves it up (say so), `sim down` removes it
        t1 = time.perf_counter()
        try:
            entry, timings.wheels_downloaded = provision_runtimes(entry, spec, wheelhouse, say, runtimes=runtimes)
        except Exception as exc:
            if hasattr(exc, "message"):
                exc.message += f" (the twin '{name}' is up without runtimes; `edgekit sim down {name}` removes it)"
            raise
        timings.provision_seconds = round(time.perf_counter() - t1, 1)
    return state, entry, timings


def provision_runtimes(entry: DeviceEntry, spec: TargetSpec, wheelhouse: Path | None = None, say: Say = _quiet,
                       runtimes: Sequence[str] = ()) -> tuple[DeviceEntry, bool]:
    """Download the target's aarch64 wheels on this host (once, cached) and install them on the twin
    over SSH with ``pip install --no-index`` (edgekit/devices/provision.py). Updates the inventory entry."""

    # an unknown runtime, or one the target has no wheels for, is refused before any download
    wh, downloaded = ensure_wheelhouse(spec, wheelhouse, runtimes, say)
    t = transport_for(entry, spec.python)
    try:
        res = provision(t, spec, wh, progress=say, runtimes=runtimes)
    finally:
        t.close()
    entry = entry.model_copy(update={"python": res.python})
    add_device(entry, replace=True)
    say(f"installed {', '.join(res.installed)} on {entry.name} ({res.wheels_sent} wheels sent, "
        f"{res.bytes_sent / 2**20:.1f} MB)")
    return entry, downloaded
