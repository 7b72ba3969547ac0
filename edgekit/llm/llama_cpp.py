"""llama.cpp on this host: built once from the source llama-cpp-python's sdist vendors, kept outside the clone.

Why the sdist: llama-cpp-python 0.3.36 ships as source only, and that source carries llama.cpp itself
(``vendor/llama.cpp``: the libraries, the tools, ``convert_hf_to_gguf.py`` with its ``conversion`` package and
``gguf-py``), so one file from the package registry pins the binding, the native library, the quantizer and
the converter to one llama.cpp revision: a GGUF the converter writes is one the library and the binding read.

The build (``ensure_built``, run by ``.ci/llama_cpp.sh`` and ``python -m edgekit.llm.llama_cpp``; never at run
time) is CPU only, Release, ``GGML_NATIVE`` (``-march=native``: this CPU's vector units), shared libraries
(libllama, libggml*) and the tools llama-quantize, llama-bench, llama-perplexity and llama-imatrix (AMX left out
on x86-64: see ``X86_NO_AMX``). It lands in ``$EDGEKIT_LLAMA_CPP_DIR/<version>-<arch>/`` (default
``~/.cache/edgekit/llama.cpp/0.3.36-x86_64/``: ``bin/``, ``lib/``, ``convert_hf_to_gguf.py``, ``conversion/``,
``gguf-py/``, ``build.json``; ~23 MB). It is built in a temp folder beside and renamed into place with
``build.json`` written last, so a killed build never looks complete. Measured on this 2-core host: 226 s cold
(382 s with the other core busy), 0.2 s when cached. ``tools()`` takes only a build whose ``build.json`` records
this edgekit's configure arguments (else it is stale and ``ensure_built`` builds again) and this CPU's features
(a native build on another CPU, a shared home folder, would die on an illegal instruction).

The Python binding (``install_binding``) is the same sdist installed with ``CMAKE_ARGS=-DLLAMA_BUILD=OFF``: pip
compiles nothing, and the binding loads this build's ``libllama.so`` through ``LLAMA_CPP_LIB_PATH`` (read by
``llama_cpp.llama_cpp`` at import). The device agent's llama.cpp decoder sets that variable from the same cache
folder when it is unset.

The sdist, the cmake build, the cache and its lock, and a board's cross-built wheel are ``devices/llama_cpp_build.py``'s
(provisioning a board needs them); ``--board TARGET`` here builds a board's wheel ahead."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..devices.llama_cpp_build import (
    CMAKE_ARGS,
    INSTALL,
    LIBS,
    SDIST,
    VERSION,
    BoardBuild,
    LlamaCppMissing,
    board_wheel,
    build_jobs,
    cache_root,
    cmake_build,
    locked,
    sdist_path,
)
from ..errors import EdgekitError
from ..inputs.targets import load_target

TOOLS = ("llama-quantize", "llama-bench", "llama-perplexity", "llama-imatrix")
LIB_ENV = "LLAMA_CPP_LIB_PATH"  # where llama-cpp-python loads libllama.so from (read at its import)
# what the vendored tree must keep beside the binaries: the converter, the package it imports, and the
# gguf-py of the same revision (the converter writes what its own gguf-py knows)
CONVERTER_FILES = ("convert_hf_to_gguf.py", "conversion", "gguf-py")
# x86-64: -march=native without AMX. ggml's AMX kernels (Q4_0/Q8_0... matmuls on CPUs with AMX tiles) died here
# on their first tile instruction (SIGILL at ``tilezero`` in tinygemm_kernel_amx, Xeon with amx_int8 in a VM,
# llama.cpp of llama-cpp-python 0.3.36): the tile configuration is not loaded when the kernel runs (upstream:
# ggml-org/llama.cpp PR #26954, open). Explicit -mno-* flags win over -march=native in GCC (checked: no __AMX_*__
# macros are left), so the AMX sources compile to nothing and those matmuls take the AVX-512 VNNI kernels.
X86_NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


@dataclass(frozen=True)
class LlamaCppTools:
    """Paths of one complete build."""

    root: Path
    version: str

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def lib(self) -> Path:
        return self.root / "lib"

    @property
    def convert(self) -> Path:
        return self.root / "convert_hf_to_gguf.py"

    @property
    def gguf_py(self) -> Path:
        return self.root / "gguf-py"

    def tool(self, name: str) -> Path:
        return self.bin / name

    @property
    def quantize(self) -> Path:
        return self.tool("llama-quantize")

    @property
    def imatrix(self) -> Path:
        return self.tool("llama-imatrix")

    @property
    def perplexity(self) -> Path:
        return self.tool("llama-perplexity")

    @property
    def bench(self) -> Path:
        return self.tool("llama-bench")

    def converter_env(self) -> dict[str, str]:
        """The environment the converter runs in: the vendored gguf-py first on the path (the converter also
        inserts it itself unless NO_LOCAL_GGUF is set; this makes it explicit)."""
        env = dict(os.environ)
        env.pop("NO_LOCAL_GGUF", None)
        env["PYTHONPATH"] = os.pathsep.join([str(self.gguf_py), str(self.root), *filter(None, [env.get("PYTHONPATH")])])
        return env

    def info(self) -> dict[str, object]:
        doc: dict[str, object] = json.loads((self.root / "build.json").read_text(encoding="utf-8"))
        return doc


def arch() -> str:
    return platform.machine() or "unknown"


def build_dir(version: str = VERSION) -> Path:
    """``<cache>/llama.cpp/<version>-<arch>``: one build per binding version and machine architecture."""
    return cache_root() / f"{version}-{arch()}"


def cmake_args() -> list[str]:
    """The configure arguments of this machine's build (recorded in build.json; a build made with others is
    stale and rebuilt)."""
    args = list(CMAKE_ARGS)
    if arch() in ("x86_64", "AMD64"):
        args += [f"-DCMAKE_C_FLAGS={X86_NO_AMX}", f"-DCMAKE_CXX_FLAGS={X86_NO_AMX}"]
    return args


def cpu_features() -> str:
    """A digest of this CPU's feature flags (Linux: /proc/cpuinfo's flags or Features line), '' when unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return hashlib.sha256(" ".join(sorted(value.split())).encode()).hexdigest()[:16]
    except OSError:
        pass
    return ""


