"""Offline provisioning over real SSH: wheels pushed by content, `pip install --no-index` on the device."""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path

import pytest
from sshd import needs_sshd, register, sshd_server  # noqa: F401  (pytest fixture)

from edgekit.devices.inventory import get_device, transport_for
from edgekit.devices.provision import provision
from edgekit.errors import BadInputError
from edgekit.inputs.targets import load_target

pytestmark = needs_sshd


def make_wheel(dest: Path, name="edgekit_probe_pkg", version="1.0") -> Path:
    """A real (tiny, pure-Python) wheel, written by hand so the test needs no package index."""
    files = {f"{name}/__init__.py": f"VALUE = 42\nVERSION = {version!r}\n",
             f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{name}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: edgekit-test\n"
                                                   "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{name}-{version}.dist-info/RECORD,,")
    whl = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
        z.writestr(f"{name}-{version}.dist-info/RECORD", "\n".join(record) + "\n")
    return whl


@pytest.fixture
def device(sshd_server, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path / "home"))
    register(sshd_server, "board", target="local", workdir=tmp_path / "device")
    return sshd_server


def test_provision_installs_from_the_wheelhouse_without_an_index(device, tmp_path):
    wh = tmp_path / "wheelhouse"
    wh.mkdir()
    make_wheel(wh)
    spec = load_target("local")
    with transport_for(get_device("board"), spec.python) as t:
        res = provision(t, spec, wh, packages=["edgekit_probe_pkg"])
        assert res.wheels_sent == 1 and res.installed == ["edgekit_probe_pkg"]
        assert res.python.startswith("env PYTHONPATH=") and res.python.endswith(sys.executable)
        t.python = res.python  # what `devices provision` writes into the inventory
        r = t.run([t.python, "-c", "import edgekit_probe_pkg as p; print(p.VALUE, p.__file__)"], timeout=60)
        assert r.ok, r.stderr
        value, where = r.stdout.split()
        assert value == "42" and where.startswith(str(tmp_path / "device" / "site"))
        again = provision(t, spec, wh, packages=["edgekit_probe_pkg"])  # nothing new to send
        assert again.wheels_sent == 0 and again.wheels_reused == 1 and again.bytes_sent == 0


def test_cli_provision_updates_the_devices_python(cli, device, tmp_path):
    wh = tmp_path / "wheelhouse"
    wh.mkdir()
    make_wheel(wh)
    r = cli("devices", "provision", "board", "--wheelhouse", wh, "--package", "edgekit_probe_pkg", "--json")
    assert r.exit_code == 0, r.stderr
    assert "PYTHONPATH=" in get_device("board").python
    r = cli("devices", "check", "board", "--json")  # the agent still runs with the new python command
    assert r.exit_code == 0, r.stderr


def test_missing_package_in_the_wheelhouse_fails_with_the_pip_message(device, tmp_path):
    from edgekit.errors import DeviceError

    wh = tmp_path / "wheelhouse"
    wh.mkdir()
    make_wheel(wh)
    spec = load_target("local")
    with transport_for(get_device("board"), spec.python) as t:
        with pytest.raises(DeviceError, match="pip install on the device failed"):
            provision(t, spec, wh, packages=["not_in_the_wheelhouse"])


def test_empty_wheelhouse_is_bad_input(device, tmp_path):
    (tmp_path / "empty").mkdir()
    spec = load_target("local")
    with transport_for(get_device("board"), spec.python) as t:
        with pytest.raises(BadInputError, match="no .whl files"):
            provision(t, spec, tmp_path / "empty", packages=["x"])
