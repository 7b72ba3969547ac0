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
folder when it is unset."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ..errors import EdgekitError, MissingExtraError
from ..inputs.targets import load_target

VERSION = "0.3.36"  # llama-cpp-python; its vendored llama.cpp is what gets built
DIST = "llama-cpp-python"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
TOOLS = ("llama-quantize", "llama-bench", "llama-perplexity", "llama-imatrix")
LIBS = ("llama", "ggml", "ggml-base", "ggml-cpu")  # libllama.so needs the other three beside it
INSTALL = "bash .ci/llama_cpp.sh"  # from the repository root; or: python -m edgekit.llm.llama_cpp
DIR_ENV = "EDGEKIT_LLAMA_CPP_DIR"  # the cache of builds (default ~/.cache/edgekit/llama.cpp)
LIB_ENV = "LLAMA_CPP_LIB_PATH"  # where llama-cpp-python loads libllama.so from (read at its import)
# what the vendored tree must keep beside the binaries: the converter, the package it imports, and the
# gguf-py of the same revision (the converter writes what its own gguf-py knows)
CONVERTER_FILES = ("convert_hf_to_gguf.py", "conversion", "gguf-py")
CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=ON",
    "-DGGML_NATIVE=ON",
    "-DGGML_CUDA=OFF",
    "-DGGML_METAL=OFF",
    "-DGGML_VULKAN=OFF",
    "-DGGML_BLAS=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_COMMON=ON",
    # binaries and libraries find each other from where they are copied to (bin/ and lib/)
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
    "-DCMAKE_INSTALL_RPATH=$ORIGIN:$ORIGIN/../lib",
)
# x86-64: -march=native without AMX. ggml's AMX kernels (Q4_0/Q8_0... matmuls on CPUs with AMX tiles) died here
# on their first tile instruction (SIGILL at ``tilezero`` in tinygemm_kernel_amx, Xeon with amx_int8 in a VM,
# llama.cpp of llama-cpp-python 0.3.36): the tile configuration is not loaded when the kernel runs (upstream:
# ggml-org/llama.cpp PR #26954, open). Explicit -mno-* flags win over -march=native in GCC (checked: no __AMX_*__
# macros are left), so the AMX sources compile to nothing and those matmuls take the AVX-512 VNNI kernels.
X86_NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


class LlamaCppMissing(MissingExtraError):
    """llama.cpp (or its Python binding) is not built on this host: the message says what is missing, the hint
    the command that builds it. A ``MissingExtraError`` (exit 2), so callers that catch those catch this."""

    def __init__(self, message: str, *, hint: str = INSTALL):
        EdgekitError.__init__(self, message, hint=hint)
        self.package = DIST
        self.extra = "llamacpp"


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
        return json.loads((self.root / "build.json").read_text(encoding="utf-8"))


def arch() -> str:
    return platform.machine() or "unknown"


def cache_root() -> Path:
    """``$EDGEKIT_LLAMA_CPP_DIR``, else ``$XDG_CACHE_HOME/edgekit/llama.cpp`` (``~/.cache/edgekit/llama.cpp``).
    Not under ``$EDGEKIT_HOME``: a native build of minutes belongs to the machine, and edgekit homes (a test
    session's, a CI job's) come and go; the device agent looks in the same place (runners/llamacpp_runner.py)."""
    env = os.environ.get(DIR_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgekit" / "llama.cpp"


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


# ------------------------------------------------------------------------------------------------ building
@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """One build at a time per cache (a second installer waits, then finds the build done)."""
    import fcntl

    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def sdist_path(download: bool = True) -> Path:
    """The sdist, kept in the cache (the binding installs from it too); fetched with pip from the configured
    package index when absent and ``download`` (install time only)."""
    dest = cache_root() / "sdist" / SDIST
    if dest.is_file():
        return dest
    if not download:
        raise LlamaCppMissing(f"{SDIST} is not in {dest.parent}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".download-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"{DIST}=={VERSION}",
            "-d",
            tmp,
        ]
        res = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / SDIST
        if res.returncode != 0 or not got.is_file():
            raise LlamaCppMissing(
                f"pip could not fetch {DIST}=={VERSION} (the llama.cpp source): "
                f"{(res.stderr or res.stdout).strip()[-800:]}",
                hint=f"pip download --no-deps --no-binary :all: {DIST}=={VERSION} -d DIR, then "
                "python -m edgekit.llm.llama_cpp --sdist DIR/" + SDIST,
            )
        os.replace(got, dest)
    return dest


def _extract_vendor(sdist: Path, dest: Path) -> Path:
    """Unpack only ``vendor/llama.cpp`` of the sdist (member paths checked: tarfile's 'data' filter)."""
    prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
    with tarfile.open(sdist) as tf:
        members = [m for m in tf.getmembers() if m.name.startswith(prefix)]
        if not members:
            raise LlamaCppMissing(f"{sdist} has no {prefix}: not the llama-cpp-python {VERSION} sdist")
        tf.extractall(dest, members=members, filter="data")
    return dest / prefix.rstrip("/")


def _run_logged(cmd: list[str], log: Path, cwd: Path | None = None) -> None:
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        res = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=cwd)
    if res.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-25:]
        raise EdgekitError(
            f"building llama.cpp failed ({cmd[0]} exited {res.returncode}):\n  " + "\n  ".join(tail),
            hint="a C/C++ compiler and cmake >= 3.14 are needed (apt-get install build-essential "
            "cmake, or pip install cmake); the whole log: " + str(log),
        )


