"""Install the agent's runtime on a device without the device needing internet.

1. On the host: ``pip download --only-binary=:all: --python-version X --platform P ...`` the target's
   ``wheels`` (targets/*.yaml) into a wheelhouse (cached in ``$EDGEKIT_HOME/wheelhouse/``).
2. Push the wheels content-addressed and hash-verified (the bundle's delivery: unchanged wheels are
   never re-sent), give them back their wheel file names on the device (symlinks), and run
   ``pip install --no-index --find-links`` into ``WORKDIR/site``: no root, no venv, no PEP 668 clash.
3. The device's python command becomes ``env PYTHONPATH=WORKDIR/site python3``.

A target's ``wheels.runtime_packages`` adds a runtime's own wheels (ExecuTorch: a CPU torch and
executorch) only when that runtime is asked for (``runtimes=``; `devices provision --runtime`), so the
default provisioning stays the light one. Their ``no_deps`` pins are downloaded and installed with
``--no-deps``: pip evaluates requirement markers against the host that runs it, so downloading torch
for aarch64 on an x86-64 host with its dependencies would chase its x86-only nvidia-* requirements.
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..agent.bundle import BundleDeployer
from ..errors import BadInputError, DeviceError
from ..formats import spec_for_runtime
from ..inputs.targets import TargetSpec
from ..paths import wheelhouse_root
from ..transport.base import Transport
from . import llama_cpp_build

PIP_TIMEOUT_S = 1800.0


@dataclass
class ProvisionResult:
    python: str  # the python command to use from now on
    installed: list[str]
    wheels_sent: int
    wheels_reused: int
    bytes_sent: int
    skipped: bool = False


def default_wheelhouse(spec: TargetSpec) -> Path:
    ver = spec.wheels.python_version if spec.wheels else "any"
    return wheelhouse_root() / f"{spec.name}-py{ver}"


def runtime_wheels(spec: TargetSpec, runtimes: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """(packages, no_deps pins) the named runtimes add to the target's wheels; an unknown name is refused."""
    table = spec.wheels.runtime_packages if spec.wheels else {}
    packages: list[str] = []
    no_deps: list[str] = []
    for r in runtimes:
        if r not in spec.runtimes:
            raise BadInputError(f"target '{spec.name}' has no runtime '{r}'",
                                hint=f"its runtimes: {', '.join(spec.runtimes)}")
        extra = table.get(r)
        if extra is None:
            row = spec_for_runtime(r)
            names = {re.split(r"[<>=!~;\[ ]", p, maxsplit=1)[0].lower()
                     for p in (spec.wheels.packages if spec.wheels else ())}
            if row is not None and row.packages and not any(pk.dist.lower() in names for pk in row.packages):
                raise BadInputError(f"target '{spec.name}' names no device wheels for the {r} runtime",
                                    hint=f"add wheels.runtime_packages.{r} to the target file (see targets/rpi5.yaml)"
                                         + ("; on a Cortex-A72 (Raspberry Pi 4) PyPI has no torch/executorch pair "
                                            "that runs: see docs/runtimes/executorch.md" if r == "executorch" else ""))
            continue  # its wheels are among the target's packages
        packages += [p for p in extra.packages if p not in packages]
        no_deps += [p for p in (*extra.no_deps, *extra.host_built) if p not in no_deps]
    return packages, no_deps


def host_built_wheels(spec: TargetSpec, runtimes: Sequence[str] = ()) -> list[str]:
    """The pins among the named runtimes' wheels that edgekit builds on this host (``host_built``)."""
    table = spec.wheels.runtime_packages if spec.wheels else {}
    return [p for r in runtimes if r in table for p in table[r].host_built]


def build_host_wheel(spec: TargetSpec, pin: str, dest: Path, progress: Callable[[str], None]) -> Path:
    """Build the wheel ``pin`` names for the device into ``dest`` (edgekit knows how for llama-cpp-python: the
    binding with llama.cpp cross-compiled for the target's ``march``; devices/llama_cpp_build.py)."""

    name, _, version = pin.partition("==")
    if re.sub(r"[-_.]+", "-", name.strip().lower()) != "llama-cpp-python":
        raise BadInputError(f"target '{spec.name}': edgekit cannot build {pin} on the host (host_built knows "
                            "llama-cpp-python only)", hint="move it to `packages` or `no_deps` to download it")
    if version.strip() != llama_cpp_build.VERSION:
        raise BadInputError(f"target '{spec.name}' asks for {pin}; this edgekit builds llama-cpp-python "
                            f"{llama_cpp_build.VERSION} (its GGUF files are written by that version's converter)",
                            hint=f"host_built: [llama-cpp-python=={llama_cpp_build.VERSION}]")
    if not spec.march:
        raise BadInputError(f"target '{spec.name}' has no `march`: llama.cpp is compiled for the device's cores",
                            hint="add e.g. `march: armv8.2-a+dotprod+fp16` (Cortex-A76) to the target file")
    wheel = llama_cpp_build.board_wheel(llama_cpp_build.BoardBuild(spec.arch, spec.march), say=progress)
    out = Path(dest) / wheel.name
    if not out.is_file() or out.read_bytes() != wheel.read_bytes():
        tmp = out.with_name(out.name + ".part")
        shutil.copyfile(wheel, tmp)
        os.replace(tmp, out)
    return out


