"""Where edgekit keeps its files on this host. A leaf: it imports nothing from edgekit, so every
module that needs a folder (the inventory, locks, the simulator, wheelhouses, caches) takes it from
here without importing the module that uses the folder.

``edgekit_home()``: ``$EDGEKIT_HOME``, else ``$XDG_CONFIG_HOME/edgekit``, else ``~/.config/edgekit``.
Caches: ``$EDGEKIT_HOME/cache/NAME`` when EDGEKIT_HOME is set, else ``$XDG_CACHE_HOME/edgekit/NAME``
(``~/.cache/edgekit/NAME``)."""

from __future__ import annotations

import os
from pathlib import Path

INVENTORY_FILE = "devices.yaml"


def edgekit_home() -> Path:
    env = os.environ.get("EDGEKIT_HOME")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(xdg) / "edgekit"


def inventory_path() -> Path:
    return edgekit_home() / INVENTORY_FILE


def known_hosts_path() -> Path:
    """edgekit's own known_hosts: where `devices add --trust` records keys (the user's
    ~/.ssh/known_hosts is read too, never written)."""
    return edgekit_home() / "known_hosts"


def locks_dir() -> Path:
    return edgekit_home() / "locks"


def sim_root() -> Path:
    """One folder per simulated device (``NAME/state.json`` and what `sim up` made)."""
    return edgekit_home() / "sim"


def wheelhouse_root() -> Path:
    return edgekit_home() / "wheelhouse"


def cache_dir(name: str) -> Path:
    """edgekit's cache folder ``name`` (``passes``, ``measurements``, ``rootfs``...)."""
    home = os.environ.get("EDGEKIT_HOME")
    if home:
        return Path(home) / "cache" / name
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgekit" / name


__all__ = ["edgekit_home", "inventory_path", "known_hosts_path", "locks_dir", "sim_root", "wheelhouse_root",
           "cache_dir", "INVENTORY_FILE"]
