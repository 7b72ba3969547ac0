"""The arm64 twin's host-side pieces that run without root or qemu: the cache location, the twin's
own overlay layer (keys, sshd_config with in-twin paths, fake cpu topology), purge, bad input, and
how a deploy report marks an emulated device. The twin itself: tests/integration/test_arm64_twin.py."""

from __future__ import annotations

import json
import shutil

import pytest

from edgekit.devices import sim_arm64 as arm64
from edgekit.errors import BadInputError, DeviceError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_ROOTFS_CACHE", str(tmp_path / "rootfs-cache"))
    return tmp_path / "rootfs-cache"


def test_cache_location_honours_env(tmp_path, monkeypatch):
    monkeypatch.delenv("EDGEKIT_ROOTFS_CACHE", raising=False)
    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path / "home"))
    assert arm64.rootfs_cache_root() == tmp_path / "home" / "cache" / "rootfs"
    monkeypatch.setenv("EDGEKIT_ROOTFS_CACHE", str(tmp_path / "elsewhere"))
    assert arm64.rootfs_dir().parent == tmp_path / "elsewhere"
    assert arm64.rootfs_dir().name == f"debian-bookworm-arm64-v{arm64.ROOTFS_VERSION}"


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="ssh-keygen not installed (openssh-client)")
def test_prepare_twin_writes_its_own_layer_with_in_twin_paths(tmp_path):
    twin = arm64.prepare_twin(tmp_path / "pi-arm", "pi-arm", "10.213.7.2", cores=2)
    up = twin.upper
    cfg = (up / "etc/edgekit-sim/pi-arm/sshd_config").read_text()
    assert twin.sshd_config == "/etc/edgekit-sim/pi-arm/sshd_config"
    # paths in the config are the twin's, never this host's folder
    assert "HostKey /etc/edgekit-sim/pi-arm/host_ed25519" in cfg and str(tmp_path) not in cfg
    assert "ListenAddress 10.213.7.2" in cfg and "PasswordAuthentication no" in cfg
    # sessions are emulated as the Pi 4's core, not qemu's `max` CPU (see arm64.QEMU_CPUS)
    assert "SetEnv QEMU_CPU=cortex-a72" in cfg and twin.qemu_cpu == "cortex-a72"
    assert (up / "etc/edgekit-sim/pi-arm/authorized_keys").read_text() == \
        (tmp_path / "pi-arm/client_ed25519.pub").read_text()
    assert not (up / "etc/edgekit-sim/pi-arm/client_ed25519").exists()  # the private client key stays out
    for f in ("possible", "present"):
        assert (up / "sys/devices/system/cpu" / f).read_text() == "0-1\n"
    kh = twin.write_known_hosts(tmp_path / "kh").read_text()
    assert kh.startswith("10.213.7.2 ssh-ed25519 ")
    other = arm64.prepare_twin(tmp_path / "b", "b", "10.213.8.2", cores=1)
    assert (other.upper / "sys/devices/system/cpu/possible").read_text() == "0\n"
    assert (other.upper / "etc/machine-id").read_text() != (up / "etc/machine-id").read_text()


def test_the_twin_shows_the_board_s_cores_as_openvino_and_hwloc_read_them(tmp_path):
    """Per core: MIDR_EL1 (OpenVINO's CPU plugin reads it), topology lists and the masks hwloc needs (without
    them OpenVINO segfaulted under qemu), a /sys/bus/cpu link; a /proc/cpuinfo of the board's cores."""
    twin = arm64.prepare_twin(tmp_path / "pi5", "pi5", "10.213.7.2", cores=2, qemu_cpu="cortex-a76")
    cpu = twin.upper / "sys/devices/system/cpu"
    assert (cpu / "cpu1/regs/identification/midr_el1").read_text() == "0x00000000414fd0b1\n"
    assert [(cpu / f"cpu{i}/topology/core_cpus").read_text() for i in (0, 1)] == ["1\n", "2\n"]
    assert (cpu / "cpu0/topology/package_cpus").read_text() == "3\n"
    assert (cpu / "cpu1/topology/thread_siblings").read_text() == "2\n"
    assert (twin.upper / "sys/bus/cpu/devices/cpu1").resolve() == (cpu / "cpu1").resolve()
    info = (twin.upper / "etc/edgekit-sim/pi5/cpuinfo").read_text()
    assert info.count("processor\t:") == 2 and "CPU part\t: 0xd0b" in info and "asimddp" in info
    pi4 = arm64.fake_cpuinfo(1, "cortex-a72")
    assert "CPU part\t: 0xd08" in pi4 and " aes " not in pi4  # the Pi 4's BCM2711 has no crypto extensions
    assert "mount --bind" in arm64._LAUNCH_SH and "/proc/cpuinfo" in arm64._LAUNCH_SH


