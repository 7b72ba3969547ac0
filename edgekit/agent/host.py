"""Host resources: how many threads host-side work may use now, applied to every library at once.

On a busy host (a CI runner with parallel jobs, a lab host running another deploy) a library that
sizes its thread pool to ``os.cpu_count()`` makes every parallel region wait for a core another
process holds: a batch-1 forward of a MobileNetV2-class program took 1.77 s with torch's default
2 threads and 7.8 ms with 1 thread on this 2-core host with both cores busy. So host-side work
(reference outputs, export and parity, calibration, sensitivity, fine-tunes, the host filter,
conversions) runs with the threads the CPU really has free: the cores of this process's affinity
mask, capped by its cgroup quota, less the other runnable tasks, at least 1. ``EDGEKIT_HOST_THREADS``
or ``--host-threads`` fixes the number. The measurement of the CPU is the device agent's own
``cpu_budget()`` (the same rule on the host as on a board). Nothing here runs at import time.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..errors import BadInputError
from .inprocess import load_agent

ENV = "EDGEKIT_HOST_THREADS"
# TensorFlow sizes its pools once, when its runtime starts (onnx2tf, litert-torch): from these
_TF_ENV = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


@dataclass(frozen=True)
class HostThreads:
    """The threads host-side work uses, and the facts they were sized from (the report records them)."""

    threads: int
    source: str  # "auto" | "EDGEKIT_HOST_THREADS" | "--host-threads"
    # the agent's cpu_budget(): usable_cores, others_running, load1 ...
    cpu: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        c = self.cpu
        usable = c.get("usable_cores")
        cores = f"{usable:g} cores" if usable is not None else "? cores"
        load = f", load {c['load1']:.1f}" if c.get("load1") is not None else ""
        others = f", {c['others_running']} other runnable" if c.get("others_running") is not None else ""
        why = "" if self.source == "auto" else f" ({self.source})"
        return f"host: {cores}{load}{others}, {self.threads} thread{'s' if self.threads != 1 else ''}{why}"

    def busy(self) -> bool:
        """Other work was runnable when the threads were sized (it holds cores this process could use)."""
        return (self.cpu.get("others_running") or 0) >= 1

    def to_dict(self) -> dict[str, Any]:
        # the CPU facts first: their own "threads" (the free CPU's) must not hide the number used
        return {**{k: v for k, v in self.cpu.items() if k != "threads"}, "free_cpu_threads": self.cpu.get("threads"),
                "threads": self.threads, "source": self.source, "summary": self.describe()}


def _parse(value: object, where: str) -> int:
    try:
        n = int(str(value).strip())
    except ValueError:
        n = 0
    if n < 1:
        raise BadInputError(f"{where} must be a whole number of threads >= 1, got {value!r}",
                            hint=f"e.g. {where}=1, or leave it unset to size the threads to the free CPU")
    return n


def cpu_flags() -> set[str]:
    """This host's CPU flags (/proc/cpuinfo's flags, or Features on ARM), empty where it cannot be read: what
    the host-side choices that hinge on the ISA read (VNNI for ORT's INT8 encodings, AMX for OpenVINO's bf16)."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith(("flags", "Features"))), "")
    except OSError:
        return set()
    return set(line.split(":", 1)[1].split()) if ":" in line else set()


def host_threads(override: int | None = None) -> HostThreads:
    """Threads for host-side work now: ``override`` (--host-threads), else $EDGEKIT_HOST_THREADS, else
    the free CPU (affinity and cgroup quota less the run queue, at least 1)."""

    cpu = load_agent().device.cpu_budget()
    if override is not None:
        return HostThreads(_parse(override, "--host-threads"), "--host-threads", cpu)
    if os.environ.get(ENV, "").strip():
        return HostThreads(_parse(os.environ[ENV], ENV), ENV, cpu)
    return HostThreads(int(cpu["threads"]), "auto", cpu)


@contextlib.contextmanager
def host_compute(ht: HostThreads) -> Iterator[HostThreads]:
    """Run host-side work with ``ht.threads`` threads in torch, OpenMP/BLAS pools (threadpoolctl) and
    TensorFlow (its environment, read when its runtime starts in this process or a child), restoring
    every setting afterwards. onnxruntime sessions edgekit opens on the host set their own
    ``intra_op_num_threads`` (1); ``ort_threads()`` gives the same number to any that take more."""
    n = ht.threads
    saved_env = {k: os.environ.get(k) for k in _TF_ENV}
    for k in _TF_ENV:
        os.environ[k] = str(n) if k == "TF_NUM_INTRAOP_THREADS" else "1"
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    _set_tf_threads(n)
    token = _ACTIVE.set(ht)
    try:
        with _blas_limits(n):
            yield ht
    finally:
        _ACTIVE.reset(token)
        torch.set_num_threads(old)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_ACTIVE: contextvars.ContextVar["HostThreads | None"] = contextvars.ContextVar("edgekit_host_threads",
                                                                            default=None)


def ort_threads() -> int:
    """intra_op_num_threads for an onnxruntime session opened on the host inside ``host_compute``
    (1 outside it: the host-side sessions are small and run beside other work)."""
    ht = _ACTIVE.get()
    return ht.threads if ht is not None else 1


def current() -> HostThreads | None:
    return _ACTIVE.get()


@contextlib.contextmanager
def _blas_limits(n: int) -> Iterator[None]:
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # scikit-learn's dependency; without it numpy's pools keep their size
        yield
        return
    with threadpool_limits(limits=n):
        yield


def _set_tf_threads(n: int) -> None:
    """TensorFlow already imported in this process: set its pools while they can still change."""
    import sys

    tf = sys.modules.get("tensorflow")
    if tf is None:
        return
    try:
        tf.config.threading.set_intra_op_parallelism_threads(n)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except (RuntimeError, AttributeError):  # its runtime has started: the pools keep their size
        pass

__all__ = ["HostThreads", "host_threads", "host_compute", "ort_threads", "current", "ENV"]
