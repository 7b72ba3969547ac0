"""The one list of runtimes this agent drives: requests, ``--probe`` (``available_runtimes``) and the host's
in-process checks all read ``RUNNERS``. One module per runtime; a new runtime is one ``Runner`` subclass
passed to ``register``.

Runners from outside the agent (a runtime edgekit does not ship, or a test's faulty runner) come from
plug-in files named in the agent's own environment, ``EDGEKIT_AGENT_PLUGINS`` (paths separated by
``os.pathsep``): each file is run once at start and calls ``register``; a plug-in runner with a built-in
runner's name replaces it for that process. The host never forwards this variable over SSH or adb."""

from __future__ import annotations

import importlib.util
import os

from ..protocol import EXIT_BAD_REQUEST, AgentFailure, Doc, log
from .base import Runner
from .decoder import Decoder
from .executorch_decoder import ExecuTorchDecoder
from .executorch_runner import ExecuTorchRunner
from .litert_runner import LiteRTRunner
from .llamacpp_decoder import LlamaCppDecoder
from .llamacpp_runner import LlamaCppRunner
from .ncnn_runner import NCNNRunner
from .openvino_runner import OpenVINORunner
from .ort_decoder import OnnxDecoder
from .ort_runner import OnnxRunner

RUNNERS: dict[str, type[Runner]] = {}
#: the runtimes that run a language model with a KV cache (the generation workload), by runtime name
DECODERS: dict[str, type[Decoder]] = {}
PLUGINS_ENV = "EDGEKIT_AGENT_PLUGINS"


def register(cls: type[Runner]) -> type[Runner]:
    """Make ``cls`` the runner of its runtime (``cls.name``), or its decoder when it is a :class:`Decoder`;
    usable as a class decorator."""
    if not cls.name:
        raise ValueError(f"runner {cls.__name__} has no name")
    if issubclass(cls, Decoder):
        DECODERS[cls.name] = cls
    else:
        RUNNERS[cls.name] = cls
    return cls


for _cls in (
    OnnxRunner,
    LiteRTRunner,
    ExecuTorchRunner,
    OpenVINORunner,
    NCNNRunner,
    LlamaCppRunner,
    OnnxDecoder,
    ExecuTorchDecoder,
    LlamaCppDecoder,
):
    register(_cls)


def runner_for(runtime: str) -> type[Runner]:
    """The runner of ``runtime``, or a bad_request naming the runtimes this agent knows."""
    cls = RUNNERS.get(runtime)
    if cls is None:
        raise AgentFailure("bad_request", f"unknown runtime {runtime!r}; known: {sorted(RUNNERS)}", EXIT_BAD_REQUEST)
    return cls


def decoder_for(runtime: str) -> type[Decoder]:
    """The decoder of ``runtime``, or a bad_request naming the runtimes that generate here."""
    cls = DECODERS.get(runtime)
    if cls is None:
        raise AgentFailure(
            "bad_request",
            f"runtime {runtime!r} has no decoder (generation) in this agent; decoders: {sorted(DECODERS)}",
            EXIT_BAD_REQUEST,
        )
    return cls


def available_runtimes() -> Doc:
    """{runtime name: version} of every registered runner whose runtime imports on this device."""
    found = {}
    for name, cls in RUNNERS.items():
        version, reason = cls.probe()
        if version:
            found[name] = version
        elif reason and cls.log_missing:
            log(f"{name} unavailable: {reason}")
    return found


def load_plugins(spec: str | None = None) -> list[str]:
    """Run each plug-in file named in ``spec`` (default: ``$EDGEKIT_AGENT_PLUGINS``); returns their paths.
    A file that is missing or fails to run is a bad_request naming it (never skipped silently)."""
    spec = os.environ.get(PLUGINS_ENV, "") if spec is None else spec
    loaded = []
    for i, path in enumerate(p for p in spec.split(os.pathsep) if p):
        mod_spec = importlib.util.spec_from_file_location(f"edgekit_agent_plugin_{i}", path)
        if mod_spec is None or mod_spec.loader is None or not os.path.isfile(path):
            raise AgentFailure("bad_request", f"{PLUGINS_ENV}: no plug-in file {path}", EXIT_BAD_REQUEST)
        try:
            mod_spec.loader.exec_module(importlib.util.module_from_spec(mod_spec))
        except Exception as exc:
            raise AgentFailure(
                "bad_request", f"{PLUGINS_ENV}: plug-in {path} failed: {type(exc).__name__}: {exc}", EXIT_BAD_REQUEST
            ) from exc
        loaded.append(path)
    return loaded


__all__ = [
    "RUNNERS",
    "DECODERS",
    "Runner",
    "Decoder",
    "register",
    "runner_for",
    "decoder_for",
    "available_runtimes",
    "load_plugins",
    "OnnxRunner",
    "LiteRTRunner",
    "ExecuTorchRunner",
    "OpenVINORunner",
    "NCNNRunner",
    "OnnxDecoder",
    "ExecuTorchDecoder",
    "LlamaCppRunner",
    "LlamaCppDecoder",
    "PLUGINS_ENV",
]