def test_paths_an_overlay_cannot_take_are_refused(tmp_path):
    with pytest.raises(BadInputError, match="overlay"):
        arm64.prepare_twin(tmp_path / "a,b", "x", "10.213.9.2")


def test_not_root_is_a_clear_device_error(monkeypatch):
    monkeypatch.setattr(arm64.os, "geteuid", lambda: 1000)
    with pytest.raises(DeviceError, match="needs root") as exc:
        arm64.ensure_host()
    assert exc.value.exit_code == 3


def test_cached_rootfs_is_reused_without_building(cache):
    final = arm64.rootfs_dir()
    final.mkdir(parents=True)
    (final / arm64.STAMP).write_text(json.dumps({"python": "3.11.2"}))
    r = arm64.ensure_rootfs()
    assert r.built is False and r.path == final and r.info["python"] == "3.11.2"


def test_purge_deletes_the_cache_but_not_while_a_twin_uses_it(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path / "home"))
    final = arm64.rootfs_dir()
    final.mkdir(parents=True)
    (final / arm64.STAMP).write_text("{}")
    from edgekit.devices.sim_device import SimState, sim_root

    st = SimState(name="pi-arm", mode="netns", target="rpi4", host="10.213.1.2", port=22, pid=1,
                  sshd_config="/etc/edgekit-sim/pi-arm/sshd_config", arch="arm64", rootfs=str(final))
    (sim_root() / "pi-arm").mkdir(parents=True)
    (sim_root() / "pi-arm" / "state.json").write_text(st.model_dump_json())
    with pytest.raises(BadInputError, match="in use by pi-arm"):
        arm64.purge_rootfs()
    assert final.is_dir()
    shutil.rmtree(sim_root() / "pi-arm")
    assert arm64.purge_rootfs() == [final]
    assert not final.exists()


def test_report_marks_an_emulated_device(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path / "home"))
    from edgekit.devices.inventory import DeviceEntry, add_device
    from edgekit.inputs.targets import load_target
    from edgekit.pipeline import deploy as pipeline
    from edgekit.transport.local import LocalTransport

    add_device(DeviceEntry(name="twin", target="rpi4", host="10.213.1.2", user="root", sim=True, emulated=True,
                           notes="arm64 twin under qemu user emulation"))
    add_device(DeviceEntry(name="board", target="rpi4", host="192.0.2.10", user="pi"))
    assert pipeline._emulation("twin") == "arm64 twin under qemu user emulation"
    assert pipeline._emulation("board") is None and pipeline._emulation(None) is None
    facts = pipeline._device_info({"device": {"arch": "aarch64"}}, LocalTransport(str(tmp_path / "d")), "twin",
                                  load_target("rpi4"), [], pipeline._emulation("twin"))
    assert facts["emulated"] is True and facts["latency_representative"] is False
    plain = pipeline._device_info({"device": {"arch": "aarch64"}}, LocalTransport(str(tmp_path / "d")), "board",
                                  load_target("rpi4"), [], None)
    assert "emulated" not in plain


def test_cli_rejects_an_unknown_arch_and_a_bare_down(cli):
    r = cli("sim", "up", "x", "--arch", "riscv64")
    assert r.exit_code == 2 and "native, arm64" in r.stderr
    r = cli("sim", "down")
    assert r.exit_code == 2 and "--purge" in r.stderr