def download_command(spec: TargetSpec, dest: Path, packages: list[str] | None = None, *,
                     no_deps: bool = False) -> list[str]:
    if spec.wheels is None or not (packages or spec.wheels.packages):
        raise BadInputError(f"target '{spec.name}' names no wheels to provision",
                            hint="add a `wheels:` section (python_version, platforms, packages) to the target file")
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--only-binary=:all:",
            "--python-version", spec.wheels.python_version, "--implementation", "cp", "-d", str(dest)]
    for p in spec.wheels.platforms:
        argv += ["--platform", p]
    wanted = packages or spec.wheels.packages
    if no_deps:
        return [*argv, "--no-deps", *wanted]
    # pip itself rides along: a device python without pip runs pip straight from its wheel
    return [*argv, "pip", *wanted]


def build_wheelhouse(spec: TargetSpec, dest: Path | None = None, packages: list[str] | None = None,
                     progress: Callable[[str], None] = lambda m: None, *, runtimes: Sequence[str] = ()) -> Path:
    """Download the target's wheels (plus the named runtimes' extra wheels) on this host (the one step
    that needs a package index)."""
    dest = Path(dest or default_wheelhouse(spec))
    dest.mkdir(parents=True, exist_ok=True)
    extra, pins = runtime_wheels(spec, runtimes)
    base = list(packages or (spec.wheels.packages if spec.wheels else ()))
    progress(f"downloading wheels for {spec.name} into {dest}")
    _pip_download(spec, download_command(spec, dest, base + [p for p in extra if p not in base]))
    built = host_built_wheels(spec, runtimes)
    pins = [p for p in pins if p not in built]
    if pins:
        progress(f"downloading {', '.join(pins)} (without their declared dependencies) into {dest}")
        _pip_download(spec, download_command(spec, dest, pins, no_deps=True))
    for pin in built:
        progress(f"building {pin} for {spec.name} on this host")
        build_host_wheel(spec, pin, dest, progress)
    return dest


def ensure_wheelhouse(spec: TargetSpec, wheelhouse: Path | None = None, runtimes: Sequence[str] = (),
                      progress: Callable[[str], None] = lambda m: None) -> tuple[Path, bool]:
    """The wheelhouse to provision from, and whether it was downloaded now: ``wheelhouse`` as given, or
    the cached default one, downloaded when it lacks the target's or the named runtimes' wheels. A
    runtime the target cannot provision is refused before any download."""
    runtime_wheels(spec, runtimes)
    if wheelhouse is not None:
        return Path(wheelhouse), False
    wh = default_wheelhouse(spec)
    if not wheelhouse_lacks(spec, wh, runtimes):
        for pin in host_built_wheels(spec, runtimes):  # the cached build may be newer than the wheelhouse's copy
            build_host_wheel(spec, pin, wh, progress)
        return wh, False
    return build_wheelhouse(spec, wh, progress=progress, runtimes=runtimes), True


def wheelhouse_lacks(spec: TargetSpec, wheelhouse: Path, runtimes: Sequence[str] = ()) -> bool:
    """Whether ``wheelhouse`` needs a download: no wheels at all, or no wheel for one of the
    named runtimes' packages (at its pinned version where pinned; checked by file name, no index is asked)."""
    wheels = [w.name.lower() for w in Path(wheelhouse).glob("*.whl")]
    if not wheels:
        return True
    packages, no_deps = runtime_wheels(spec, runtimes)
    pins = [p if "==" in p else re.split(r"[<>=!~;\[ ]", p, maxsplit=1)[0] for p in [*packages, *no_deps]]
    return any(not any(_pin_pattern(pin).match(w) for w in wheels) for pin in pins)


def _pin_pattern(pin: str) -> re.Pattern[str]:
    """The wheel file names a ``NAME==VERSION`` pin matches: NAME-VERSION[+local]-TAGS.whl (wheel
    file names spell the project in lower case with underscores)."""
    name, _, version = pin.partition("==")
    return re.compile(re.escape(re.sub(r"[-_.]+", "_", name.strip().lower())) + "-"
                      + (re.escape(version.strip()) + r"[-+]" if version.strip() else ""))


