"""llama.cpp built from the source llama-cpp-python's sdist vendors (why the sdist: ``llm/llama_cpp.py``): the
sdist, the cmake build, the build cache and its lock, shared with this host's own build (``llm/llama_cpp.py``), and
a board's build: the binding wheel with llama.cpp cross-compiled for the board's cores, which provisioning installs
like any runtime wheel (``provision.build_host_wheel``). Here, in the device layer, because provisioning a board
needs it; ``python -m edgekit.llm.llama_cpp --board TARGET`` builds it ahead."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
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

VERSION = "0.3.36"  # llama-cpp-python; its vendored llama.cpp is what gets built
DIST = "llama-cpp-python"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
LIBS = ("llama", "ggml", "ggml-base", "ggml-cpu")  # libllama.so needs the other three beside it
INSTALL = "bash .ci/llama_cpp.sh"  # from the repository root; or: python -m edgekit.llm.llama_cpp
DIR_ENV = "EDGEKIT_LLAMA_CPP_DIR"  # the cache of builds (default ~/.cache/edgekit/llama.cpp)
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

class LlamaCppMissing(MissingExtraError):
    """llama.cpp (or its Python binding) is not built on this host: the message says what is missing, the hint
    the command that builds it. A ``MissingExtraError`` (exit 2), so callers that catch those catch this."""

    def __init__(self, message: str, *, hint: str = INSTALL):
        EdgekitError.__init__(self, message, hint=hint)
        self.package = DIST
        self.extra = "llamacpp"


def cache_root() -> Path:
    """``$EDGEKIT_LLAMA_CPP_DIR``, else ``$XDG_CACHE_HOME/edgekit/llama.cpp`` (``~/.cache/edgekit/llama.cpp``).
    Not under ``$EDGEKIT_HOME``: a native build of minutes belongs to the machine, and edgekit homes (a test
    session's, a CI job's) come and go; the device agent looks in the same place (runners/llamacpp_runner.py)."""
    env = os.environ.get(DIR_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgekit" / "llama.cpp"


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
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


def build_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def cmake_build(
    sdist: Path, work: Path, args: list[str], targets: list[str], jobs: int | None
) -> tuple[Path, Path, Path]:
    """The vendored llama.cpp unpacked under ``work``, configured with ``args`` and ``targets`` built (Ninja when
    present); returns (source, build, log) folders/file."""
    src = _extract_vendor(sdist, work / "src")
    build, log = work / "build", work / "build.log"
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run_logged(["cmake", "-S", str(src), "-B", str(build), *gen, *args], log)
    _run_logged(
        ["cmake", "--build", str(build), "--config", "Release", "-j", str(jobs or build_jobs()), "--target", *targets],
        log,
    )
    return src, build, log


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
    with locked(cache_root()):
        if _board_fresh(board):  # another installer finished it while this one waited
            return wheel
        src_archive = Path(sdist) if sdist else sdist_path()
        t0 = time.perf_counter()
        work = Path(tempfile.mkdtemp(dir=cache_root(), prefix=f".{root.name}.building-"))
        try:
            say(f"llama.cpp {VERSION}: cross-building for {board.arch} -march={board.march} in {work}...")
            _, build, _ = cmake_build(src_archive, work, board.cmake_args(), ["llama"], jobs)
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
