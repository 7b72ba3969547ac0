"""The browser target's web runtimes (ONNX Runtime Web, LiteRT.js): where they are, and installing them.

They are npm packages pinned by the lockfile edgekit ships (``device_agents/browser/package-lock.json``, in the
wheel as ``edgekit/_device_agents/browser/``), installed at setup and never fetched at run time. The page's
server (edgekit/agent/browser_transport.py) takes the first ``node_modules`` of:

1. ``$EDGEKIT_BROWSER_RUNTIMES/node_modules`` when that variable is set (and only it: a wrong folder is an error,
   not a silent fall-through to another copy);
2. the source tree's ``device_agents/browser/node_modules`` (a clone after ``bash .ci/install.sh``);
3. the user cache, ``<cache>/web-runtimes/<key>/node_modules``, made by ``edgekit setup --target browser``:
   ``npm ci`` from the packaged lockfile. ``<cache>`` is ``$EDGEKIT_HOME/cache`` or ``~/.cache/edgekit``
   (``$XDG_CACHE_HOME``); ``<key>`` is the first 16 hex digits of the sha256 of package.json and
   package-lock.json, so another edgekit release with other pins installs beside it. The install runs in a
   temporary folder beside the final one, under a lock, and is renamed into place only when complete and
   checked, with a stamp (``.edgekit-web-runtimes.json``): a folder without its stamp is never used.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import DeviceError, TransportError
from ..paths import cache_dir

ENV = "EDGEKIT_BROWSER_RUNTIMES"
LOCK_FILES = ("package.json", "package-lock.json")
STAMP = ".edgekit-web-runtimes.json"
SETUP_COMMAND = "edgekit setup --target browser"
NPM_TIMEOUT_S = 900
# the files the page loads: ONNX Runtime Web's script (required) and LiteRT.js's module (required by the lockfile;
# a folder without it still serves .onnx files)
ORT_SCRIPT = Path("onnxruntime-web") / "dist" / "ort.wasm.min.js"
LITERT_MODULE = Path("@litertjs") / "core" / "dist" / "index.js"
# npm's words for a registry it cannot reach (DNS, refused, reset, timed out, offline mode without a cached copy)
NETWORK_ERRORS = re.compile(r"ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ENETUNREACH|EHOSTUNREACH|"
                            r"ENOTCACHED|network request|request to \S+ failed|socket hang up|getaddrinfo")

Say = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def page_dir() -> Path:
    """device_agents/browser from the source tree, or the copy shipped in the wheel: the page agent and the
    lockfile (package.json, package-lock.json)."""
    src = Path(__file__).resolve().parents[2] / "device_agents" / "browser"
    if (src / "agent.html").is_file():
        return src
    # edgekit/_device_agents is a namespace package: importlib.resources.files() gives a MultiplexedPath there
    return Path(__file__).resolve().parents[1] / "_device_agents" / "browser"


def lock_dir() -> Path:
    """The folder holding the packaged package.json and package-lock.json (the page agent's folder)."""
    return page_dir()


def lock_key(folder: Path | None = None) -> str:
    """16 hex digits naming what the lockfile installs (sha256 over package.json and package-lock.json)."""
    folder = folder or lock_dir()
    h = hashlib.sha256()
    for name in LOCK_FILES:
        try:
            h.update((folder / name).read_bytes())
        except OSError as exc:
            raise DeviceError(f"edgekit's browser lockfile is missing ({folder / name})",
                              hint="reinstall edgekit: the wheel carries edgekit/_device_agents/browser/") from exc
        h.update(b"\0")
    return h.hexdigest()[:16]


def cache_root() -> Path:
    return cache_dir("web-runtimes")


def cache_path(key: str | None = None) -> Path:
    """Where ``edgekit setup --target browser`` installs this edgekit's runtimes (complete when stamped)."""
    return cache_root() / (key or lock_key())


def complete(folder: Path) -> bool:
    """A finished install: stamped, with ONNX Runtime Web's script in place."""
    return (folder / STAMP).is_file() and (folder / "node_modules" / ORT_SCRIPT).is_file()


@dataclass(frozen=True)
class Found:
    node_modules: Path
    source: str  # "EDGEKIT_BROWSER_RUNTIMES", "source tree" or "user cache"


def find() -> Found | None:
    """The node_modules the browser target serves (see the module's docstring for the order), or None."""
    env = os.environ.get(ENV)
    if env:
        nm = Path(env) / "node_modules"
        return Found(nm, ENV) if (nm / ORT_SCRIPT).is_file() else None
    src = page_dir() / "node_modules"
    if (src / ORT_SCRIPT).is_file():
        return Found(src, "source tree")
    try:
        cached = cache_path()
    except DeviceError:  # no lockfile: an installation without its data files; the caller names what is missing
        return None
    return Found(cached / "node_modules", "user cache") if complete(cached) else None


def node_modules() -> Path:
    """The runtimes' node_modules, or a DeviceError that names the setup command."""
    found = find()
    if found is not None:
        return found.node_modules
    env = os.environ.get(ENV)
    if env:
        raise DeviceError(f"{ENV}={env} has no node_modules/{ORT_SCRIPT.as_posix()}",
                          hint=f"point {ENV} at a folder where `npm ci` ran with edgekit's package-lock.json, "
                               f"or unset it and run `{SETUP_COMMAND}`")
    raise DeviceError("the browser target's web runtimes (ONNX Runtime Web, LiteRT.js) are not set up on this host",
                      hint=f"run `{SETUP_COMMAND}` (npm ci from edgekit's packaged lockfile into "
                           f"{cache_root()}); or set {ENV} to a folder with node_modules")


def versions(nm: Path) -> dict[str, str | None]:
    """The installed runtimes' versions by npm package name (None: not installed)."""
    out: dict[str, str | None] = {}
    for pkg, rel in (("onnxruntime-web", "onnxruntime-web"), ("@litertjs/core", "@litertjs/core")):
        try:
            out[pkg] = json.loads((nm / rel / "package.json").read_text())["version"]
        except (OSError, ValueError, KeyError):
            out[pkg] = None
    return out


def pinned_versions(folder: Path | None = None) -> dict[str, str]:
    """What the packaged lockfile pins (package.json's dependencies), for messages."""
    try:
        deps = json.loads(((folder or lock_dir()) / "package.json").read_text()).get("dependencies") or {}
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in deps.items()}


