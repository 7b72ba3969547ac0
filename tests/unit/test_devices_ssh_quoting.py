"""What the SSH transport sends to the remote shell, checked without a connection."""

from __future__ import annotations

import shlex

from edgekit.devices.provision import _base_python, download_command
from edgekit.inputs.targets import load_target
from edgekit.transport.ssh import SSHConfig, SSHTransport, host_key_name


def transport(python="python3"):
    t = SSHTransport(SSHConfig(host="h"), workdir="/w", python=python)
    t._workdir_resolved = True
    return t


def test_every_word_is_quoted():
    line = transport().command_line(["echo", "a b", "$(reboot)", "x;rm -rf /", "'q'"])
    assert shlex.split(line) == ["echo", "a b", "$(reboot)", "x;rm -rf /", "'q'"]


def test_python_command_from_the_inventory_may_be_several_words():
    t = transport("env PYTHONPATH=/w/site python3")
    assert shlex.split(t.command_line([t.python, "/w/agent.py", "--probe"])) == [
        "env", "PYTHONPATH=/w/site", "python3", "/w/agent.py", "--probe"]
    # a non-python argv[0] with spaces stays one word
    assert shlex.split(t.command_line(["my prog", "x"])) == ["my prog", "x"]


def test_cwd_is_quoted_and_under_workdir():
    line = transport().command_line(["ls"], cwd="a dir")
    assert line == "cd '/w/a dir' && ls"


def test_host_key_names_follow_openssh():
    assert host_key_name("pi.local", 22) == "pi.local"
    assert host_key_name("10.0.0.2", 2222) == "[10.0.0.2]:2222"


def test_wheelhouse_download_is_binary_only_for_the_targets_platforms(tmp_path):
    argv = download_command(load_target("rpi4"), tmp_path)
    assert "--only-binary=:all:" in argv and argv[argv.index("--python-version") + 1] == "3.11"
    plats = [argv[i + 1] for i, a in enumerate(argv) if a == "--platform"]
    assert "manylinux_2_28_aarch64" in plats and "manylinux2014_aarch64" in plats
    assert {"onnxruntime", "ai-edge-litert", "numpy", "pip"} <= set(argv)


def test_base_python_drops_an_earlier_provisioning_prefix():
    assert _base_python("env PYTHONPATH=/w/site python3") == "python3"
    assert _base_python("/usr/bin/python3.11") == "/usr/bin/python3.11"
