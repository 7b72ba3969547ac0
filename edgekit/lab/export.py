"""Inventory devices as labgrid places (``edgekit lab export``).

One place per device, named after it (hosts that share a device give it the same inventory name).
Its tags, in labgrid's tag alphabet (lowercase letters, digits, ``_``): ``target=<class>``,
``transport=ssh|adb|local`` and ``label_<label>=1`` for each pool label, so labgrid's own reservations
can select a pool (``labgrid-client reserve target=rpi4 label_lab_a=1``). Its comment says what the
device is; its one match ``*/<device>/<resource class>`` names its resource.

labgrid attaches resources to places only through an exporter. ``exporter_config`` writes the
exporter's config: one group per device, an SSH device as labgrid's ``NetworkService`` (address, port,
username; keys and passwords stay in the inventory), an adb device as an ``EdgekitADBDevice`` entry
(serial or adb_tcp: labgrid has no ADB resource class, so this is a plain resource entry that labgrid's
own drivers do not use), a ``local`` device none. ``edgekit lab export --run-exporter`` then becomes
``labgrid-exporter`` with that file. Without a running exporter the places still reserve (all that
edgekit's deploys need) and list no resources.
"""

from __future__ import annotations

import getpass
import re
import socket
import sys
from pathlib import Path

from ..devices.coordinator import Address, Coordinator, CoordinatorRefused
from ..devices.inventory import DeviceEntry
from ..fsutil import atomic_write_text

ADB_RESOURCE = "EdgekitADBDevice"
OUR_CLASSES = ("NetworkService", ADB_RESOURCE)


def tag_value(text: str) -> str:
    """``text`` in labgrid's tag alphabet (``[a-z0-9_]``)."""
    return re.sub(r"[^a-z0-9_]+", "_", text.lower()).strip("_") or "_"


def place_tags(entry: DeviceEntry) -> dict[str, str]:
    return {"target": tag_value(entry.target), "transport": entry.kind,
            **{f"label_{tag_value(label)}": "1" for label in entry.labels}}


def resource_for(entry: DeviceEntry) -> tuple[str, dict] | None:
    """(resource class, parameters) of the device, as the exporter publishes it."""
    if entry.kind == "ssh":
        try:
            user = entry.user or getpass.getuser()
        except Exception:  # no passwd entry: the login user is whatever SSH picks
            user = "root"
        return "NetworkService", {"address": entry.host, "port": entry.port, "username": user}
    if entry.kind == "adb":
        params = {k: v for k, v in (("serial", entry.serial), ("adb_tcp", entry.adb_tcp)) if v}
        return ADB_RESOURCE, params or {"serial": "(the only attached device)"}
    return None


def place_match(entry: DeviceEntry) -> str | None:
    res = resource_for(entry)
    return None if res is None else f"*/{entry.name}/{res[0]}"


def place_comment(entry: DeviceEntry) -> str:
    if entry.kind == "ssh":
        where = f"ssh {entry.user + '@' if entry.user else ''}{entry.host}:{entry.port}"
    elif entry.kind == "adb":
        where = f"adb {entry.serial or entry.adb_tcp or '(only attached device)'}"
    else:
        where = "local folder"
    labels = f", labels {','.join(entry.labels)}" if entry.labels else ""
    return f"edgekit device {entry.name}: {entry.target}, {where}{labels}"


def exporter_config(entries: list[DeviceEntry]) -> dict:
    """labgrid-exporter's resource config for ``entries`` (one group per device that has a resource)."""
    out: dict = {}
    for e in entries:
        res = resource_for(e)
        if res is not None:
            out[e.name] = {res[0]: dict(res[1])}
    return out


def write_exporter_config(entries: list[DeviceEntry], path: Path) -> Path:
    import yaml


    path.parent.mkdir(parents=True, exist_ok=True)
    # labgrid renders the file with Jinja2 (a line starting with '#' is a statement): plain YAML, no comments
    return atomic_write_text(path, yaml.safe_dump(exporter_config(entries), sort_keys=True))


def default_exporter_name() -> str:
    return f"edgekit-{socket.gethostname()}"


def exporter_argv(address: Address, config: Path, name: str | None = None) -> list[str]:
    """labgrid's exporter, run with this Python (no PATH lookup, no shell)."""
    return [sys.executable, "-m", "labgrid.remote.exporter", "--coordinator", str(address),
            "--name", name or default_exporter_name(), str(config)]


def _is_ours(pattern: str, device: str) -> bool:
    parts = pattern.split("/")
    return len(parts) == 3 and parts[0] == "*" and parts[1] == device and parts[2] in OUR_CLASSES


def export_places(client: Coordinator, entries: list[DeviceEntry]) -> list[dict]:
    """Create or update one place per entry; returns what each place now holds."""
    existing = client.places()
    out = []
    for e in entries:
        old = existing.get(e.name)
        if old is None:
            try:
                client.rpc("AddPlace", name=e.name)
            except CoordinatorRefused as exc:
                if exc.code != "ALREADY_EXISTS":  # another host exported it a moment ago: update it
                    raise
        tags = place_tags(e)
        stale = {k: "" for k in (old.tags if old else {}) if k.startswith("label_") and k not in tags}
        client.rpc("SetPlaceTags", placename=e.name, tags={**tags, **stale})  # "" deletes a tag
        client.rpc("SetPlaceComment", placename=e.name, comment=place_comment(e))
        match = place_match(e)
        for m in (old.matches if old else ()):
            if m != match and _is_ours(m, e.name):
                client.rpc("DeletePlaceMatch", placename=e.name, pattern=m)
        if match and match not in (old.matches if old else ()):
            client.rpc("AddPlaceMatch", placename=e.name, pattern=match)
        res = resource_for(e)
        out.append({"place": e.name, "created": old is None, "tags": tags, "match": match,
                    "resource": None if res is None else {"cls": res[0], **res[1]},
                    "held_by": old.acquired if old else None})
    return out