def _tool(name: str) -> str:
    exe = shutil.which(name)
    if not exe:
        raise DeviceError(f"`{name}` is not installed: the browser runtimes are npm packages that "
                          f"`{SETUP_COMMAND}` installs with npm (Node.js)",
                          hint="install Node.js and npm (Debian: apt-get install -y nodejs npm), then run "
                               f"`{SETUP_COMMAND}` again; or set {ENV} to a folder where `npm ci` ran with "
                               "edgekit's package-lock.json on another machine")
    return exe


def _registry(npm: str) -> str:
    try:
        r = subprocess.run([npm, "config", "get", "registry"], capture_output=True, text=True, timeout=30)
        return r.stdout.strip() or "npm's registry"
    except (OSError, subprocess.SubprocessError):
        return "npm's registry"


def install(say: Say = _quiet) -> Found:
    """Install the packaged lockfile's runtimes into the user cache, once (a complete copy is reused).

    ``npm ci --ignore-scripts`` (no package's install scripts run) in ``.<key>.building-<pid>`` beside the final
    folder, checked, stamped and renamed into place; a failed or interrupted install leaves nothing that
    :func:`find` would use. Raises DeviceError (npm or Node.js missing, npm failing) or TransportError (the
    registry unreachable)."""
    src = lock_dir()
    key = lock_key(src)
    final = cache_path(key)
    if complete(final):
        return Found(final / "node_modules", "user cache")
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".install.lock", "w") as lockf:
        fcntl.flock(lockf, fcntl.LOCK_EX)  # two setups at once: the second waits and finds the first's copy
        if complete(final):
            return Found(final / "node_modules", "user cache")
        for old in root.glob(f".{key}.building-*"):  # an interrupted install (we hold the lock: nobody's)
            shutil.rmtree(old, ignore_errors=True)
        if final.exists():  # no stamp: never trusted
            shutil.rmtree(final)
        npm = _tool("npm")
        _tool("node")
        tmp = root / f".{key}.building-{os.getpid()}"
        try:
            tmp.mkdir()
            for name in LOCK_FILES:
                shutil.copyfile(src / name, tmp / name)
            pins = ", ".join(f"{k} {v}" for k, v in pinned_versions(src).items())
            say(f"installing the browser runtimes ({pins}) with npm ci into {final}")
            started = time.perf_counter()
            argv = [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--prefer-offline", "--loglevel=error"]
            try:
                r = subprocess.run(argv, cwd=tmp, capture_output=True, text=True, timeout=NPM_TIMEOUT_S,
                                   env={**os.environ, "npm_config_update_notifier": "false"})
            except subprocess.TimeoutExpired as exc:
                raise TransportError(f"npm ci did not finish in {NPM_TIMEOUT_S} s",
                                     hint=f"is {_registry(npm)} reachable from this host? then rerun "
                                          f"`{SETUP_COMMAND}`") from exc
            if r.returncode != 0:
                out = (r.stderr or r.stdout).strip()
                tail = "\n".join(out.splitlines()[-8:])
                if NETWORK_ERRORS.search(out):
                    raise TransportError(f"npm could not reach {_registry(npm)} to fetch the browser runtimes: {tail}",
                                         hint="connect this host to the npm registry or a mirror (npm config set "
                                              f"registry URL) and rerun `{SETUP_COMMAND}`; or copy {root} from a "
                                              f"machine where it ran, or set {ENV} to a folder with node_modules")
                raise DeviceError(f"npm ci failed (exit {r.returncode}): {tail}",
                                  hint=f"rerun `{SETUP_COMMAND}`; the command was: {' '.join(argv)} (in a copy of "
                                       f"{src / 'package-lock.json'})")
            nm = tmp / "node_modules"
            if not (nm / ORT_SCRIPT).is_file():
                raise DeviceError(f"npm ci ran but {ORT_SCRIPT.as_posix()} is not in its node_modules",
                                  hint=f"the packaged lockfile ({src / 'package-lock.json'}) does not install "
                                       "ONNX Runtime Web's dist/: reinstall edgekit")
            info = {"key": key, "versions": versions(nm), "lockfile": str(src / "package-lock.json"),
                    "npm": subprocess.run([npm, "--version"], capture_output=True, text=True,
                                          timeout=30).stdout.strip() or None,
                    "seconds": round(time.perf_counter() - started, 1)}
            (tmp / STAMP).write_text(json.dumps(info, indent=2))
            os.rename(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return Found(final / "node_modules", "user cache")


__all__ = ["ENV", "SETUP_COMMAND", "Found", "cache_path", "cache_root", "complete", "find", "install", "lock_key",
           "node_modules", "page_dir", "pinned_versions", "versions"]
