"""The `benchmark_model` agent mode: TFLite/LiteRT's own benchmark binary measures the model.

For devices without a Python runtime (a stock phone): edgekit pushes the user's
``benchmark_model`` binary (``--benchmark-binary PATH``) or finds one already on the device, runs it
on the bundle's .tflite over the transport, and parses what it prints into the report's fields.
edgekit never downloads the binary: it comes from the user (TensorFlow's prebuilt
``android_aarch64_benchmark_model``, or a bazel build of ``tensorflow/lite/tools/benchmark``).

What the tool prints, and what it does not:
- ``Inference timings in us: Init: .., First inference: .., Warmup (avg): .., Inference (avg): ..``
- per phase ``count= first= curr= min= max= avg= std=`` (microseconds), with ``p5= median= p95=``
  in newer versions; no raw per-run timings, so p90/p99 and the median's confidence interval are
  null in this mode, with the reason;
- memory: ``Peak memory footprint (MB): init= overall=`` (older), or ``Memory footprint delta from
  the start of the tool (MB)`` plus ``Overall peak memory footprint (MB) via periodic monitoring``
  (newer). A 0 means the platform did not support the measurement: null with the reason.
- the newer LiteRT tool (``benchmark_litert_model``) prints a ``BENCHMARK RESULTS`` block in ms.
Accuracy is not measured by this tool; on a device that also has Python, it comes from the Python
agent and the report says which figure came from where (``measured_by``).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import AgentError, BadInputError
from ..fsutil import sha256_file
from ..transport.base import Transport

DEVICE_CANDIDATES = ("benchmark_model", "/data/local/tmp/benchmark_model", "/data/local/tmp/benchmark_litert_model")
BINARY_HINT = ("pass --benchmark-binary PATH with TensorFlow's prebuilt android_aarch64_benchmark_model (or a bazel "
               "build of //tensorflow/lite/tools/benchmark:benchmark_model); edgekit never downloads it")

_NUM = r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
_STAT_RE = re.compile(
    rf"(?<![\w(])count=(?P<count>\d+)(?: first=(?P<first>{_NUM}))? curr=(?P<curr>{_NUM})"
    rf"(?:\(all same\))?(?: min=(?P<min>{_NUM}) max=(?P<max>{_NUM}) avg=(?P<avg>{_NUM}) std=(?P<std>{_NUM}))?"
    rf"(?: p5=(?P<p5>{_NUM}) median=(?P<median>{_NUM}) p95=(?P<p95>{_NUM}))?")
_TIMINGS_RE = re.compile(
    rf"Inference timings in us: Init: (?P<init>{_NUM}), First inference: (?P<first>{_NUM}), "
    rf"Warmup \(avg\): (?P<warmup>{_NUM}), Inference \(avg\): (?P<inference>{_NUM})")
_PEAK_OLD_RE = re.compile(rf"Peak memory footprint \(MB\): init=(?P<init>{_NUM}) overall=(?P<overall>{_NUM})")
_DELTA_RE = re.compile(rf"Memory footprint delta from the start of the tool \(MB\): init=(?P<init>{_NUM}) "
                       rf"overall=(?P<overall>{_NUM})")
_PEAK_MON_RE = re.compile(rf"Overall peak memory footprint \(MB\) via periodic monitoring: (?P<peak>{_NUM})")
_RUNNING_RE = re.compile(r"Running benchmark for at least (\d+) iterations")
# the LiteRT tool's summary block (milliseconds)
_LRT = {
    "init_ms": re.compile(rf"Model initialization:\s+(?P<v>{_NUM}) ms"),
    "first_ms": re.compile(rf"Warmup \(first\):\s+(?P<v>{_NUM}) ms"),
    "warmup_ms": re.compile(rf"Warmup \(avg\):\s+(?P<v>{_NUM}) ms \((?P<n>\d+) runs\)"),
    "avg_ms": re.compile(rf"Inference \(avg\):\s+(?P<v>{_NUM}) ms \((?P<n>\d+) runs\)"),
    "min_ms": re.compile(rf"Inference \(min\):\s+(?P<v>{_NUM}) ms"),
    "max_ms": re.compile(rf"Inference \(max\):\s+(?P<v>{_NUM}) ms"),
    "std_ms": re.compile(rf"Inference \(std\):\s+(?P<v>{_NUM})"),
    "init_mb": re.compile(rf"Init footprint:\s+(?P<v>{_NUM}) MB"),
    "overall_mb": re.compile(rf"Overall footprint:\s+(?P<v>{_NUM}) MB"),
}


@dataclass
class PhaseStats:
    """One ``count=...`` line, converted to milliseconds."""

    count: int
    first_ms: float | None = None
    curr_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    avg_ms: float | None = None
    std_ms: float | None = None
    p5_ms: float | None = None
    median_ms: float | None = None
    p95_ms: float | None = None


@dataclass
class BenchmarkModelResult:
    tool: str  # "benchmark_model" or "benchmark_litert_model"
    init_ms: float | None
    first_inference_ms: float | None
    warmup_avg_ms: float | None
    warmup: PhaseStats | None
    inference_avg_ms: float
    inference: PhaseStats | None
    peak_memory_mb: float | None
    memory: dict = field(default_factory=dict)
    unavailable: dict = field(default_factory=dict)

    def to_report(self) -> dict:
        """The report's field names (ms, MB); what the tool does not print is null with the reason."""
        inf = self.inference
        unavailable = dict(self.unavailable)
        unavailable.setdefault("latency_ms.raw", "benchmark_model prints no per-run timings, so p90, p99 and the "
                               "median's confidence interval cannot be computed")
        if inf is None or inf.median_ms is None:
            unavailable.setdefault("latency_ms.p50", "this benchmark_model version prints no median (p5/median/p95 "
                                   "arrived in newer TensorFlow releases)")
        latency = {
            "warmup": self.warmup.count if self.warmup else None,
            "runs": inf.count if inf else None,
            "raw": None,
            "mean": self.inference_avg_ms,
            "std": inf.std_ms if inf else None,
            "min": inf.min_ms if inf else None,
            "max": inf.max_ms if inf else None,
            "p5": inf.p5_ms if inf else None,
            "p50": inf.median_ms if inf else None,
            "p95": inf.p95_ms if inf else None,
            "p90": None,
            "p99": None,
            "ci95": None,
            "first_ms": self.first_inference_ms,
            "warmup_avg_ms": self.warmup_avg_ms,
        }
        return {
            "measured_by": self.tool,
            "load_ms": self.init_ms,
            "latency_ms": latency,
            "peak_memory_mb": self.peak_memory_mb,
            "memory": self.memory,
            "unavailable": unavailable,
        }

    def to_dict(self) -> dict:
        return asdict(self)


