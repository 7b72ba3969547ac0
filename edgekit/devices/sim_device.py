"""`edgekit sim up|down|list`: simulated devices that the rest of edgekit reaches like real boards.

As root, a simulated device is a real sshd in its own network namespace (its own address on a veth
pair), in CPU and memory cgroups, so the agent measures a slower machine than the host. Without
root it falls back to an sshd on a loopback port, unthrottled, and says so. It logs in as the
current user and runs this host's Python (so the runtimes installed here are there). Its state
lives in ``$EDGEKIT_HOME/sim/NAME/``; `sim down` removes everything `sim up` made. A device (registered,
listed, provisioned), so in devices/; the host machinery it runs on (sshd, netns, cgroups, processes, state
files) is ``sim/``'s.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Literal

from ..errors import BadInputError, DeviceError
from ..fsutil import atomic_write_text
from ..inputs.targets import TargetSpec, load_target
from ..paths import locks_dir, sim_root
from ..sim import cgroup as _cg
from ..sim import netns as _netns
from ..sim import sshd as _sshd
from ..sim.procs import alive, kill_tree

# the state record is a leaf module (devices.check_device reads it); re-exported for the callers here
from ..sim.state import SimState, find_state, load_states  # noqa: F401
from ..sim.state import state_file as _state_file
from .inventory import NAME_RE, DeviceEntry, add_device, get_device, load_inventory, remove_device


def _free_index() -> int:
    used = {s.index for s in load_states() if s.index is not None}
    for i in range(1, 251):
        if i not in used and not _netns.exists(f"edgekit-sim{i}"):
            return i
    raise DeviceError("no free simulated-device slot (250 in use)", hint="`edgekit sim down` some of them")


def create_netns() -> tuple[int, _netns.Netns]:
    """The namespace of the first free slot; a slot another edgekit home on this host (another CI runner,
    another user) takes between the check and the creation is skipped, not shared or torn down."""
    for _ in range(16):
        index = _free_index()
        try:
            return index, _netns.create(f"edgekit-sim{index}", index)
        except _netns.NameTaken:
            continue
    raise DeviceError("no simulated-device slot could be claimed: others kept taking them",
                      hint="retry, or `edgekit sim down` some of them")


def _is_our_sshd(pid: int, config: str) -> bool:
    """Guard against a recycled PID: only a process started with our sshd_config is ours."""
    try:
        # sshd rewrites its title ("sshd: /usr/sbin/sshd -D -e -f CFG [listener] ..."): match a substring
        return config in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def check_new_sim(name: str, target: str, cpu_quota: float | None,
                  memory: str | None) -> tuple[TargetSpec, int | None]:
    """The input checks every `sim up` (plain or arm64) makes before touching anything:
    returns (target spec, memory limit in bytes or None)."""

    if not NAME_RE.match(name):
        raise BadInputError(f"device name {name!r} must be letters, digits, '.', '_' or '-' (max 63)")
    if cpu_quota is not None and not (0.01 <= cpu_quota <= 64):
        raise BadInputError(f"--cpu-quota {cpu_quota} is out of range", hint="cores, e.g. 0.25 for a quarter core")
    spec = load_target(target)
    mem_bytes = _cg.parse_size(memory) if memory else None
    if _state_file(name).is_file():
        raise BadInputError(f"simulated device '{name}' is already up", hint=f"`edgekit sim down {name}` first")
    if any(d.name == name for d in load_inventory().devices):
        raise BadInputError(f"device '{name}' is already in the inventory (not a simulated one)",
                            hint="pick another name, or `edgekit devices remove` it")
    return spec, mem_bytes


def up(name: str, *, target: str = "rpi4", cpu_quota: float | None = None, memory: str | None = None,
       say: Callable[[str], None] = lambda m: None) -> tuple[SimState, DeviceEntry]:
    spec, mem_bytes = check_new_sim(name, target, cpu_quota, memory)
    rooted = _netns.available() and _cg.available()
    d = sim_root() / name
    if d.exists():
        shutil.rmtree(d)  # leftovers of a crashed `sim up` with no state: nothing runs from them
    d.mkdir(parents=True)
    made_ns: _netns.Netns | None = None
    cgs: _cg.Cgroups | None = None
    server: _sshd.Sshd | None = None
    notes: list[str] = []
    try:
        if rooted:
            index, made_ns = create_netns()
            cgs = _cg.create(f"edgekit-sim-{name}", cpu_quota=cpu_quota, memory_bytes=mem_bytes)
            server = _sshd.prepare(d / "sshd", host=made_ns.dev_addr, port=22)
            _sshd.start(server, netns=made_ns.name, preexec=cgs.join if cgs.paths else None, detach=True)
            mode: Literal["netns", "loopback"] = "netns"
            say(f"sshd in network namespace {made_ns.name} at {made_ns.dev_addr}:22"
                + (f", CPU quota {cpu_quota:g} core" if cpu_quota else "")
                + (f", memory limit {memory}" if memory else ""))
        else:
            index = None
            server = _sshd.prepare(d / "sshd", host="127.0.0.1", port=_sshd.free_port())
            _sshd.start(server, detach=True)
            mode = "loopback"
            why = "not root" if not _netns.available() else "no cgroup v1 cpu controller"
            note = (f"fallback ({why}): sshd on loopback port {server.port}, sharing this host's network and "
                    "CPU; --cpu-quota/--memory are not applied, so latencies are this host's")
            notes.append(note)
            say(note)
        kh = server.write_known_hosts(d / "known_hosts")  # we made the key: trusted by construction
        state = SimState(name=name, mode=mode, target=spec.name, host=server.host, port=server.port,
                         pid=server.pid or 0, sshd_config=str(server.dir / "sshd_config"), index=index,
                         netns=made_ns.to_dict() if made_ns else None, cgroups=cgs.paths if cgs else [],
                         cpu_quota=cpu_quota if rooted else None, memory_bytes=mem_bytes if rooted else None,
                         notes=notes)
        (d / "device").mkdir()
        entry = DeviceEntry(name=name, kind="ssh", target=spec.name, host=server.host, port=server.port,
                            user=server.user, key=str(server.client_key), known_hosts=str(kh),
                            workdir=str(d / "device"), python=sys.executable, sim=True,
                            notes=f"simulated {spec.name}-class device ({mode})")
        add_device(entry)

        atomic_write_text(_state_file(name), state.model_dump_json(indent=2))
        return state, entry
    except BaseException:
        if server is not None:
            server.stop()
        if cgs is not None:
            cgs.remove()
        if made_ns is not None:
            _netns.delete(made_ns)
        shutil.rmtree(d, ignore_errors=True)
        raise


def down(name: str, say: Callable[[str], None] = lambda m: None) -> None:
    d = sim_root() / name
    state = None
    if _state_file(name).is_file():
        state = SimState.model_validate_json(_state_file(name).read_text(encoding="utf-8"))
    elif not d.exists():
        raise BadInputError(f"no simulated device '{name}'", hint="`edgekit sim list` shows them")
    if state is not None:
        if alive(state.pid) and _is_our_sshd(state.pid, state.sshd_config):
            kill_tree(state.pid)
            say(f"stopped sshd (PID {state.pid})")
        if state.cgroups:
            _cg.Cgroups(name, list(state.cgroups)).remove()
        if state.netns:
            _netns.delete(_netns.Netns(**state.netns))
            say(f"deleted network namespace {state.netns['name']}")
    try:
        entry = get_device(name)
        if entry.sim:
            remove_device(name)
    except BadInputError:
        pass
    shutil.rmtree(d, ignore_errors=True)
    for empty in (sim_root(),):
        try:
            empty.rmdir()
        except OSError:
            pass  # other simulated devices are still there
    (locks_dir() / f"{name}.lock").unlink(missing_ok=True)


def status(state: SimState) -> dict[str, Any]:
    """The simulated device's state as its JSON document, and whether its sshd still runs."""
    doc: dict[str, Any] = json.loads(state.model_dump_json())
    doc["running"] = alive(state.pid) and _is_our_sshd(state.pid, state.sshd_config)
    return doc
