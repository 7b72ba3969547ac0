"""The arm64 Raspberry Pi OS twin, end to end, as a user runs it (the `edgekit` console script):

    edgekit sim up pi-arm --arch arm64          # Debian bookworm arm64 under qemu, in its own netns
    edgekit devices check pi-arm                # aarch64, Python 3.11, the aarch64 runtimes
    edgekit deploy ... --target rpi4 --device pi-arm
    edgekit sim down pi-arm

Real components only: debootstrap'd arm64 Debian, the kernel's binfmt_misc + qemu-aarch64, Debian's
arm64 OpenSSH and Python 3.11, aarch64 wheels of onnxruntime / ai-edge-litert / numpy from PyPI
installed over SSH, the real agent. Needs root (chroot, mount and network namespaces) and the
packages `qemu-user-static binfmt-support debootstrap` (.ci/install.sh installs them).

The rootfs and the aarch64 wheelhouse are cached across runs in ~/.cache/edgekit (override with
EDGEKIT_ROOTFS_CACHE / EDGEKIT_TEST_WHEELHOUSE): a fresh machine builds them once (~2-3 min).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import run_edgekit_subprocess

pytestmark = [pytest.mark.emu, pytest.mark.root, pytest.mark.slow]

NAME = "pi-arm"
CACHE = Path(os.path.expanduser("~/.cache/edgekit"))
# Accuracy on the twin must equal the host's within this many points (363 eval samples: one sample
# is 0.28 points; aarch64 and x86 kernels may round one borderline sample differently).
ACCURACY_TOLERANCE = 0.6


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (chroot, mounts, network namespaces)"
    for tool in ("debootstrap", "qemu-aarch64-static", "update-binfmts", "ip", "unshare", "ssh-keygen"):
        if not (shutil.which(tool) or os.path.exists(f"/usr/sbin/{tool}")):
            return (f"`{tool}` is not installed (apt-get install -y qemu-user-static binfmt-support debootstrap "
                    "iproute2 openssh-client; .ci/install.sh does it)")
    return None


if _missing():
    pytestmark.append(pytest.mark.skip(reason=_missing()))


def _ok(res, what: str):
    assert res.exit_code == 0, f"{what} failed (exit {res.exit_code}):\n{res.stdout}\n{res.stderr}"
    return res


def started_twin(name: str, target: str, runtimes: list[str], tag: str):
    """`edgekit sim up NAME --arch arm64 --target TARGET --runtime R...` from the target's cached wheelhouse
    (downloaded once: ~/.cache/edgekit/wheelhouse/TARGET-py3.11, or $EDGEKIT_TEST_ET_WHEELHOUSE), yielding
    its JSON; stopped by PID afterwards. A generator for module fixtures (``yield from``)."""
    from edgekit.devices.provision import build_wheelhouse, wheelhouse_lacks
    from edgekit.inputs.targets import load_target

    old_cache = os.environ.get("EDGEKIT_ROOTFS_CACHE")
    os.environ["EDGEKIT_ROOTFS_CACHE"] = old_cache or str(CACHE / "rootfs")
    wh = Path(os.environ.get("EDGEKIT_TEST_ET_WHEELHOUSE", str(CACHE / "wheelhouse" / f"{target}-py3.11")))
    spec = load_target(target)
    t0 = time.perf_counter()
    if wheelhouse_lacks(spec, wh, runtimes):
        build_wheelhouse(spec, wh, runtimes=runtimes)
    mb = sum(w.stat().st_size for w in wh.glob("*.whl")) / 2**20
    print(f"\n[{tag}] wheelhouse ready in {time.perf_counter() - t0:.1f} s ({wh}, {mb:.0f} MB)")
    t0 = time.perf_counter()
    res = run_edgekit_subprocess("sim", "up", name, "--arch", "arm64", "--target", target,
                                 *[a for r in runtimes for a in ("--runtime", r)], "--wheelhouse", wh, "--json",
                                 timeout=1800)
    try:
        _ok(res, f"edgekit sim up --arch arm64 --target {target} {' '.join('--runtime ' + r for r in runtimes)}")
        doc = json.loads(res.stdout)
        print(f"[{tag}] sim up with {' + '.join(runtimes)}: {time.perf_counter() - t0:.1f} s; "
              f"timings {doc['timings']}")
        yield doc
    finally:
        from edgekit.devices.sim_device import _state_file
        from edgekit.devices.sim_device import down as sim_down

        if _state_file(name).is_file():
            sim_down(name)
        if old_cache is None:
            os.environ.pop("EDGEKIT_ROOTFS_CACHE", None)


@pytest.fixture(scope="module")
def recipe(tmp_path_factory, digits) -> Path:
    """fp32 + static INT8 (ONNX); plus TFLite INT8 when the converter's `convert` step is registered."""
    from edgekit.pass_names import known_passes

    lines = ["baseline: fp32", "variants:", "  - name: int8-static", "    passes:",
             "      - quantize: {mode: static, format: qdq, per_channel: true}"]
    if "convert" in known_passes():
        lines += ["  - name: tflite-int8", "    passes:", "      - convert: {to: tflite, precision: int8, io: float}"]
    lines += ["measure: {warmup: 2, runs: 10, min_seconds: 0.2}", "gate: {max_accuracy_drop: 2.0}"]
    p = tmp_path_factory.mktemp("arm64-recipe") / "recipe.yaml"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.fixture(scope="module")
