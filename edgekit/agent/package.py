"""The device agent as one file: ``device_agents/edgekit_agent/`` (a package by role) built into one
deterministic zipapp.

Deterministic so that delivery by content and the measurement cache's keys stay stable: entries sorted,
each with the same fixed timestamp and permissions, stored (no compression: a zlib of another version would
write other bytes), a fixed ``#!/usr/bin/env python3`` line in front. Two builds of the same sources are
byte-identical, on any host. The file is written once under edgekit's cache (``agent/``), named by its
sha256, and is what the transports push, the device runs (``python3 edgekit_agent-<sha>.pyz REQUEST``)
and the host imports in process (``inprocess.load_agent``)."""

from __future__ import annotations

import hashlib
import io
import tempfile
import zipfile
from pathlib import Path

from ..fsutil import atomic_write_bytes
from ..paths import cache_dir

PACKAGE = "edgekit_agent"
SHEBANG = b"#!/usr/bin/env python3\n"
ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip entry can carry
# the zip's own entry point: runs the package's command line
MAIN = (
    b'"""edgekit\'s device agent (built by edgekit/agent/package.py)."""\n'
    b"from edgekit_agent.cli import entry\n\nentry()\n"
)


def package_dir() -> Path:
    """device_agents/edgekit_agent from the source tree, or the copy shipped in the wheel."""
    src = Path(__file__).resolve().parents[2] / "device_agents" / PACKAGE
    if (src / "__init__.py").is_file():
        return src
    # the wheel's copy (edgekit/_device_agents is a namespace package: importlib.resources.files() gives a
    # MultiplexedPath there, whose str() is not a path)
    shipped = Path(__file__).resolve().parents[1] / "_device_agents" / PACKAGE
    if (shipped / "__init__.py").is_file():
        return shipped
    raise FileNotFoundError("edgekit's device agent is missing from this installation; reinstall edgekit")


def agent_entries(root: Path | None = None) -> list[tuple[str, bytes]]:
    """(name in the zip, bytes) of every module of the agent package, sorted, with the zip's __main__."""
    root = root or package_dir()
    mods = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    entries = [(f"{PACKAGE}/{p.relative_to(root).as_posix()}", p.read_bytes()) for p in mods]
    return sorted([("__main__.py", MAIN), *entries])


def build_pyz_bytes(root: Path | None = None) -> bytes:
    """The zipapp's bytes (see the module's docstring for why they are deterministic)."""
    buf = io.BytesIO()
    buf.write(SHEBANG)
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, data in agent_entries(root):
            info = zipfile.ZipInfo(name, date_time=ZIP_TIME)
            info.compress_type = zipfile.ZIP_STORED
            info.create_system = 3  # unix, whatever host builds it
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    return buf.getvalue()


def agent_pyz() -> Path:
    """The built agent under edgekit's cache, named by its sha256 (written once; the temp folder when the
    cache folder cannot be written)."""
    data = build_pyz_bytes()
    name = f"{PACKAGE}-{hashlib.sha256(data).hexdigest()[:16]}.pyz"
    for folder in (cache_dir("agent"), Path(tempfile.gettempdir()) / "edgekit-agent"):
        path = folder / name
        try:
            if not (path.is_file() and path.read_bytes() == data):
                folder.mkdir(parents=True, exist_ok=True)
                atomic_write_bytes(path, data)
            return path
        except OSError:
            continue
    raise OSError(f"cannot write the device agent to {cache_dir('agent')} or the temp folder")


__all__ = ["agent_pyz", "build_pyz_bytes", "agent_entries", "package_dir", "PACKAGE"]