def _jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def _cmake_build(
    sdist: Path, work: Path, args: list[str], targets: list[str], jobs: int | None
) -> tuple[Path, Path, Path]:
    """The vendored llama.cpp unpacked under ``work``, configured with ``args`` and ``targets`` built (Ninja when
    present); returns (source, build, log) folders/file."""
    src = _extract_vendor(sdist, work / "src")
    build, log = work / "build", work / "build.log"
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run_logged(["cmake", "-S", str(src), "-B", str(build), *gen, *args], log)
    _run_logged(
        ["cmake", "--build", str(build), "--config", "Release", "-j", str(jobs or _jobs()), "--target", *targets], log
    )
    return src, build, log


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
    with _locked(cache_root()):
        if not rebuild:
            with contextlib.suppress(LlamaCppMissing):
                return tools()  # another installer finished it while this one waited
        src_archive = Path(sdist) if sdist else sdist_path()
        t0 = time.perf_counter()
        work = Path(tempfile.mkdtemp(dir=cache_root(), prefix=f".{root.name}.building-"))
        try:
            say(f"llama.cpp {VERSION}: building from {src_archive.name} in {work} ({jobs or _jobs()} jobs)...")
            src, build, log = _cmake_build(src_archive, work, cmake_args(), ["llama", *TOOLS], jobs)
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
                "jobs": jobs or _jobs(),
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


# ------------------------------------------------------------------ for a board: cross-built, shipped as a wheel
# A board gets llama.cpp compiled on this host with Debian's cross compiler (building under qemu-user emulation
# takes hours), for its cores' -march (the target's ``march``), and the binding with that library inside: one
# wheel (``llama_cpp/lib/libllama.so`` beside the binding's Python, where the binding looks first), provisioned
# like any other runtime wheel (``edgekit devices provision NAME --runtime llama.cpp``, ``sim up --runtime``).
# No OpenMP (ggml's own thread pool): a board's minimal OS need not carry libgomp.
CROSS = {"aarch64": "aarch64-linux-gnu"}  # arch -> the GNU triplet of Debian's cross compiler
WHEEL_TAG = {"aarch64": "linux_aarch64"}
BOARD_CMAKE_ARGS = tuple(a for a in CMAKE_ARGS if a != "-DGGML_NATIVE=ON") + (
    "-DGGML_NATIVE=OFF",
    "-DGGML_OPENMP=OFF",
    "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_COMMON=OFF",
)


@dataclass(frozen=True)
class BoardBuild:
    """llama.cpp for a board: its architecture and its cores' GCC ``-march`` (e.g. ``armv8.2-a+dotprod+fp16``
    for the Raspberry Pi 5's Cortex-A76)."""

    arch: str
    march: str

    @property
    def triplet(self) -> str:
        if self.arch not in CROSS:
            raise LlamaCppMissing(
                f"edgekit cross-builds llama.cpp for {', '.join(CROSS)} only, not {self.arch}",
                hint="build llama-cpp-python on the device (pip install llama-cpp-python)",
            )
        return CROSS[self.arch]

    @property
    def root(self) -> Path:
        slug = "".join(c if c.isalnum() or c in ".-" else "_" for c in self.march)
        return cache_root() / f"{VERSION}-{self.arch}-{slug}"

    @property
    def wheel_name(self) -> str:
        return f"llama_cpp_python-{VERSION}-py3-none-{WHEEL_TAG[self.arch]}.whl"

    def cmake_args(self) -> list[str]:
        t = self.triplet
        flags = f"-march={self.march}"
        return [
            *BOARD_CMAKE_ARGS,
            "-DCMAKE_SYSTEM_NAME=Linux",
            f"-DCMAKE_SYSTEM_PROCESSOR={self.arch}",
            f"-DCMAKE_C_COMPILER={t}-gcc",
            f"-DCMAKE_CXX_COMPILER={t}-g++",
            # GGML_CPU_ARM_ARCH is ggml's own -march; the flags make the rest of the build agree
            f"-DGGML_CPU_ARM_ARCH={self.march}",
            f"-DCMAKE_C_FLAGS={flags}",
            f"-DCMAKE_CXX_FLAGS={flags}",
        ]


def _board_fresh(board: BoardBuild) -> bool:
    """A complete board build made with this edgekit's configure arguments (else it is stale: built again)."""
    info = board.root / "build.json"
    if not (board.root / board.wheel_name).is_file() or not info.is_file():
        return False
    return bool(json.loads(info.read_text(encoding="utf-8")).get("cmake_args") == board.cmake_args())