def _f(v: str | None, scale: float = 1.0) -> float | None:
    return float(v) * scale if v is not None else None


def _phase(m: re.Match) -> PhaseStats:
    us = 1e-3
    g = m.groupdict()
    curr = _f(g["curr"], us)
    all_same = g["min"] is None
    return PhaseStats(count=int(g["count"]), first_ms=_f(g["first"], us) if g["first"] else curr, curr_ms=curr,
                      min_ms=curr if all_same else _f(g["min"], us), max_ms=curr if all_same else _f(g["max"], us),
                      avg_ms=curr if all_same else _f(g["avg"], us), std_ms=0.0 if all_same else _f(g["std"], us),
                      p5_ms=_f(g["p5"], us), median_ms=_f(g["median"], us), p95_ms=_f(g["p95"], us))


def _stat_lines(text: str) -> list[tuple[int | None, PhaseStats]]:
    """(section index from 'Running benchmark ...' headers or None, stats) in output order; the op
    profiler's 'Timings (microseconds): count=...' lines are not phases."""
    out: list[tuple[int | None, PhaseStats]] = []
    section = -1
    for line in text.splitlines():
        if _RUNNING_RE.search(line):
            section += 1
            continue
        if "Timings (microseconds)" in line or "Memory (bytes)" in line:
            continue
        m = _STAT_RE.search(line)
        if m:
            out.append((section if section >= 0 else None, _phase(m)))
    return out


