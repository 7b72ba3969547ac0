"""ExecuTorch: a ``.pte`` program (XNNPACK-delegated or portable kernels) on ExecuTorch's Python runtime,
its process-wide XNNPACK thread pool sized per request, its event tracer (ETDump) as the op profiler."""

from __future__ import annotations

import json
import os
import platform
from typing import Any, ClassVar, Sequence

from ..protocol import EXIT_BAD_REQUEST, EXIT_RUNTIME, AgentFailure, Doc
from .base import Runner, dist_version, finish_op_profile, no_op_profile, probe_installed


def aarch64_hwcap() -> int | None:
    """AT_HWCAP of this process on aarch64 Linux (from /proc/self/auxv), else None."""
    if platform.machine() not in ("aarch64", "arm64"):
        return None
    try:
        with open("/proc/self/auxv", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    import struct

    for i in range(0, len(data) - 15, 16):
        key, value = struct.unpack_from("<QQ", data, i)
        if key == 16:  # AT_HWCAP
            return int(value)
    return None


def version_tuple(v: str | None) -> tuple[int, ...]:
    out = []
    for part in (v or "").split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


class ExecuTorchRunner(Runner):
    """A .pte program (XNNPACK-delegated or portable kernels) on ExecuTorch's Python runtime. Its
    pybindings link libtorch, so the device needs torch beside executorch: on aarch64 the pair
    edgekit provisions is PyPI's CPU-only torch 2.10.0 + executorch 1.1.0 (its extension is
    ``_portable_lib``; 1.5.1's is ``_C``), which runs the .pte files the host's executorch 1.5.1 writes."""

    name = "executorch"
    log_missing = False
    # No runtime options: whether XNNPACK runs a node is decided when the program is lowered (the
    # .pte carries the delegate's blobs; there is no run-time switch), and XNNPACK's thread count is
    # the request's threads (the pool below). Checked against executorch 1.5.1's pybindings: the
    # pool is extension/threadpool's process-wide pthreadpool, sized by _unsafe_reset_threadpool
    # and read by _threadpool_get_thread_count; torch.set_num_threads does not touch it (measured:
    # the pool stays at the core count, CPU time/wall 1.9 at 2 threads either way).
    OPTIONS = {}
    _alive: ClassVar[Any] = None  # the runners of this process whose programs hold the pool (a WeakSet)
    # ExecuTorch ScalarType codes -> numpy dtype names (the ones a .pte's user I/O can have)
    DTYPES = {
        0: "uint8",
        1: "int8",
        2: "int16",
        3: "int32",
        4: "int64",
        5: "float16",
        6: "float32",
        7: "float64",
        11: "bool",
    }

    @classmethod
    def probe(cls) -> tuple[str | None, str | None]:
        # metadata only: importing the runtime costs seconds (torch); load() reports a broken install
        return probe_installed("executorch", "executorch is not installed (pip install executorch; it needs torch)")

    def load(self, model_path: str, request: Doc) -> None:
        threads = int(request.get("threads", 1))
        self.check_options(request.get("runtime_options"))
        found = self.found()
        hwcap = aarch64_hwcap()
        torch_v = dist_version("torch")
        if hwcap is not None and not hwcap & (1 << 8) and torch_v and version_tuple(torch_v) >= (2, 10):
            # measured: torch 2.10.0's aarch64 wheel executes an LSE atomic (ldaddal, libc10.so) while it
            # imports; without them the process dies of SIGILL and the host would only see a lost agent
            raise AgentFailure(
                "runtime_missing",
                f"ExecuTorch needs torch on this device, and {found}: torch "
                f"{torch_v}'s aarch64 wheel uses ARMv8.1 LSE atomics, which this CPU lacks "
                f"(AT_HWCAP {hwcap:#x} has no 'atomics'; e.g. a Cortex-A72 / Raspberry Pi 4), so "
                "`import torch` would die of SIGILL; torch 2.9.1 imports there, but executorch "
                "1.0.1 (its pair) hit SIGILL on an SDOT in XNNPACK's int8 kernels",
                EXIT_RUNTIME,
            )
        try:
            import torch  # first: the pybindings resolve libtorch from the loaded torch

            _C = self._extension()
        except ImportError as exc:
            raise AgentFailure(
                "runtime_missing",
                f"ExecuTorch's runtime does not import on this device ({found}): "
                f"{exc}; pip install executorch with the torch its extension was built against (on "
                "aarch64: torch==2.10.0 + executorch==1.1.0, `edgekit devices provision NAME --runtime "
                "executorch`)",
                EXIT_RUNTIME,
            ) from exc

        self.torch = torch
        self.version = dist_version("executorch")
        self.pool_threads = self._size_pool(_C, threads)
        try:
            self.program = _C._load_program(str(model_path))
            self.method = self.program.load_method("forward")
        except Exception as exc:
            raise AgentFailure(
                "model_load_failed",
                f"ExecuTorch cannot load {model_path} ({found}; a .pte "
                f"whose flatbuffer or delegate blobs are newer than this runtime fails here): {exc}",
                EXIT_RUNTIME,
            ) from exc
        ExecuTorchRunner._alive.add(self)
        meta = self.method.method_meta()
        self.input_shapes = [list(meta.input_tensor_meta(i).sizes()) for i in range(meta.num_inputs())]
        self.input_dtypes = [self.DTYPES.get(meta.input_tensor_meta(i).dtype()) for i in range(meta.num_inputs())]
        self.threads = self.pool_threads  # read back from the pool where the build can
        self.model_path = str(model_path)

    @staticmethod
    def found() -> str:
        """What the device has, for error messages: executorch's and torch's versions (metadata only)
        and the torch range the executorch wheel was built for."""
        import importlib.metadata

        et = dist_version("executorch")
        built = ""
        if et:
            try:
                reqs = importlib.metadata.requires("executorch") or []
            except importlib.metadata.PackageNotFoundError:
                reqs = []
            pin = next(
                (
                    r.split(";")[0].strip()
                    for r in reqs
                    if r.replace(" ", "").startswith("torch") and r.replace(" ", "")[5:6] in "<>=!~"
                ),
                None,
            )
            built = f" (built for {pin.replace(' ', '')})" if pin else ""
        torch_v = dist_version("torch")
        return (
            f"found executorch {et or 'not installed'}{built}, torch {torch_v or 'not installed'}, {platform.machine()}"
        )

    @staticmethod
    def _extension() -> Any:
        """The C extension that executorch.runtime wraps (the wrapper also imports the exir compiler
        stack: torchao, sympy; 4 of the 5.5 s an import takes on an x86 host, none of it needed here).
        executorch 1.5.1 names it ``_C``; 1.1.0 (the aarch64 device pair of torch 2.10) ``_portable_lib``."""
        import importlib

        try:
            return importlib.import_module("executorch.extension.pybindings._C")
        except ModuleNotFoundError as exc:
            if exc.name != "executorch.extension.pybindings._C":
                raise
            return importlib.import_module("executorch.extension.pybindings._portable_lib")

    @classmethod
    def _size_pool(cls, _C: Any, threads: int) -> int:
        """Size the pool XNNPACK's delegate runs on (default: every core) to ``threads`` before the
        program loads; returns its size read back (None where this build cannot read it).

        The delegate keeps the pool it was loaded with: resizing the pool under a loaded program
        and running that program segfaulted here (executorch 1.5.1; a same-size reset keeps the
        pool's threads). So the pool is reset only when its size differs, and never while a program
        loaded at another size is alive in this process (an A/B pair shares one size)."""
        import weakref

        if ExecuTorchRunner._alive is None:
            ExecuTorchRunner._alive = weakref.WeakSet()
        count = getattr(_C, "_threadpool_get_thread_count", None)  # absent from older builds
        if count is not None and count() == threads:
            return threads
        others = sorted({r.pool_threads for r in ExecuTorchRunner._alive if r.pool_threads != threads})
        if others:
            raise AgentFailure(
                "bad_request",
                f"ExecuTorch's XNNPACK thread pool is process-wide and a program "
                f"loaded in this process runs on {others[0]} threads: resizing it to {threads} would "
                "crash that program; load the two in separate processes",
                EXIT_BAD_REQUEST,
            )
        _C._unsafe_reset_threadpool(threads)
        return int(count()) if count is not None else threads

    def static_batch(self) -> int | None:
        # a .pte's memory plan is sized for its example shapes: the batch is fixed
        return int(self.input_shapes[0][0]) if self.input_shapes and self.input_shapes[0] else 1

    def run(self, feeds: Sequence[Any]) -> list[Any]:
        import numpy as np

        xs = [
            self.torch.from_numpy(np.ascontiguousarray(x if d is None else np.asarray(x).astype(d, copy=False)))
            for x, d in zip(feeds, self.input_dtypes)
        ]
        # the runtime copies outputs out of its memory plan on every call
        return [o.numpy() for o in self.method(xs) if isinstance(o, self.torch.Tensor)]

    def profile(self, feeds: Sequence[Any], runs: int) -> Doc:
        """ExecuTorch's event tracer: the program loaded again with ETDump on, the dump decoded to
        JSON by the flatc and schema that executorch ships (the devtools Inspector would import the
        whole exir stack). Without an ETRecord, delegated ops are named by the delegate (XNNPACK)."""
        import importlib.util
        import shutil
        import subprocess
        import tempfile

        _C = self._extension()
        program = _C._load_program(self.model_path, enable_etdump=True)
        if not program.has_etdump():
            return no_op_profile(f"executorch {self.version} was built without the event tracer (ETDump)")
        spec = importlib.util.find_spec("executorch")
        if spec is None or not spec.submodule_search_locations:
            return no_op_profile("executorch is not installed as a package here")
        pkg = list(spec.submodule_search_locations)[0]
        flatc = os.path.join(pkg, "data", "bin", "flatc")
        schemas = [os.path.join(pkg, "devtools", "etdump", f) for f in ("etdump_schema_flatcc.fbs", "scalar_type.fbs")]
        missing = [f for f in [flatc] + schemas if not os.path.isfile(f)]
        if missing:
            return no_op_profile(f"executorch {self.version} writes an ETDump but ships no {missing[0]} to decode it")
        saved = self.program, self.method
        tmp = tempfile.mkdtemp(prefix="edgekit-etdump-")
        try:
            self.program, self.method = program, program.load_method("forward")
            for _ in range(int(runs) + 1):
                self.run(feeds)
            dump = os.path.join(tmp, "run.etdp")
            program.write_etdump_result_to_file(dump, os.path.join(tmp, "debug.bin"))
            for f in schemas:
                shutil.copy(f, tmp)
            subprocess.run(
                [
                    flatc,
                    "--size-prefixed",
                    "--json",
                    "--defaults-json",
                    "--strict-json",
                    "-o",
                    tmp,
                    os.path.join(tmp, "etdump_schema_flatcc.fbs"),
                    "--",
                    dump,
                ],
                check=True,
                capture_output=True,
                timeout=120,
            )
            with open(os.path.join(tmp, "run.json"), encoding="utf-8") as fh:
                etdump = json.load(fh)
        finally:
            self.program, self.method = saved
            shutil.rmtree(tmp, ignore_errors=True)
        return self.profile_from_etdump(etdump)

    @staticmethod
    def profile_from_etdump(etdump: Doc) -> Doc:
        """Per-op times from a decoded ETDump: one "Execute" block a run (the first left out); an
        op is a delegate's own event (XNNPACK's "Convolution (NHWC, F32) IGEMM #1") or a portable
        kernel's; ticks are nanoseconds on the POSIX platform layer."""
        execs = [r for r in etdump.get("run_data", []) if r.get("name") == "Execute"]
        if not execs:
            return no_op_profile("the ETDump recorded no Execute run")
        timed = execs[1:] or execs
        ops: dict[str, Doc] = {}
        runs_us: list[float] = []
        for r in timed:
            run_us: list[float] = []
            for ev in r.get("events", []):
                pe = ev.get("profile_event")
                if not pe:
                    continue
                us = (float(pe["end_time"]) - float(pe["start_time"])) / 1000.0
                name, delegated = pe.get("name"), pe.get("delegate_debug_id_str")
                if name == "Method::execute":
                    run_us.append(us)
                if not delegated and (
                    not name
                    or name in ("Method::execute", "DELEGATE_CALL")
                    or name.startswith(("Method::", "Program::"))
                ):
                    continue
                node = delegated or name
                op = ops.setdefault(
                    node,
                    {
                        "node": node,
                        "op_type": node.rsplit(" #", 1)[0],
                        "calls": 0,
                        "total_us": 0.0,
                        "provider": "delegate" if delegated else "portable",
                        "us": [],
                    },
                )
                op["calls"] += 1
                op["total_us"] += us
                op["us"].append(us)
            runs_us.extend(t for t in run_us if t is not None)
        return finish_op_profile("executorch", ops, runs_us)
