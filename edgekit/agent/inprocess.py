"""The device agent imported into this process, once, from the very zipapp the device runs (zipimport of
``package.agent_pyz()``): host-side checks run the code the device runs (its runners, ``tensors``,
``streams``, ``measure``). Used by the hops' parity checks, the search's host accuracy filter, the browser
bridge and ``edgekit run``. The agent never imports edgekit; loading it imports numpy and no runtime
until a runner loads a model."""

from __future__ import annotations

import importlib
import sys
import threading
from pathlib import Path
from types import ModuleType

from .package import PACKAGE, agent_pyz

MODULE_NAME = PACKAGE  # the agent's one name in sys.modules on the host, as on the device
# the agent's modules the host reads (imported with the package, so `agent.tensors` etc. resolve)
MODULES = (
    "cli",
    "device",
    "energy",
    "evaluation",
    "generation",
    "hashing",
    "measure",
    "memory",
    "protocol",
    "runners",
    "stats",
    "streams",
    "tensors",
    "timing",
)
_lock = threading.Lock()


def _from_pyz(mod: ModuleType, pyz: Path) -> bool:
    return str(getattr(mod, "__file__", "") or "").startswith(str(pyz) + "/")


def load_agent() -> ModuleType:
    """The agent package (loaded on first use, then the same module object every time)."""
    mod = sys.modules.get(MODULE_NAME)
    if mod is not None and getattr(mod, "__edgekit_pyz__", None):
        return mod
    with _lock:
        mod = sys.modules.get(MODULE_NAME)
        if mod is not None and getattr(mod, "__edgekit_pyz__", None):
            return mod
        if mod is not None:
            raise ImportError(
                f"another {MODULE_NAME} is already imported in this process ({mod.__file__}); "
                "edgekit runs only the agent it builds"
            )
        pyz = agent_pyz()
        sys.path.insert(0, str(pyz))
        try:
            mod = importlib.import_module(MODULE_NAME)
            for name in MODULES:
                importlib.import_module(f"{MODULE_NAME}.{name}")
        except BaseException:
            for name in [m for m in sys.modules if m == MODULE_NAME or m.startswith(MODULE_NAME + ".")]:
                sys.modules.pop(name, None)
            raise
        finally:
            sys.path.remove(str(pyz))
        if not _from_pyz(mod, pyz):
            raise ImportError(f"{MODULE_NAME} was imported from {mod.__file__}, not from the built agent {pyz}")
        mod.__edgekit_pyz__ = str(pyz)
        return mod


def runs_on_host(runtime: str | None) -> bool:
    """Whether the agent has a runner for ``runtime`` (its runtime may still be missing here: the
    runner then raises AgentFailure ``runtime_missing``)."""
    return runtime is not None and runtime in load_agent().runners.RUNNERS


__all__ = ["load_agent", "runs_on_host", "MODULE_NAME"]