def parse_benchmark_output(text: str) -> BenchmarkModelResult:
    """Parse benchmark_model's (or benchmark_litert_model's) output; raise AgentError when it failed."""
    unavailable: dict[str, str] = {}
    memory: dict = {}
    t = _TIMINGS_RE.search(text)
    lrt_avg = _LRT["avg_ms"].search(text)
    stats = _stat_lines(text)
    if t is None and lrt_avg is None:
        errors = [ln.strip() for ln in text.splitlines() if "ERROR" in ln or "failed" in ln.lower()]
        picked = list(dict.fromkeys(errors[:1] + errors[-3:]))  # the first error is the cause, the last the verdict
        detail = "; ".join(picked) or text.strip()[-300:] or "(no output)"
        raise AgentError(f"benchmark_model did not finish a benchmark: {detail}",
                         hint="run the same command with `adb shell` to see why; a delegate that fails to apply is "
                              "the usual cause")
    warmup = inference = None
    by_section = {s: p for s, p in stats if s is not None}
    if t is not None:
        tool = "benchmark_model"
        init_ms = float(t["init"]) / 1e3
        first_ms = float(t["first"]) / 1e3
        warmup_avg = float(t["warmup"]) / 1e3
        inf_avg = float(t["inference"]) / 1e3
        if by_section:
            warmup, inference = by_section.get(0), by_section.get(1)
        else:  # output trimmed of its headers: match the phases by their averages
            for _, p in stats:
                if p.avg_ms is not None and abs(p.avg_ms - inf_avg) <= 1e-6 * max(1.0, inf_avg):
                    inference = p
                elif p.avg_ms is not None and abs(p.avg_ms - warmup_avg) <= 1e-6 * max(1.0, warmup_avg):
                    warmup = p
    else:
        tool = "benchmark_litert_model"
        g = {k: r.search(text) for k, r in _LRT.items()}
        init_ms = _f(g["init_ms"]["v"]) if g["init_ms"] else None
        first_ms = _f(g["first_ms"]["v"]) if g["first_ms"] else None
        warmup_avg = _f(g["warmup_ms"]["v"]) if g["warmup_ms"] else None
        inf_avg = float(lrt_avg["v"])
        warmup, inference = by_section.get(0), by_section.get(1)
        if inference is None:
            inference = PhaseStats(count=int(lrt_avg["n"]), avg_ms=inf_avg,
                                   min_ms=_f(g["min_ms"]["v"]) if g["min_ms"] else None,
                                   max_ms=_f(g["max_ms"]["v"]) if g["max_ms"] else None,
                                   std_ms=_f(g["std_ms"]["v"]) if g["std_ms"] else None)
        if g["overall_mb"]:
            memory.update({"init_mb": float(g["init_mb"]["v"]) if g["init_mb"] else None,
                           "overall_mb": float(g["overall_mb"]["v"]), "source": "benchmark_litert_model footprint"})

    peak = None
    if (m := _PEAK_MON_RE.search(text)) and float(m["peak"]) > 0:
        peak = float(m["peak"])
        memory["source"] = "benchmark_model periodic monitoring (peak RSS)"
    if m := _PEAK_OLD_RE.search(text):
        memory.update({"init_mb": float(m["init"]), "overall_mb": float(m["overall"])})
        if peak is None and float(m["overall"]) > 0:
            peak = float(m["overall"])
            memory["source"] = "benchmark_model peak memory footprint (max RSS)"
    if m := _DELTA_RE.search(text):
        memory.update({"footprint_delta_init_mb": float(m["init"]), "footprint_delta_overall_mb": float(m["overall"])})
    if peak is None:
        if memory.get("overall_mb") == 0.0:
            unavailable["peak_memory_mb"] = "benchmark_model reported 0 MB: memory accounting is not supported there"
        elif "Peak memory usage not available" in text:
            unavailable["peak_memory_mb"] = ("benchmark_litert_model: 'Peak memory usage not available'; its footprint "
                                            "figures are in memory.init_mb / memory.overall_mb")
        elif "footprint_delta_overall_mb" in memory:
            unavailable["peak_memory_mb"] = ("this benchmark_model prints only the footprint delta from its own start "
                                            "(memory.footprint_delta_overall_mb), not a peak")
        else:
            unavailable["peak_memory_mb"] = "benchmark_model printed no memory figures"
    return BenchmarkModelResult(tool=tool, init_ms=init_ms, first_inference_ms=first_ms, warmup_avg_ms=warmup_avg,
                                warmup=warmup, inference_avg_ms=inf_avg, inference=inference, peak_memory_mb=peak,
                                memory=memory, unavailable=unavailable)


