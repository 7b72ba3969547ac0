"""The device inventory: entries, validation, persistence, dispatch on kind, CLI list/remove."""

from __future__ import annotations

import pytest
import yaml

from edgekit.devices.inventory import (
    DeviceEntry,
    add_device,
    edgekit_home,
    get_device,
    inventory_path,
    load_inventory,
    open_device_transport,
    remove_device,
    transport_for,
)
from edgekit.devices.lock import DeviceLock, DeviceLockedError
from edgekit.errors import BadInputError, ConfigError
from edgekit.inputs.targets import load_target


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def ssh_entry(name="lab-pi", **kw) -> DeviceEntry:
    return DeviceEntry(name=name, target=kw.pop("target", "rpi4"), host=kw.pop("host", "127.0.0.1"), **kw)


def test_home_honours_edgekit_home_then_xdg(home, monkeypatch, tmp_path):
    assert edgekit_home() == home
    monkeypatch.delenv("EDGEKIT_HOME")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert edgekit_home() == tmp_path / "xdg" / "edgekit"


def test_add_list_remove_roundtrip(home):
    add_device(ssh_entry(port=2222, user="pi", key="~/.ssh/id_ed25519"))
    add_device(DeviceEntry(name="here", kind="local", target="local", workdir=str(home / "dev")))
    doc = yaml.safe_load(inventory_path().read_text())
    assert [d["name"] for d in doc["devices"]] == ["lab-pi", "here"]
    got = get_device("lab-pi")
    assert (got.host, got.port, got.user, got.kind) == ("127.0.0.1", 2222, "pi", "ssh")
    remove_device("lab-pi")
    assert [d.name for d in load_inventory().devices] == ["here"]


def test_duplicate_needs_replace():
    add_device(ssh_entry())
    with pytest.raises(BadInputError, match="already in the inventory"):
        add_device(ssh_entry(host="10.0.0.9"))
    add_device(ssh_entry(host="10.0.0.9"), replace=True)
    assert get_device("lab-pi").host == "10.0.0.9"


@pytest.mark.parametrize("kw, msg", [
    ({"name": "bad name"}, "must be letters"),
    ({"name": "x;rm -rf"}, "must be letters"),
    ({"host": None}, "needs a host"),
    ({"port": 0}, "greater than or equal to 1"),
])
def test_invalid_entries_rejected(kw, msg):
    base = {"name": "ok", "target": "rpi4", "host": "h"}
    base.update(kw)
    with pytest.raises(ValueError, match=msg):
        DeviceEntry(**base)


def test_unknown_target_lists_known_ones():
    with pytest.raises(BadInputError, match="unknown target 'nope'") as e:
        add_device(ssh_entry(target="nope"))
    assert "rpi4" in e.value.hint


def test_unknown_device_names_the_known_ones():
    add_device(ssh_entry())
    with pytest.raises(BadInputError, match="unknown device 'pi2'") as e:
        get_device("pi2")
    assert "lab-pi" in e.value.hint


def test_hand_edited_inventory_with_unknown_key_is_a_config_error(home):
    home.mkdir(parents=True)
    inventory_path().write_text(yaml.safe_dump({"devices": [{"name": "a", "target": "rpi4", "host": "h",
                                                             "hots": "typo"}]}))
    with pytest.raises(ConfigError, match="hots: unknown key"):
        load_inventory()


def test_duplicate_names_in_file_rejected(home):
    home.mkdir(parents=True)
    d = {"name": "a", "target": "rpi4", "host": "h"}
    inventory_path().write_text(yaml.safe_dump({"devices": [d, d]}))
    with pytest.raises(ConfigError, match="appears twice"):
        load_inventory()


def test_transport_dispatch_on_kind(home):
    ssh = transport_for(ssh_entry(python=None), "python3")
    assert ssh.kind == "ssh" and ssh.python == "python3" and ssh.describe() == "ssh:127.0.0.1:22"
    local = transport_for(DeviceEntry(name="l", kind="local", target="local", workdir=str(home / "d")))
    assert local.kind == "local"


def test_target_mismatch_is_refused_before_locking():
    add_device(ssh_entry())
    with pytest.raises(BadInputError, match="is a 'rpi4' device, not 'local'"):
        open_device_transport("lab-pi", load_target("local"))
    DeviceLock("lab-pi").acquire(wait=False).release()  # the refused deploy left the device unlocked


def test_open_device_transport_holds_the_lock_until_close(home):
    add_device(DeviceEntry(name="here", kind="local", target="local", workdir=str(home / "dev")))
    t = open_device_transport("here", load_target("local"))
    with pytest.raises(DeviceLockedError, match="device 'here' is busy"):
        DeviceLock("here").acquire(wait=False)
    t.close()
    DeviceLock("here").acquire(wait=False).release()


def test_cli_list_and_remove(cli, home):
    add_device(ssh_entry())
    r = cli("devices", "list", "--json")
    assert r.exit_code == 0 and '"lab-pi"' in r.stdout
    r = cli("devices", "remove", "lab-pi")
    assert r.exit_code == 0 and load_inventory().devices == []
    r = cli("devices", "remove", "lab-pi")
    assert r.exit_code == 2 and "unknown device" in r.stderr


def test_cli_remove_refuses_a_simulated_device(cli):
    add_device(ssh_entry(name="sim1", sim=True))
    r = cli("devices", "remove", "sim1")
    assert r.exit_code == 2 and "sim down sim1" in r.stderr
    assert get_device("sim1")
