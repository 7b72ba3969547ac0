"""What a target needs on this host, whether it is here, and what sets it up (`edgekit setup`, `edgekit doctor`).

A requirement is either one edgekit installs itself (the browser's web runtimes from the packaged lockfile, the
arm64 twin's root filesystem) or one the user installs (Chromium, npm, a Python extra), named with its command.
Checks are file and PATH look-ups only, so `edgekit doctor` stays fast; nothing here imports a framework.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

from ..agent.browser_transport import chromium_path
from ..errors import DeviceError
from ..inputs.targets import TargetSpec, list_targets, load_target
from ..transport.web_runtimes import find, install, versions
from . import sim_arm64 as arm64
from .llama_cpp_build import CROSS  # the triplets edgekit cross-builds for

Say = Callable[[str], None]
TWIN = "arm64-twin"  # the emulated Raspberry Pi OS twin (`edgekit sim up NAME --arch arm64`), set up with --twin
TWIN_SETUP = "edgekit setup --twin"


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class Requirement:
    name: str
    purpose: str
    check: Callable[[], str | None]  # where it is when present, else None
    fix: str  # the command that sets it up or installs it
    setup: Callable[[Say], str] | None = None  # edgekit sets it up (returns where); None: the user runs `fix`


# one requirement's row in `edgekit doctor --json` ("for" is a Python keyword: the functional form)
StatusDoc = TypedDict("StatusDoc", {"target": str, "requirement": str, "for": str, "present": bool,
                                    "where": str | None, "fix": str | None, "by_edgekit": bool})


@dataclass
class Status:
    target: str
    requirement: str
    purpose: str
    present: bool
    where: str | None
    fix: str
    by_edgekit: bool  # `edgekit setup` installs it

    def as_dict(self) -> StatusDoc:
        return {"target": self.target, "requirement": self.requirement, "for": self.purpose, "present": self.present,
                "where": self.where, "fix": None if self.present else self.fix, "by_edgekit": self.by_edgekit}


def _which(name: str, sbin: bool = False) -> Callable[[], str | None]:
    def check() -> str | None:
        return shutil.which(name) or (shutil.which(name, path="/usr/sbin:/sbin") if sbin else None)

    return check


def _web_runtimes_check() -> str | None:
    found = find()
    if found is None:
        return None
    v = ", ".join(f"{k} {ver}" for k, ver in versions(found.node_modules).items() if ver)
    return f"{found.node_modules} ({found.source}; {v})"


def _web_runtimes_setup(say: Say) -> str:
    found = install(say)
    return f"{found.node_modules} ({found.source})"


def _chromium_check() -> str | None:
    try:
        return chromium_path()
    except DeviceError:
        return None


def _module(name: str) -> Callable[[], str | None]:
    def check() -> str | None:
        from importlib import metadata

        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            return None

    return check


def _rootfs_check() -> str | None:
    d = arm64.rootfs_dir()
    return str(d) if (d / arm64.STAMP).is_file() else None


def _rootfs_setup(say: Say) -> str:
    arm64.ensure_host()  # root, the tools, qemu-aarch64 registered with binfmt_misc
    rootfs = arm64.ensure_rootfs(say)
    return f"{rootfs.path} ({'built' if rootfs.built else 'cached'} in {rootfs.seconds:.0f} s)"


def _root_check() -> str | None:
    return "root" if os.geteuid() == 0 else None


WEB_RUNTIMES = Requirement("web-runtimes", "ONNX Runtime Web and LiteRT.js, npm packages pinned by edgekit's lockfile",
                           _web_runtimes_check, "edgekit setup --target browser", _web_runtimes_setup)
CHROMIUM = Requirement("chromium", "the headless browser that runs the page", _chromium_check,
                       "apt-get install -y chromium (or set EDGEKIT_CHROMIUM to a Chromium or Chrome binary)")
PARAMIKO = Requirement("paramiko", "SSH devices", _module("paramiko"), "pip install 'edgekit[ssh]'")
ADB = Requirement("adb", "Android devices over adb", _which("adb"), "apt-get install -y adb")
TWIN_REQUIREMENTS = [
    Requirement("root", "chroot, mounts and network namespaces", _root_check, "run edgekit as root"),
    Requirement("qemu-aarch64-static", "aarch64 user emulation", _which("qemu-aarch64-static"),
                "apt-get install -y qemu-user-static binfmt-support"),
    Requirement("debootstrap", "builds the Debian bookworm arm64 root filesystem", _which("debootstrap", sbin=True),
                "apt-get install -y debootstrap"),
    Requirement("arm64-rootfs", "the twin's root filesystem: Debian bookworm arm64, python3, sshd; cached",
                _rootfs_check, TWIN_SETUP, _rootfs_setup),
]


def _host_built(spec: TargetSpec) -> list[Requirement]:
    """What building the target's host-built wheels needs (llama.cpp cross-compiled for a board: its cross compiler
    and cmake), for the runtimes that list one; provisioning them fails without these."""
    runtimes = sorted(rt for rt, w in (spec.wheels.runtime_packages if spec.wheels else {}).items() if w.host_built)
    if not runtimes:
        return []
    why = f"builds the {', '.join(runtimes)} wheel for the device (`edgekit devices provision NAME --runtime R`)"
    triplet = CROSS.get("aarch64" if spec.arch == "arm64" else spec.arch)
    cross = [Requirement(f"{triplet}-g++", f"the cross compiler that {why}", _which(f"{triplet}-g++"),
                         f"apt-get install -y g++-{triplet}")] if triplet else []
    return cross + [Requirement("cmake", why, _which("cmake"), "apt-get install -y cmake")]


def requirements_for(spec: TargetSpec) -> list[Requirement]:
    """What deploying to ``spec`` needs on this host, beyond edgekit's own dependencies."""
    if spec.transport == "browser":
        return [WEB_RUNTIMES, CHROMIUM]
    if spec.transport == "ssh":
        return [PARAMIKO, *_host_built(spec)]
    if spec.transport == "adb":
        return [ADB, *_host_built(spec)]
    return []


def check(target: str, reqs: list[Requirement]) -> list[Status]:
    out = []
    for r in reqs:
        where = r.check()
        out.append(Status(target, r.name, r.purpose, where is not None, where, r.fix, r.setup is not None))
    return out


def all_statuses() -> tuple[list[Status], list[str]]:
    """Every listed target's requirements and the twin's (for `edgekit doctor`), and the targets that did not load."""

    rows: list[Status] = []
    broken: list[str] = []
    for name in list_targets():
        try:
            spec = load_target(name)
        except Exception as exc:  # a broken target file is reported, the rest still checked
            broken.append(f"{name}: {exc}")
            continue
        rows += check(name, requirements_for(spec))
    rows += check(TWIN, TWIN_REQUIREMENTS)
    return rows, broken


__all__ = ["TWIN", "TWIN_REQUIREMENTS", "TWIN_SETUP", "Requirement", "Status", "all_statuses", "check",
           "requirements_for"]
