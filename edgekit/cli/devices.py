"""`edgekit devices add|list|check|remove|provision`: the device inventory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from .common import (
    EXIT_GATE_FAILED,
    PANEL_ADB,
    PANEL_OUTPUT,
    PANEL_SSH,
    PANEL_TARGET,
    err_console,
    out_console,
    progress_display,
)

app = typer.Typer(help="Your devices: named instances of target classes, reached over SSH (or ADB).\n\n"
                  "Example: edgekit devices add lab-pi --target rpi4 --host 192.168.1.40 --user pi --trust",
                  no_args_is_help=True)


@app.command("add", help="Register a device. Its SSH host key must be known (known_hosts) or trusted here "
             "with --trust, which shows the fingerprint; a changed host key is always refused.\n\n"
             "Example: edgekit devices add lab-pi --target rpi4 --host 192.168.1.40 --user pi "
             "--key ~/.ssh/id_ed25519 --trust\n\n"
             "Android phones over adb: edgekit devices add pixel --target pixel-arm64 --adb 0123456789ABCDEF "
             "(USB), or --adb-tcp 192.168.1.23:5555 (Wi-Fi); the phone must show 'device' in `adb devices`.")
def add_cmd(
    name: str = typer.Argument(..., help="Device name (letters, digits, . _ -)."),
    target: str = typer.Option(..., "--target", "-t", rich_help_panel=PANEL_TARGET, help="Its target class (`edgekit targets list`)."),
    label: list[str] = typer.Option([], "--label", "-l", rich_help_panel=PANEL_TARGET, help="A pool label (repeatable): `deploy --pool "
                                    "TARGET:LABEL` measures every device of the class with it."),
    workdir: str = typer.Option(".edgekit", "--workdir", rich_help_panel=PANEL_TARGET, help="Folder on the device (relative = under its home)."),
    python: Optional[str] = typer.Option(None, "--python", rich_help_panel=PANEL_TARGET, help="The device's Python command (default: the target's)."),
    no_connect: bool = typer.Option(False, "--no-connect", rich_help_panel=PANEL_TARGET, help="Do not contact the device (its key must then be known)."),
    replace: bool = typer.Option(False, "--replace", rich_help_panel=PANEL_TARGET, help="Overwrite a device of the same name."),
    host: Optional[str] = typer.Option(None, "--host", rich_help_panel=PANEL_SSH, help="Hostname or address of the board (SSH)."),
    port: int = typer.Option(22, "--port", rich_help_panel=PANEL_SSH, help="SSH port."),
    user: Optional[str] = typer.Option(None, "--user", "-u", rich_help_panel=PANEL_SSH, help="Login user (default: your user name)."),
    key: Optional[str] = typer.Option(None, "--key", rich_help_panel=PANEL_SSH, help="Private key file (default: ssh-agent, then ~/.ssh keys)."),
    known_hosts: Optional[str] = typer.Option(None, "--known-hosts", rich_help_panel=PANEL_SSH, help="An extra known_hosts file to check."),
    trust: bool = typer.Option(False, "--trust", rich_help_panel=PANEL_SSH, help="Trust the host key the device offers now (shows its fingerprint)."),
    adb: Optional[str] = typer.Option(None, "--adb", rich_help_panel=PANEL_ADB, help="An Android device's adb serial (USB; `adb devices`)."),
    adb_tcp: Optional[str] = typer.Option(None, "--adb-tcp", rich_help_panel=PANEL_ADB, help="HOST:PORT of an Android device on Wi-Fi adb."),
    pin_big_cores: bool = typer.Option(False, "--pin-big-cores", rich_help_panel=PANEL_ADB, help="adb: run the agent on the target's big "
                                       "cores (taskset big_cores_mask)."),
    adb_isolated_server: bool = typer.Option(False, "--adb-isolated-server", rich_help_panel=PANEL_ADB, help="adb: a private adb server for "
                                             "this device (Wi-Fi devices, CI), never the user's own."),
    as_json: bool = typer.Option(False, "--json", rich_help_panel=PANEL_OUTPUT, help="Print the entry as JSON."),
):
    from ..devices.inventory import DeviceEntry, add_device, edgekit_known_hosts, known_hosts_files
    from ..errors import TransportError
    from ..transport.ssh import fetch_host_key, fingerprint, host_key_name, trust_host_key

    if adb is not None or adb_tcp is not None:
        return _add_adb(name, target, adb, adb_tcp, workdir, python, pin_big_cores, adb_isolated_server,
                        no_connect, replace, as_json, host, label)
    if host is None:
        from ..errors import BadInputError

        raise BadInputError("a device needs --host (SSH) or --adb SERIAL / --adb-tcp HOST:PORT (Android)",
                            hint="e.g. edgekit devices add phone --target pixel-arm64 --adb 0123456789ABCDEF")
    entry = DeviceEntry(name=name, kind="ssh", target=target, host=host, port=port, user=user, key=key,
                        workdir=workdir, python=python, known_hosts=known_hosts, labels=list(label))
    if not no_connect:
        import paramiko

        offered = fetch_host_key(host, port, timeout=entry.connect_timeout)
        hk = paramiko.HostKeys()
        for f in known_hosts_files(entry):
            if Path(f).is_file():
                hk.load(f)
        known = hk.lookup(host_key_name(host, port)) or {}
        fp = f"{offered.get_name()} {fingerprint(offered)}"
        if offered.get_name() in known and known[offered.get_name()] != offered:
            raise TransportError(f"HOST KEY CHANGED for {host_key_name(host, port)}: it offers {fp}, known_hosts has "
                                 f"{fingerprint(known[offered.get_name()])}; refusing",
                                 hint="if the board was re-installed, remove its old line from known_hosts first")
        if offered.get_name() not in known:
            if not trust:
                raise TransportError(f"the host key of {host_key_name(host, port)} is not known: {fp}",
                                     hint="compare that fingerprint with the board's (`ssh-keygen -lf "
                                          "/etc/ssh/ssh_host_ed25519_key.pub` on it), then add --trust")
            trust_host_key(host, port, offered, edgekit_known_hosts())
            err_console.print(f"trusted {host_key_name(host, port)}: {fp} (saved in {edgekit_known_hosts()})")
    add_device(entry, replace=replace)
    if as_json:
        print(json.dumps(entry.model_dump(mode="json")))
    else:
        out_console.print(f"added device {name} ({target}, {entry.user + '@' if entry.user else ''}{host}:{port}); "
                          f"check it with `edgekit devices check {name}`", highlight=False)


def _add_adb(name, target, serial, tcp, workdir, python, pin_big_cores, isolated, no_connect, replace, as_json,
             host, labels=()):
    from ..devices.inventory import DeviceEntry, add_device, transport_for
    from ..errors import BadInputError
    from ..inputs.targets import load_target

    if host is not None or (serial is not None and tcp is not None):
        raise BadInputError("give one of --host (SSH), --adb SERIAL (USB) or --adb-tcp HOST:PORT (Wi-Fi)")
    entry = DeviceEntry(name=name, kind="adb", target=target, serial=serial, adb_tcp=tcp, workdir=workdir,
                        python=python, pin_big_cores=pin_big_cores, adb_isolated_server=isolated,
                        labels=list(labels))
    if not no_connect:  # an offline/unauthorized phone or a wrong serial fails here, with what to do
        transport_for(entry, load_target(target).python).close()
    add_device(entry, replace=replace)
    if as_json:
        print(json.dumps(entry.model_dump(mode="json")))
    else:
        out_console.print(f"added device {name} ({target}, adb {serial or tcp}); check it with "
                          f"`edgekit devices check {name}`", highlight=False)


@app.command("list", help="List the devices in the inventory with their pool labels and who holds them on this "
             "host.\n\nWith EDGEKIT_COORDINATOR set, also who holds each device's labgrid place (any host); --leases "
             "also asks each device who holds its device-side lease (any host).\n\n"
             "Example: edgekit devices list --leases --json")
def list_cmd(as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
             leases: bool = typer.Option(False, "--leases", help="Connect to each device and show the holder of its "
                                         "device-side lease (deploys on other hosts too).")):
    from concurrent.futures import ThreadPoolExecutor

    from rich.table import Table

    from ..devices.inventory import host_lock_holder, inventory_path, load_inventory
    from ..devices.lease import device_lease_holder

    inv = load_inventory()
    held = {}
    for d in inv.devices:
        h = host_lock_holder(d.name)
        held[d.name] = None if h is None else (f"PID {h.get('pid')} on {h.get('host')} since {h.get('started')}"
                                               if h else "another edgekit process")
    places = _place_holders(inv.devices)  # None without EDGEKIT_COORDINATOR
    remote = {}
    if leases and inv.devices:
        with ThreadPoolExecutor(max_workers=min(8, len(inv.devices))) as pool:
            remote = dict(zip([d.name for d in inv.devices], pool.map(device_lease_holder, inv.devices)))
    if as_json:
        print(json.dumps([d.model_dump(mode="json") | {"held_here_by": held[d.name],
                                                       **({"lease": remote[d.name]} if leases else {}),
                                                       **({"place": places[d.name]} if places is not None else {})}
                          for d in inv.devices]))
        return
    if not inv.devices:
        out_console.print(f"no devices in {inventory_path()}; add one with `edgekit devices add` or `edgekit sim up`")
        return
    t = Table("name", "kind", "target", "address", "user", "workdir", "labels", "held by", "notes")
    for d in inv.devices:
        addr = f"{d.host}:{d.port}" if d.kind == "ssh" else (f"adb {d.serial or d.adb_tcp or '(only device)'}"
                                                              if d.kind == "adb" else "-")
        who = held[d.name] or "-"
        if places is not None:
            who = f"{who if held[d.name] else 'free here'}; labgrid place: {places[d.name]['holder']}"
        if leases:
            who = f"{who if held[d.name] else 'free here'}; device lease: {remote[d.name]}"
        t.add_row(d.name, d.kind, d.target, addr, d.user or "-", d.workdir, ",".join(d.labels) or "-", who, d.notes)
    out_console.print(t)


def _place_holders(devices) -> dict | None:
    """Each device's labgrid place (EDGEKIT_COORDINATOR): its holder in words and as the coordinator names it."""
    from ..devices.coordinator import address_from_env, describe_holder, place_holders

    addr = address_from_env()
    if addr is None:
        return None
    found = place_holders(addr) if devices else {}
    out = {}
    for d in devices:
        p = found.get(d.name)
        out[d.name] = ({"coordinator": str(addr), "exists": False, "acquired": None,
                        "holder": f"no place (`edgekit lab export {d.name}`)"} if p is None else
                       {"coordinator": str(addr), "exists": True, "acquired": p.acquired,
                        "holder": describe_holder(p.acquired, p.changed) if p.acquired else "free"})
    return out


