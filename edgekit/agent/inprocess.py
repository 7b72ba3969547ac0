"""The device agent (``device_agents/edgekit_agent.py``) imported into this process, once: host-side
checks run the very code the device runs (its ``RUNNERS``, ``_prepare``/``_restore_output``,
``measure``). Used by the TFLite parity check (``convert/onnx_to_tflite.py``) and the search's host
accuracy filter. The agent is stdlib-only and never imports edgekit, so loading it is cheap and
imports no runtime until a runner loads a model."""

from __future__ import annotations

import importlib.util
import sys
import threading
from types import ModuleType

MODULE_NAME = "_edgekit_device_agent"  # the one name the agent has in sys.modules on the host
_lock = threading.Lock()


def load_agent() -> ModuleType:
    """The agent module (loaded on first use, then the same module object every time)."""
    mod = sys.modules.get(MODULE_NAME)
    if mod is not None:
        return mod
    with _lock:
        mod = sys.modules.get(MODULE_NAME)
        if mod is not None:
            return mod
        from .bundle import agent_source

        spec = importlib.util.spec_from_file_location(MODULE_NAME, agent_source())
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load the device agent from {agent_source()}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[MODULE_NAME] = mod  # before running it: its classes name this module
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            sys.modules.pop(MODULE_NAME, None)
            raise
        return mod


def runs_on_host(runtime: str | None) -> bool:
    """Whether the agent has a runner for ``runtime`` (its runtime may still be missing here: the
    runner then raises AgentFailure ``runtime_missing``)."""
    return runtime is not None and runtime in load_agent().RUNNERS


__all__ = ["load_agent", "runs_on_host", "MODULE_NAME"]