def _pip_download(spec: TargetSpec, argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    if proc.returncode != 0:
        raise DeviceError(f"pip download for {spec.name} failed: {proc.stderr.strip()[-800:]}",
                          hint="this step needs a package index; or pass --wheelhouse DIR with the wheels "
                               "already downloaded")


def _wheels(wheelhouse: Path) -> list[Path]:
    if not wheelhouse.is_dir():
        raise BadInputError(f"wheelhouse {wheelhouse} does not exist",
                            hint="run `edgekit devices provision NAME` once with a package index reachable, "
                                 "or pass --wheelhouse DIR")
    wheels = sorted(wheelhouse.glob("*.whl"))
    if not wheels:
        raise BadInputError(f"wheelhouse {wheelhouse} holds no .whl files")
    return wheels


def provision(transport: Transport, spec: TargetSpec, wheelhouse: Path, *, packages: list[str] | None = None,
              progress: Callable[[str], None] = lambda m: None, timeout: float = PIP_TIMEOUT_S,
              runtimes: Sequence[str] = ()) -> ProvisionResult:
    """Install ``packages`` (default: the target's) and the named ``runtimes``' extra wheels
    (``wheels.runtime_packages``) on the device from ``wheelhouse``."""

    extra, pins = runtime_wheels(spec, runtimes)
    want = list(packages or (spec.wheels.packages if spec.wheels else ()))
    want += [p for p in extra if p not in want]
    if not want and not pins:
        raise BadInputError(f"nothing to provision for target '{spec.name}'", hint="pass --package NAME")
    t = transport
    wheels = _wheels(Path(wheelhouse))
    # a runtime's pinned wheels travel only when that runtime is asked for (torch alone is ~146 MB)
    unasked = [_pin_pattern(p) for r, rw in (spec.wheels.runtime_packages if spec.wheels else {}).items()
               for p in (*rw.no_deps, *rw.host_built) if p not in pins]
    wheels = [w for w in wheels if not any(m.match(w.name.lower()) for m in unasked)]
    missing = [p for p in pins if not any(_pin_pattern(p).match(w.name.lower()) for w in wheels)]
    if missing:
        raise BadInputError(f"wheelhouse {wheelhouse} has no wheel for {', '.join(missing)}",
                            hint="let edgekit download it (no --wheelhouse) or add the wheel to the folder")
    deployer = BundleDeployer(t)
    _ = deployer.agent  # installed first, so the counts below are the wheels' alone
    deployer.stats = type(deployer.stats)()
    progress(f"sending {len(wheels)} wheels (content-addressed)")
    remote = deployer.deliver(wheels, kind="wheel")
    wh = t.remote_path("wheelhouse")
    site = t.remote_path("site")
    _check(t, ["mkdir", "-p", wh, site], "creating the wheelhouse folder", 60)
    for w in wheels:  # pip reads the version and platform from the file name
        _check(t, ["ln", "-sf", remote[w], posixpath.join(wh, w.name)], f"naming {w.name}", 60)
    base_python = _base_python(t.python)
    pip = [base_python, "-m", "pip"]
    if not t.run([*pip, "--version"], timeout=60).ok:
        pip_wheel = next((w for w in wheels if w.name.startswith("pip-")), None)
        if pip_wheel is None:
            raise DeviceError("the device's python has no pip and the wheelhouse has no pip wheel",
                              hint="rebuild the wheelhouse (it downloads pip along)")
        pip = [base_python, posixpath.join(wh, pip_wheel.name, "pip")]
    progress(f"pip install --no-index {' '.join(want)} on the device")
    res = t.run([*pip, "install", "--disable-pip-version-check", "--no-index", "--find-links", wh,
                 "--target", site, "--upgrade", *want], timeout=timeout)
    if not res.ok:
        raise DeviceError(f"pip install on the device failed (exit {res.returncode}): "
                          f"{(res.stderr or res.stdout).strip()[-800:]}",
                          hint="the wheelhouse may not match the device's Python or platform "
                               "(see the target's wheels: section and `edgekit devices check`)")
    if pins:
        progress(f"pip install --no-index --no-deps {' '.join(pins)} on the device")
        res = t.run([*pip, "install", "--disable-pip-version-check", "--no-index", "--no-deps", "--find-links", wh,
                     "--target", site, "--upgrade", *pins], timeout=timeout)
        if not res.ok:
            raise DeviceError(f"pip install --no-deps {' '.join(pins)} on the device failed (exit {res.returncode}): "
                              f"{(res.stderr or res.stdout).strip()[-800:]}",
                              hint="the wheelhouse may not match the device's Python or platform")
    python = f"env PYTHONPATH={shlex.quote(site)} {base_python}"
    return ProvisionResult(python=python, installed=want + pins, wheels_sent=deployer.stats.files_sent,
                           wheels_reused=deployer.stats.files_reused, bytes_sent=deployer.stats.bytes_sent)


def _base_python(python: str) -> str:
    """The interpreter word of a python command (drops an earlier provisioning's env prefix)."""
    words = shlex.split(python)
    if words and words[0] == "env":
        words = [w for w in words[1:] if "=" not in w]
    return words[0] if words else "python3"


def _check(t: Transport, argv: list[str], what: str, timeout: float) -> None:
    res = t.run(argv, timeout=timeout)
    if not res.ok:
        raise DeviceError(f"{what} on the device failed: {(res.stderr or res.stdout).strip()[-400:]}")
