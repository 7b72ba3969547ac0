"""llama.cpp in the agent's runtime list: finding and importing llama-cpp-python's low-level API (ctypes over
libllama). llama.cpp runs only the generation workload: the runner refuses a fixed-graph request by name; the
decoder (``llamacpp_decoder.py``) does the work.

The binding loads ``libllama.so`` at import from ``LLAMA_CPP_LIB_PATH``, else from its own ``lib/`` folder. When
neither holds one (edgekit installs the binding without a native build, against the llama.cpp it built once
into its cache: ``edgekit/llm/llama_cpp.py``), the variable is set here from that cache
(``$EDGEKIT_LLAMA_CPP_DIR`` or ``~/.cache/edgekit/llama.cpp``, then ``<binding version>-<arch>/lib``) before the
import. Nothing is imported until a model is loaded."""

from __future__ import annotations

import importlib
import importlib.util
import os
import platform
import sys
from collections import deque
from typing import Any, ClassVar, Mapping

from ..protocol import EXIT_BAD_REQUEST, EXIT_RUNTIME, AgentFailure, Doc
from .base import Runner, dist_version

DIST = "llama_cpp_python"
LIB_ENV = "LLAMA_CPP_LIB_PATH"
# ggml_type values of the cache types the option offers (ggml.h: F32 0, F16 1, Q8_0 8)
KV_TYPES = {"f16": 1, "f32": 0, "q8_0": 8}


def _cache_lib_dir(version: str) -> str | None:
    """edgekit's llama.cpp build for this binding version and machine, if present: ``$EDGEKIT_LLAMA_CPP_DIR`` or
    ``$XDG_CACHE_HOME/edgekit/llama.cpp`` or ``~/.cache/edgekit/llama.cpp``, then ``<version>-<arch>/lib`` (the
    host's layout, edgekit/llm/llama_cpp.py)."""
    base = os.environ.get("EDGEKIT_LLAMA_CPP_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "edgekit", "llama.cpp"
    )
    lib = os.path.join(base, f"{version}-{platform.machine()}", "lib")
    return lib if os.path.isfile(os.path.join(lib, "libllama.so")) else None


def _library_dir() -> tuple[str | None, str | None, bool]:
    """(the folder libllama.so will load from, None, whether LLAMA_CPP_LIB_PATH must be set to it) or
    (None, why none can, False)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return (
            None,
            "llama-cpp-python is not installed (pip install llama-cpp-python; edgekit: bash .ci/llama_cpp.sh)",
            False,
        )
    env = os.environ.get(LIB_ENV)
    if env:
        if os.path.isfile(os.path.join(env, "libllama.so")):
            return env, None, False
        return None, f"{LIB_ENV}={env} holds no libllama.so", False
    own = os.path.join(list(spec.submodule_search_locations)[0], "lib")
    if os.path.isfile(os.path.join(own, "libllama.so")):
        return own, None, False
    version = dist_version(DIST)
    cached = _cache_lib_dir(version) if version else None
    if cached:
        return cached, None, True
    return (
        None,
        (
            f"llama-cpp-python {version} has no libllama.so of its own (installed without its native build) "
            f"and {LIB_ENV} is unset; edgekit's build is not in its cache either (bash .ci/llama_cpp.sh)"
        ),
        False,
    )


class _Log:
    """llama.cpp's log, read through one callback for the process: errors go to stderr (stdout carries the
    agent's one JSON document), and the last warnings and errors are kept for the failure a caller reports
    (llama.cpp returns only NULL when it refuses a model or a context; the reason is in its log)."""

    def __init__(self) -> None:
        self.lines: deque[str] = deque(maxlen=8)
        self.callback: Any = None  # the ctypes function llama.cpp calls (kept alive here)
        self.level = 0

    def install(self, lc: Any) -> None:
        if self.callback is not None:
            return

        def on_log(level: int, text: bytes, user_data: Any) -> None:
            # ggml.h's levels: DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (the previous message goes on). The
            # binding's own callback (llama_cpp/_logger.py in 0.3.36) still maps an older enum, where 3 was
            # ERROR and 4 DEBUG: it would hide llama.cpp's errors, so it is replaced here.
            if level == 5:
                level = self.level
            self.level = level
            line = text.decode("utf-8", errors="replace").rstrip()
            if level in (3, 4) and line:
                self.lines.append(line)
            if level == 4:
                sys.stderr.write(line + "\n")

        self.callback = lc.llama_log_callback(on_log)
        lc.llama_log_set(self.callback, None)

    def clear(self) -> None:
        self.lines.clear()

    def reason(self) -> str:
        """The warnings and errors llama.cpp logged since ``clear()``, oldest first."""
        return "; ".join(self.lines) or "llama.cpp logged no reason"


LOG = _Log()


def import_llama_cpp() -> Any:
    """The binding's low-level module, ``LLAMA_CPP_LIB_PATH`` set first where the library is edgekit's build;
    llama.cpp's log read by :data:`LOG`."""
    lib, why, set_env = _library_dir()
    if lib is None:
        raise AgentFailure("runtime_missing", f"llama.cpp is not usable on this device: {why}", EXIT_RUNTIME)
    if set_env:
        os.environ[LIB_ENV] = lib  # read once, when llama_cpp.llama_cpp loads the library
    try:
        lc = importlib.import_module("llama_cpp.llama_cpp")
    except (ImportError, OSError, RuntimeError) as exc:
        raise AgentFailure(
            "runtime_missing",
            f"llama-cpp-python does not load libllama.so from {lib}: {type(exc).__name__}: {exc}",
            EXIT_RUNTIME,
        ) from exc
    LOG.install(lc)
    return lc


class LlamaCppRunner(Runner):
    """llama.cpp in the runtime list (``--probe``); it runs only the generation workload (``LlamaCppDecoder``)."""

    name = "llama.cpp"
    log_missing = False
    OPTIONS: ClassVar[Mapping[str, tuple[Any, ...] | None]] = {"kv_type": tuple(KV_TYPES)}

    @classmethod
    def probe(cls) -> tuple[str | None, str | None]:
        lib, why, _ = _library_dir()
        if lib is None:
            return None, why
        return dist_version(DIST), None

    def load(self, model_path: str, request: Doc) -> None:
        raise AgentFailure(
            "bad_request",
            "llama.cpp runs language models only (the generation workload: a request "
            "with a generate section), not a fixed-graph model",
            EXIT_BAD_REQUEST,
        )