def board_wheel(
    board: BoardBuild, sdist: Path | None = None, *, jobs: int | None = None, say: Callable[[str], None] = print
) -> Path:
    """The binding wheel for ``board`` with its cross-built library inside, built once into the cache (a temp
    folder renamed into place; the wheel written last, so a killed build never looks complete). Deterministic:
    sorted entries, fixed timestamps (a re-provision sends nothing new)."""
    root = board.root
    wheel = root / board.wheel_name
    if _board_fresh(board):
        return wheel
    compiler = f"{board.triplet}-g++"
    if shutil.which(compiler) is None:
        raise LlamaCppMissing(
            f"cross-building llama.cpp for {board.arch} needs {compiler}, which is not on PATH",
            hint=f"apt-get install g++-{board.triplet} (Debian's cross compiler)",
        )
    if shutil.which("cmake") is None:
        raise LlamaCppMissing("building llama.cpp needs cmake, which is not on PATH", hint="apt-get install cmake")
    with _locked(cache_root()):
        if _board_fresh(board):  # another installer finished it while this one waited
            return wheel
        src_archive = Path(sdist) if sdist else sdist_path()
        t0 = time.perf_counter()
        work = Path(tempfile.mkdtemp(dir=cache_root(), prefix=f".{root.name}.building-"))
        try:
            say(f"llama.cpp {VERSION}: cross-building for {board.arch} -march={board.march} in {work}...")
            _, build, _ = _cmake_build(src_archive, work, board.cmake_args(), ["llama"], jobs)
            # every name the loader may ask for (libllama.so and the sonames libllama.so.0 -> ...): a wheel holds
            # no symbolic links, so each name carries the file's bytes
            libs = {
                so.name: so
                for so in sorted((build / "bin").glob("lib*.so*"))
                if re.fullmatch(r"lib[\w-]+\.so(\.\d+)?", so.name)
            }
            missing = [n for n in LIBS if f"lib{n}.so" not in libs]
            if missing:
                raise EdgekitError(f"the {board.arch} build of llama.cpp made no lib{missing[0]}.so (in {build})")
            host_wheel = _binding_wheel(src_archive, work / "host-wheel")
            stage = work / "stage"
            stage.mkdir()
            _write_board_wheel(host_wheel, libs, stage / board.wheel_name, board)
            info = {
                "llama_cpp_python": VERSION,
                "arch": board.arch,
                "march": board.march,
                "cmake_args": board.cmake_args(),
                "seconds": round(time.perf_counter() - t0, 1),
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            (stage / "build.json").write_text(json.dumps(info, indent=1), encoding="utf-8")
            if root.exists():
                os.replace(root, work / "old")
            os.replace(stage, root)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        say(f"llama.cpp {VERSION} for {board.arch} ({board.march}): {info['seconds']:.0f} s -> {root / wheel.name}")
        return wheel


def _binding_wheel(sdist: Path, dest: Path) -> Path:
    """The binding's pure-Python wheel built from the sdist without llama.cpp (``-DLLAMA_BUILD=OFF``)."""
    dest.mkdir(parents=True)
    env = dict(os.environ, CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-cache-dir",
            str(sdist),
            "-w",
            str(dest),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    got = sorted(dest.glob("llama_cpp_python-*.whl"))
    if res.returncode != 0 or not got:
        raise LlamaCppMissing(
            f"pip could not build the llama-cpp-python binding's wheel: {(res.stderr or res.stdout).strip()[-800:]}"
        )
    return got[0]


def _write_board_wheel(host_wheel: Path, libs: dict[str, Path], out: Path, board: BoardBuild) -> None:
    """The host wheel's Python files plus ``llama_cpp/lib/<libs>``, tagged for the board; RECORD rewritten
    (sha256 of every file), entries sorted, timestamps fixed."""
    import base64
    import zipfile

    dist_info = f"llama_cpp_python-{VERSION}.dist-info"
    files: dict[str, bytes] = {}
    with zipfile.ZipFile(host_wheel) as zin:
        for name in zin.namelist():
            if name.endswith("/") or name == f"{dist_info}/RECORD":
                continue
            data = zin.read(name)
            if name == f"{dist_info}/WHEEL":
                lines = [ln for ln in data.decode().splitlines() if not ln.startswith("Tag:")]
                lines.append(f"Tag: py3-none-{WHEEL_TAG[board.arch]}")
                data = ("\n".join(lines) + "\n").encode()
            files[name] = data
    for name, path in libs.items():
        files[f"llama_cpp/lib/{name}"] = path.read_bytes()
    record = []
    for name, data in sorted(files.items()):
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    tmp = out.with_name(out.name + ".part")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zout:
        for name, data in sorted(files.items()):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if name.endswith(".so") or ".so." in name else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zout.writestr(info, data)
    os.replace(tmp, out)


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
    "BoardBuild",
    "board_wheel",
]
