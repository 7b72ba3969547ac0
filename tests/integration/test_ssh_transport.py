"""The SSH transport against a real OpenSSH server on loopback: commands, files, host keys, auth."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from sshd import needs_sshd, register, sshd_server  # noqa: F401  (pytest fixture)

from edgekit.errors import BadInputError, TransportError
from edgekit.sim import sshd as simsshd
from edgekit.transport.ssh import SSHConfig, SSHTransport

pytestmark = needs_sshd


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def make(s, tmp_path, known_hosts=None, key=None, **kw) -> SSHTransport:
    kh = known_hosts or s.write_known_hosts(tmp_path / "known_hosts")
    cfg = SSHConfig(host=s.host, port=s.port, user=s.user, key=str(key or s.client_key), known_hosts=(str(kh),),
                    connect_timeout=kw.pop("connect_timeout", 5.0), retries=kw.pop("retries", 1))
    return SSHTransport(cfg, workdir=str(tmp_path / "dev"), python=sys.executable, **kw)


def test_commands_exit_codes_stderr_and_quoting(sshd_server, tmp_path):
    with make(sshd_server, tmp_path) as t:
        r = t.run(["printf", "%s|", "a b", "$(id)", "x;echo pwned", "*"], timeout=20)
        assert r.ok and r.stdout == "a b|$(id)|x;echo pwned|*|"
        r = t.run(["sh", "-c", "echo oops >&2; exit 7"], timeout=20)
        assert r.returncode == 7 and r.stderr == "oops\n" and r.stdout == ""
        big = t.run([sys.executable, "-c", "print('x' * 3_000_000)"], timeout=30)
        assert len(big.stdout) == 3_000_001  # more than any channel window: nothing lost or truncated


def test_command_timeout_is_a_transport_error(sshd_server, tmp_path):
    with make(sshd_server, tmp_path) as t:
        with pytest.raises(TransportError, match="timed out after 1 s"):
            t.run(["sleep", "30"], timeout=1)
        assert t.run(["true"], timeout=20).ok  # the transport still works afterwards


def test_push_pull_atomic_and_counted(sshd_server, tmp_path):
    src = tmp_path / "blob.bin"
    src.write_bytes(os.urandom(300_000))
    with make(sshd_server, tmp_path) as t:
        t.push(src, "files/sub/blob.bin")
        assert t.bytes_sent == 300_000
        dest = Path(t.remote_path("files/sub/blob.bin"))
        assert dest.read_bytes() == src.read_bytes()
        assert not [p for p in dest.parent.iterdir() if p.name.endswith(".partial")]
        back = tmp_path / "back.bin"
        t.pull("files/sub/blob.bin", back)
        assert back.read_bytes() == src.read_bytes()
        with pytest.raises(TransportError, match="does not exist"):
            t.pull("files/nope.bin", tmp_path / "nope.bin")
        assert not (tmp_path / "nope.bin").exists() and not (tmp_path / ".nope.bin.partial").exists()


def test_relative_workdir_is_under_the_login_home(sshd_server, tmp_path):
    t = make(sshd_server, tmp_path)
    t.workdir = ".edgekit-test-wd"
    try:
        home = t.run(["sh", "-c", 'echo "$HOME"'], timeout=20).stdout.strip()
        assert t.workdir == os.path.join(home, ".edgekit-test-wd")
    finally:
        t.close()


def test_unknown_host_key_refused_with_fingerprint(sshd_server, tmp_path):
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    with pytest.raises(TransportError, match=r"is not known \(ssh-ed25519 SHA256:") as e:
        make(sshd_server, tmp_path, known_hosts=empty).run(["true"], timeout=10)
    assert "--trust" in e.value.hint


def test_changed_host_key_always_refused(sshd_server, tmp_path):
    other = simsshd.keygen(tmp_path / "other_host_key")
    line = " ".join(Path(f"{other}.pub").read_text().split()[:2])
    kh = tmp_path / "kh_changed"
    kh.write_text(f"[{sshd_server.host}]:{sshd_server.port} {line}\n")
    with pytest.raises(TransportError, match="HOST KEY CHANGED"):
        make(sshd_server, tmp_path, known_hosts=kh).run(["true"], timeout=10)


def test_wrong_key_is_an_authentication_error(sshd_server, tmp_path):
    stranger = simsshd.keygen(tmp_path / "stranger")
    with pytest.raises(TransportError, match="authentication .* failed"):
        make(sshd_server, tmp_path, key=stranger).run(["true"], timeout=10)


def test_missing_key_file_is_bad_input(sshd_server, tmp_path):
    with pytest.raises(BadInputError, match="does not exist"):
        make(sshd_server, tmp_path, key=tmp_path / "nope").run(["true"], timeout=10)


def test_nothing_listening_fails_after_retries_with_backoff(tmp_path):
    port = simsshd.free_port()
    waits = []
    t = SSHTransport(SSHConfig(host="127.0.0.1", port=port, connect_timeout=2, retries=2), sleep=waits.append)
    with pytest.raises(TransportError, match="after 3 attempts") as e:
        t.run(["true"], timeout=5)
    assert waits == [0.5, 1.0] and e.value.exit_code == 3


def test_devices_add_trust_flow(cli, sshd_server, home):
    from edgekit.devices.inventory import edgekit_known_hosts, get_device

    args = ["devices", "add", "b1", "--target", "local", "--host", sshd_server.host, "--port", sshd_server.port,
            "--user", sshd_server.user, "--key", sshd_server.client_key, "--workdir", str(home / "dev"),
            "--python", sys.executable]
    r = cli(*args)
    assert r.exit_code == 3 and "is not known: ssh-ed25519 SHA256:" in r.stderr and "--trust" in r.stderr
    r = cli(*args, "--trust")
    assert r.exit_code == 0, r.stderr
    assert "SHA256:" in r.stderr and f"[{sshd_server.host}]:{sshd_server.port}" in edgekit_known_hosts().read_text()
    assert get_device("b1").port == sshd_server.port
    r = cli("devices", "check", "b1", "--json")
    assert r.exit_code == 0, r.stderr
    assert '"matches_target": true' in r.stdout and '"onnxruntime"' in r.stdout and '"disk_free_mb"' in r.stdout


def test_devices_add_refuses_a_changed_key_even_with_trust(cli, sshd_server, home, tmp_path):
    from edgekit.devices.inventory import edgekit_known_hosts

    other = simsshd.keygen(tmp_path / "old_key")
    edgekit_known_hosts().parent.mkdir(parents=True, exist_ok=True)
    edgekit_known_hosts().write_text(f"[{sshd_server.host}]:{sshd_server.port} "
                                     f"{' '.join(Path(f'{other}.pub').read_text().split()[:2])}\n")
    r = cli("devices", "add", "b2", "--target", "local", "--host", sshd_server.host, "--port", sshd_server.port,
            "--trust")
    assert r.exit_code == 3 and "HOST KEY CHANGED" in r.stderr
    from edgekit.devices.inventory import load_inventory

    assert load_inventory().devices == []