@app.command("check", help="Connect and report OS, arch, Python, runtimes, free disk and memory, and whether the "
             "device matches its target class (exit 1 when it does not, 3 when it cannot be reached).\n\n"
             "Example: edgekit devices check lab-pi")
def check_cmd(name: str = typer.Argument(..., help="Device name."),
              as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    from ..devices.inventory import check_device, get_device

    with progress_display(not as_json) as progress:
        progress(f"checking {name}")
        doc = check_device(get_device(name))
    if as_json:
        print(json.dumps(doc))
    else:
        dev, res = doc["device"], doc["resources"]

        def mb(x):
            return "n/a" if x is None else f"{x:.0f} MB"

        out_console.print(f"{doc['name']} ({doc['target']}) via {doc['transport']}, workdir {doc['workdir']}",
                          highlight=False)
        out_console.print(f"  os {dev.get('os')} {dev.get('os_release')}, arch {dev.get('arch')}, "
                          f"{dev.get('cores')} cores ({dev.get('cpu')}), Python {dev.get('python')}", highlight=False)
        rts = ", ".join(f"{k} {v}" for k, v in doc["runtimes"].items()) or "none"
        out_console.print(f"  runtimes: {rts}", highlight=False)
        if "error" in res:
            out_console.print(f"  resources: unavailable ({res['error']})", highlight=False)
        else:
            out_console.print(f"  free disk {mb(res.get('disk_free_mb'))}, memory available "
                              f"{mb(res.get('mem_available_mb'))} of {mb(res.get('mem_total_mb'))}"
                              + (f" (cgroup limit {mb(res['memory_limit_mb'])})" if res.get("memory_limit_mb") else ""),
                              highlight=False)
        for n in doc["notes"]:
            out_console.print(f"  note: {n}", highlight=False)
        if doc["matches_target"]:
            out_console.print(f"  [green]matches[/] target {doc['target']}")
        else:
            for p in doc["problems"]:
                out_console.print(f"  [red]mismatch[/]: {p}", highlight=False)
    if not doc["matches_target"]:
        raise typer.Exit(EXIT_GATE_FAILED)


@app.command("remove", help="Remove a device from the inventory (simulated ones: `edgekit sim down`).\n\n"
             "Example: edgekit devices remove lab-pi")
def remove_cmd(name: str = typer.Argument(..., help="Device name.")):
    from ..devices.inventory import get_device, remove_device
    from ..errors import BadInputError

    if get_device(name).sim:
        raise BadInputError(f"'{name}' is a simulated device", hint=f"`edgekit sim down {name}` stops and removes it")
    remove_device(name)
    out_console.print(f"removed {name}")


@app.command("provision", help="Install the target's runtime wheels on the device from a wheelhouse built on this "
             "host (`pip download` for the device's platform); the device needs no internet.\n\n"
             "Example: edgekit devices provision lab-pi")
def provision_cmd(
    name: str = typer.Argument(..., help="Device name."),
    wheelhouse: Optional[Path] = typer.Option(None, "--wheelhouse", help="Folder of .whl files (default: download "
                                              "the target's wheels into the edgekit cache)."),
    package: Optional[list[str]] = typer.Option(None, "--package", "-p", help="Package to install (repeatable; "
                                                "default: the target's wheels.packages)."),
    runtime: Optional[list[str]] = typer.Option(None, "--runtime", help="Also install this runtime's own wheels "
                                                "(the target's wheels.runtime_packages, e.g. executorch: a CPU torch + "
                                                "executorch); repeatable. Default: only wheels.packages."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
):
    from ..devices.inventory import add_device, get_device, transport_for
    from ..devices.provision import ensure_wheelhouse, provision, runtime_wheels
    from ..inputs.targets import load_target

    entry = get_device(name)
    spec = load_target(entry.target)
    runtimes = tuple(runtime or ())
    runtime_wheels(spec, runtimes)  # refused before the progress display starts
    with progress_display(not as_json) as progress:
        wh, _ = ensure_wheelhouse(spec, wheelhouse, runtimes, progress)
        t = transport_for(entry, spec.python)
        try:
            res = provision(t, spec, wh, packages=list(package) if package else None, progress=progress,
                            runtimes=runtimes)
        finally:
            t.close()
    add_device(entry.model_copy(update={"python": res.python}), replace=True)
    doc = {"device": name, "python": res.python, "installed": res.installed, "wheels_sent": res.wheels_sent,
           "wheels_reused": res.wheels_reused, "bytes_sent": res.bytes_sent}
    if as_json:
        print(json.dumps(doc))
    else:
        out_console.print(f"installed {', '.join(res.installed)} on {name} ({res.wheels_sent} wheels sent, "
                          f"{res.wheels_reused} already there); its python is now: {res.python}", highlight=False)