def twin():
    """`edgekit sim up pi-arm --arch arm64`, torn down by `edgekit sim down pi-arm` (and by PID if
    that fails)."""
    old_cache = os.environ.get("EDGEKIT_ROOTFS_CACHE")
    os.environ["EDGEKIT_ROOTFS_CACHE"] = old_cache or str(CACHE / "rootfs")  # the CLI and in-process checks
    wh = Path(os.environ.get("EDGEKIT_TEST_WHEELHOUSE", str(CACHE / "wheelhouse" / "rpi4-py3.11")))
    from edgekit.devices.provision import build_wheelhouse
    from edgekit.inputs.targets import load_target

    t0 = time.perf_counter()
    if not any(wh.glob("onnxruntime-*.whl")):
        build_wheelhouse(load_target("rpi4"), wh)  # pip download, the four aarch64 platform tags
    print(f"\n[arm64] wheelhouse ready in {time.perf_counter() - t0:.1f} s ({wh})")
    t0 = time.perf_counter()
    res = run_edgekit_subprocess("sim", "up", NAME, "--arch", "arm64", "--wheelhouse", wh, "--json",
                                 timeout=1800)
    try:
        _ok(res, "edgekit sim up --arch arm64")
        doc = json.loads(res.stdout)
        doc["wall_seconds"] = round(time.perf_counter() - t0, 1)
        print(f"[arm64] sim up: {doc['wall_seconds']} s; timings {doc['timings']}")
        yield doc
    finally:
        from edgekit.devices.sim_device import _state_file
        from edgekit.devices.sim_device import down as sim_down

        if _state_file(NAME).is_file():  # a test failed before test_sim_down: stop it by PID
            sim_down(NAME)
        if old_cache is None:
            os.environ.pop("EDGEKIT_ROOTFS_CACHE", None)


def test_twin_is_an_aarch64_python311_device_with_its_runtimes(twin):
    assert twin["arch"] == "arm64" and twin["running"] is True
    res = _ok(run_edgekit_subprocess("devices", "check", NAME, "--json", timeout=300), "devices check")
    doc = json.loads(res.stdout)
    assert doc["device"]["arch"] == "aarch64", doc["device"]
    assert doc["device"]["python"].startswith("3.11."), doc["device"]
    assert "onnxruntime" in doc["runtimes"] and "litert" in doc["runtimes"], doc["runtimes"]
    assert doc["matches_target"] is True, doc["problems"]
    assert doc["device"]["hostname"] == NAME  # its own UTS namespace
    assert any("emulated" in n for n in doc["notes"]), doc["notes"]