def _missing_parts(root: Path) -> list[str]:
    parts = [
        root / "build.json",
        *(root / "bin" / t for t in TOOLS),
        *(root / "lib" / f"lib{n}.so" for n in LIBS),
        *(root / f for f in CONVERTER_FILES),
    ]
    return [str(p.relative_to(root)) for p in parts if not p.exists()]


def tools(version: str = VERSION) -> LlamaCppTools:
    """The complete build of ``version`` for this machine, or :class:`LlamaCppMissing` with the install command.
    Never builds or downloads anything."""
    root = build_dir(version)
    if not root.is_dir():
        raise LlamaCppMissing(f"llama.cpp {version} is not built for {arch()} on this host (looked in {root})")
    missing = _missing_parts(root)
    if missing:
        raise LlamaCppMissing(
            f"the llama.cpp build in {root} is incomplete (missing: {', '.join(missing)})",
            hint=f"rm -rf {root} && {INSTALL}",
        )
    t = LlamaCppTools(root, version)
    if t.info().get("cmake_args") != cmake_args():
        raise LlamaCppMissing(
            f"the llama.cpp build in {root} was configured with other settings than this edgekit "
            "uses (build.json's cmake_args): it is stale",
            hint=INSTALL,
        )
    built_on = t.info().get("cpu_features")
    if built_on and cpu_features() and built_on != cpu_features():
        raise LlamaCppMissing(
            f"the llama.cpp build in {root} was compiled for another CPU (-march=native, CPU "
            f"features {built_on}, this one {cpu_features()}): its binaries may not run here",
            hint=f"rm -rf {root} && {INSTALL}",
        )
    return t


def lib_path(version: str = VERSION) -> Path:
    """The folder holding this build's libllama.so: the value of ``LLAMA_CPP_LIB_PATH`` for the binding."""
    return tools(version).lib