# --------------------------------------------------------------------------- on the device
def validate_binary_option(value: str | Path | None) -> str | Path | None:
    """``--benchmark-binary``: a local file, or 'device' (use one already on the device)."""
    if value is None or str(value) == "device":
        return value
    if not Path(value).is_file():
        raise BadInputError(f"--benchmark-binary {value}: no such file", hint=BINARY_HINT)
    return Path(value)


def install_binary(t: Transport, binary: Path | None, timeout: float = 60.0) -> str:
    """The device path of a runnable benchmark_model: the user's binary, pushed by content (it is
    re-sent only when it changed), else one already on the device."""
    if binary is not None:
        binary = Path(binary)
        if not binary.is_file():
            raise BadInputError(f"--benchmark-binary {binary}: no such file", hint=BINARY_HINT)
        digest = sha256_file(binary)
        remote = t.remote_path(f"bin/benchmark_model-{digest[:16]}")
        have = t.run(["sha256sum", remote], timeout=timeout, cwd="/")
        if not (have.ok and have.stdout.split()[:1] == [digest]):
            t.push(binary, remote)  # verified on the device, renamed into place
        chmod = t.run(["chmod", "755", remote], timeout=timeout, cwd="/")
        if not chmod.ok:
            raise AgentError(f"cannot make {remote} executable: {chmod.stderr.strip()[-200:]}")
        return remote
    for cand in DEVICE_CANDIDATES:
        probe = t.run(["sh", "-c", 'command -v "$1"', "edgekit-find", cand], timeout=timeout, cwd="/")
        if probe.ok and probe.stdout.strip():
            return probe.stdout.strip().splitlines()[0]
    raise BadInputError("no benchmark_model on the device (looked for " + ", ".join(DEVICE_CANDIDATES) + ")",
                        hint=BINARY_HINT)


def benchmark_argv(binary: str, model: str, *, threads: int, warmup: int, runs: int, min_seconds: float,
                   pin_mask: str | None = None) -> list[str]:
    argv = [binary, f"--graph={model}", f"--num_threads={int(threads)}", f"--warmup_runs={int(warmup)}",
            f"--num_runs={int(runs)}", f"--min_secs={float(min_seconds):g}", "--enable_op_profiling=false"]
    return ["taskset", pin_mask, *argv] if pin_mask else argv


def run_benchmark_model(t: Transport, model_remote: str, *, binary: Path | None = None, threads: int = 1,
                        warmup: int = 1, runs: int = 50, min_seconds: float = 1.0,
                        timeout: float = 600.0) -> BenchmarkModelResult:
    """Run benchmark_model on ``model_remote`` (a .tflite already on the device) and parse it."""
    if posixpath.splitext(model_remote)[1] != ".tflite":
        raise BadInputError(f"benchmark_model runs .tflite models, not {posixpath.basename(model_remote)}",
                            hint="convert the variant to TFLite first (targets that prefer litert do this)")
    exe = install_binary(t, binary)
    argv = benchmark_argv(exe, t.remote_path(model_remote), threads=threads, warmup=warmup, runs=runs,
                          min_seconds=min_seconds, pin_mask=getattr(t, "pin_mask", None))
    res = t.run(argv, timeout=timeout)
    text = res.stdout + "\n" + res.stderr  # TFLITE_LOG writes to stderr; some builds to stdout
    result = parse_benchmark_output(text)
    if not res.ok:
        raise AgentError(f"benchmark_model exited {res.returncode}: {text.strip()[-300:]}")
    return result