def test_twin_has_no_network_beyond_its_link(twin):
    """The runtimes came from the host's wheelhouse: the twin itself has no route anywhere."""
    from edgekit.devices.inventory import get_device, transport_for

    entry = get_device(NAME)
    assert entry.emulated is True and entry.python and "PYTHONPATH" in entry.python
    t = transport_for(entry)
    try:
        code = ("import socket\ns = socket.socket(); s.settimeout(5)\n"
                "try:\n    s.connect(('1.1.1.1', 443)); print('REACHED')\n"
                "except OSError as e:\n    print('UNREACHABLE', e.errno)\n")
        res = t.run(["/usr/bin/python3", "-c", code], timeout=120)
        uname = t.run(["uname", "-m"], timeout=60)
    finally:
        t.close()
    assert res.ok and res.stdout.startswith("UNREACHABLE"), res
    assert uname.stdout.strip() == "aarch64"


def test_deploy_to_twin_matches_host_accuracy(twin, digits, recipe, tmp_path):
    common = [digits.pt2, "--eval-data", digits.eval, "--calib-data", digits.calib, "--recipe", recipe]
    t0 = time.perf_counter()
    res = run_edgekit_subprocess("deploy", *common, "--target", "rpi4", "--device", NAME,
                                 "--out", tmp_path / "twin", timeout=1800)
    deploy_s = time.perf_counter() - t0
    _ok(res, "deploy to the arm64 twin")
    host = _ok(run_edgekit_subprocess("deploy", *common, "--target", "local", "--out", tmp_path / "host",
                                      timeout=900), "deploy on the host")
    del host
    on_twin = json.loads((tmp_path / "twin" / "report.json").read_text())
    on_host = json.loads((tmp_path / "host" / "report.json").read_text())

    dev = on_twin["device"]
    assert dev["arch"] == "aarch64" and dev["python"].startswith("3.11.")
    assert dev["emulated"] is True and dev["latency_representative"] is False
    assert any("emulated" in w and "NOT representative" in w for w in on_twin["warnings"]), on_twin["warnings"]
    assert "emulated" in (tmp_path / "twin" / "report.md").read_text()
    assert not on_host["device"].get("emulated")

    host_acc = {v["name"]: v["accuracy"]["value"] for v in on_host["variants"]}
    lines = [f"[arm64] deploy to the twin: {deploy_s:.1f} s"]
    for v in on_twin["variants"]:
        name, acc = v["name"], v["accuracy"]["value"]
        assert v["accuracy"]["n"] == on_host["variants"][0]["accuracy"]["n"]
        assert abs(acc - host_acc[name]) <= ACCURACY_TOLERANCE, (name, acc, host_acc[name])
        assert v["runtime"]["name"] in ("onnxruntime", "litert")
        assert v["parity"]["top1_agreement"] >= 0.99, (name, v["parity"])
        if v["name"] == "fp32":
            assert v["parity"]["max_abs_err"] < 1e-3, v["parity"]
        lines.append(f"[arm64] {name} ({v['format']}, {v['runtime']['name']} {v['runtime'].get('version')}): "
                     f"accuracy twin {acc:.2f} vs host {host_acc[name]:.2f}; parity max_abs_err "
                     f"{v['parity']['max_abs_err']:.2e}; p50 twin {v['latency_ms']['p50']:.3f} ms (emulated)")
    print("\n".join(lines))


def test_sim_down_cleans_up_and_keeps_the_rootfs(twin):
    from edgekit.devices.inventory import load_inventory
    from edgekit.devices.sim_arm64 import rootfs_dir
    from edgekit.devices.sim_device import sim_root
    from edgekit.sim.procs import alive

    merged = str(sim_root() / NAME / "root")

    def rooted_in_twin() -> list[str]:
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    if os.readlink(d / "root") == merged:
                        out.append(d.name)
                except OSError:
                    pass
        return out

    assert rooted_in_twin(), "the twin's sshd should run chrooted in its overlay"
    _ok(run_edgekit_subprocess("sim", "down", NAME, timeout=120), "sim down")
    assert not alive(twin["pid"])
    assert NAME not in [d.name for d in load_inventory().devices]
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert twin["netns"]["name"] not in ns.split()
    assert rooted_in_twin() == []  # nothing left inside the twin's filesystem (its mounts die with it)
    assert not (sim_root() / NAME).exists()
    assert (rootfs_dir() / ".edgekit-rootfs.json").is_file()  # cached for the next `sim up`