def ensure_built(
    sdist: Path | None = None, *, jobs: int | None = None, rebuild: bool = False, say: Callable[[str], None] = print
) -> LlamaCppTools:
    """Build llama.cpp into :func:`build_dir` unless a complete build is there; returns its tools. The build
    runs in a temp folder beside the final one and is renamed into place when complete."""
    root = build_dir()
    if not rebuild:
        with contextlib.suppress(LlamaCppMissing):
            t = tools()
            say(f"llama.cpp {VERSION}: cached build in {root}")
            return t
    if shutil.which("cmake") is None:
        raise LlamaCppMissing(
            "building llama.cpp needs cmake, which is not on PATH",
            hint="apt-get install cmake build-essential (or pip install cmake)",
        )
    with locked(cache_root()):
        if not rebuild:
            with contextlib.suppress(LlamaCppMissing):
                return tools()  # another installer finished it while this one waited
        src_archive = Path(sdist) if sdist else sdist_path()
        t0 = time.perf_counter()
        work = Path(tempfile.mkdtemp(dir=cache_root(), prefix=f".{root.name}.building-"))
        try:
            say(f"llama.cpp {VERSION}: building from {src_archive.name} in {work} ({jobs or build_jobs()} jobs)...")
            src, build, log = cmake_build(src_archive, work, cmake_args(), ["llama", *TOOLS], jobs)
            stage = work / "stage"
            (stage / "bin").mkdir(parents=True)
            (stage / "lib").mkdir()
            for tool in TOOLS:
                shutil.copy2(build / "bin" / tool, stage / "bin" / tool)
            for so in sorted((build / "bin").glob("lib*.so*")):  # libllama.so, libllama.so.0 -> ..., libggml*
                shutil.copy2(so, stage / "lib" / so.name, follow_symlinks=False)
            for name in CONVERTER_FILES:
                s = src / name
                (shutil.copytree if s.is_dir() else shutil.copy2)(s, stage / name)
            with open(log, "rb") as fh:  # the last 256 KB (the whole log of a build is ~7 MB of compiler lines)
                fh.seek(max(0, log.stat().st_size - (1 << 18)))
                (stage / "build.log").write_bytes(fh.read())
            seconds = round(time.perf_counter() - t0, 1)
            info = {
                "llama_cpp_python": VERSION,
                "arch": arch(),
                "cpu_features": cpu_features(),
                "cmake_args": cmake_args(),
                "seconds": seconds,
                "jobs": jobs or build_jobs(),
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            (stage / "build.json").write_text(json.dumps(info, indent=1), encoding="utf-8")  # last: "complete"
            if root.exists():  # a rebuild, or a folder that is not a complete build: moved aside, then removed
                os.replace(root, work / "old")
            os.replace(stage, root)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        say(f"llama.cpp {VERSION}: built in {seconds:.0f} s -> {root}")
        return tools()


# ------------------------------------------------------------------------------------------ the binding
def binding_check(python: str = sys.executable, version: str = VERSION) -> str | None:
    """None when ``python`` imports llama_cpp ``version`` and it loads this build's library through
    ``LLAMA_CPP_LIB_PATH``; otherwise what is wrong."""
    code = (
        "import llama_cpp, sys; v = llama_cpp.__version__; "
        "sys.exit(0 if v == sys.argv[1] else f'llama_cpp {v} is installed, not {sys.argv[1]}')"
    )
    env = dict(os.environ, **{LIB_ENV: str(lib_path(version))})
    res = subprocess.run([python, "-c", code, version], capture_output=True, text=True, env=env)
    return None if res.returncode == 0 else (res.stderr.strip().splitlines() or ["failed"])[-1]


def install_binding(
    python: str = sys.executable, sdist: Path | None = None, say: Callable[[str], None] = print
) -> None:
    """pip-install llama-cpp-python from the cached sdist into ``python``'s environment without building
    llama.cpp again (``-DLLAMA_BUILD=OFF``: the wheel holds only Python; the library is this build's)."""
    if binding_check(python) is None:
        say(f"llama-cpp-python {VERSION}: installed (library from {lib_path()})")
        return
    t0 = time.perf_counter()
    env = dict(os.environ, CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF")
    cmd = [
        python,
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-cache-dir",
        str(Path(sdist) if sdist else sdist_path()),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise LlamaCppMissing(
            f"pip could not install the llama-cpp-python binding: {(res.stderr or res.stdout).strip()[-800:]}"
        )
    problem = binding_check(python)
    if problem:
        raise LlamaCppMissing(f"llama-cpp-python {VERSION} installed but does not load {lib_path()}: {problem}")
    say(
        f"llama-cpp-python {VERSION}: installed in {time.perf_counter() - t0:.0f} s "
        f"(no native build; {LIB_ENV}={lib_path()})"
    )


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m edgekit.llm.llama_cpp",
        description=f"Build llama.cpp (from llama-cpp-python {VERSION}'s sdist) into "
        f"{build_dir()} and install the Python binding against it.",
    )
    ap.add_argument("--sdist", type=Path, help=f"a local {SDIST} (default: the cached one, else pip download)")
    ap.add_argument("--rebuild", action="store_true", help="build again even when a complete build is cached")
    ap.add_argument("--no-binding", action="store_true", help="build the tools and libraries only")
    ap.add_argument("--jobs", type=int, help="parallel compile jobs (default: the CPUs this process may use)")
    ap.add_argument(
        "--board",
        metavar="TARGET",
        action="append",
        default=[],
        help="also cross-build the binding wheel for a board target (its arch and march; e.g. rpi5)",
    )
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        t = ensure_built(args.sdist, jobs=args.jobs, rebuild=args.rebuild)
        if not args.no_binding:
            install_binding(sdist=args.sdist)
        for name in args.board:
            spec = load_target(name)
            if not spec.march:
                raise EdgekitError(f"target {name} has no `march`: llama.cpp is compiled for the device's cores")
            board_wheel(BoardBuild(spec.arch, spec.march), args.sdist, jobs=args.jobs)
    except EdgekitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(
        json.dumps(
            {
                "root": str(t.root),
                "bin": str(t.bin),
                "lib": str(t.lib),
                "convert": str(t.convert),
                "seconds": round(time.perf_counter() - t0, 2),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "VERSION",
    "TOOLS",
    "INSTALL",
    "LIB_ENV",
    "LlamaCppMissing",
    "LlamaCppTools",
    "build_dir",
    "tools",
    "lib_path",
    "ensure_built",
    "install_binding",
    "binding_check",
]
