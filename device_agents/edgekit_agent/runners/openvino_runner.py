"""OpenVINO: an IR (``.xml`` beside its ``.bin``) on the CPU plugin, at the precision the variant means;
its performance counters as the op profiler."""

from __future__ import annotations

import os
import sys
from typing import Any, Sequence

from ..protocol import EXIT_RUNTIME, AgentFailure, Doc
from .base import Runner, dist_version, finish_op_profile, probe_installed


class OpenVINORunner(Runner):
    """An OpenVINO IR (``.xml`` beside its ``.bin`` weights) on OpenVINO's CPU plugin.

    What the CPU plugin computes in is an inference hint, not a property of the file: on a CPU with
    AVX-512 BF16/AMX its default is bf16 (fp16 on ARM cores with fp16 arithmetic), elsewhere f32. The
    hop records the precision a variant means in the IR's rt_info (``edgekit/inference_precision``:
    ``f32``, or ``auto`` for the plugin's default), the runner applies it, and reports the precision
    the compiled model runs at (``options.inference_precision``, read back), which ship/runtime.json
    then spells out. CPU pinning is off (hosts and boards are shared); one stream, latency hint,
    unless asked otherwise. Compile time is the load time the agent already measures."""

    name = "openvino"
    log_missing = False
    # Runtime options, checked against openvino 2026.4's CPU plugin properties:
    # - inference_precision: INFERENCE_PRECISION_HINT (overrides what the IR asks for)
    # - performance_hint: PERFORMANCE_HINT LATENCY (default here) or THROUGHPUT (streams by the plugin)
    # - num_streams: NUM_STREAMS (default 1: one request at a time is what the agent times)
    OPTIONS = {
        "inference_precision": ("f32", "bf16", "f16"),
        "performance_hint": ("latency", "throughput"),
        "num_streams": None,
    }

    @classmethod
    def probe(cls) -> tuple[str | None, str | None]:
        return probe_installed("openvino", "openvino is not installed (pip install openvino)")

    @staticmethod
    def wanted_precision(model: Any) -> str | None:
        """What the IR asks for (``edgekit/inference_precision``): "f32", or None for the plugin's default."""
        try:
            if model.has_rt_info(["edgekit", "inference_precision"]):
                v = model.get_rt_info(["edgekit", "inference_precision"])
                v = v.astype(str) if hasattr(v, "astype") else str(v)
                return None if v == "auto" else str(v)
        except Exception:  # an IR edgekit did not write has no such entry
            pass
        return None

    def load(self, model_path: str, request: Doc) -> None:
        threads = int(request.get("threads", 1))
        opts = self.check_options(request.get("runtime_options"))
        # offline: openvino's usage telemetry (openvino_telemetry: Google Analytics, files under ~/intel) is made
        # unimportable for this process, so openvino falls back to its no-op stub
        sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[arg-type]
        try:
            import openvino as ov
        except ImportError as exc:
            raise AgentFailure(
                "runtime_missing",
                f"openvino is not installed on this device ({exc}); pip install openvino",
                EXIT_RUNTIME,
            ) from exc
        self.version = dist_version("openvino") or ov.__version__
        core = ov.Core()
        # delivered by content hash, the .bin is not beside the .xml under its stem: the request says where
        weights = (request.get("companions") or {}).get(".bin") or os.path.splitext(str(model_path))[0] + ".bin"
        try:
            model = core.read_model(str(model_path), weights)
        except Exception as exc:
            raise AgentFailure(
                "model_load_failed",
                f"openvino cannot read {model_path} with its weights {weights}: {exc}",
                EXIT_RUNTIME,
            ) from exc
        precision = opts.get("inference_precision") or self.wanted_precision(model)
        hint = opts.get("performance_hint", "latency")
        config: Doc = {
            "INFERENCE_NUM_THREADS": threads,
            "ENABLE_CPU_PINNING": False,
            "PERFORMANCE_HINT": hint.upper(),
            "NUM_STREAMS": str(opts.get("num_streams", 1)),
        }
        if precision:
            config["INFERENCE_PRECISION_HINT"] = precision
        cache = os.environ.get("EDGEKIT_OPENVINO_CACHE_DIR")
        if cache:  # OpenVINO's compiled-blob cache: a second load of the same IR skips compilation
            config["CACHE_DIR"] = cache
        try:
            self.compiled = core.compile_model(model, "CPU", config)
        except Exception as exc:
            raise AgentFailure(
                "model_load_failed", f"openvino's CPU plugin cannot compile {model_path}: {exc}", EXIT_RUNTIME
            ) from exc
        self.request = self.compiled.create_infer_request()
        ran_at = self.compiled.get_property("INFERENCE_PRECISION_HINT")  # an openvino Type: bf16, f16, f32
        self.options = {
            "inference_precision": ran_at.get_type_name() if hasattr(ran_at, "get_type_name") else str(ran_at),
            "performance_hint": hint,
            "num_streams": int(opts.get("num_streams", 1)),
        }
        self.threads = int(self.compiled.get_property("INFERENCE_NUM_THREADS")) or threads
        self.input_shapes = [
            [d.get_length() if d.is_static else None for d in i.get_partial_shape()] for i in self.compiled.inputs
        ]
        self.model_path, self.weights_path = str(model_path), weights
        self.core = core

    def static_batch(self) -> int | None:
        for s in self.input_shapes:
            if s and s[0] is not None:
                return int(s[0])
        return None

    def batch_dynamic(self) -> bool:
        return self.static_batch() is None

    def run(self, feeds: Sequence[Any]) -> list[Any]:
        res = self.request.infer(list(feeds))
        return [res[o] for o in self.compiled.outputs]

    def profile(self, feeds: Sequence[Any], runs: int) -> Doc:
        """OpenVINO's own performance counters (PERF_COUNT): the model compiled again with them on, per
        executed node (the plugin's fused nodes, named after the IR's layers, with the kernel that ran).
        The CPU plugin's counters are each node's MEAN over every inference of the request so far
        (measured: the sum over nodes decays run after run from the first, slow one), so the timed runs'
        own mean is recovered from two readings: after the first run (left out) and after the last."""
        import time as _time

        config = {
            "INFERENCE_NUM_THREADS": self.threads,
            "ENABLE_CPU_PINNING": False,
            "PERF_COUNT": True,
            "NUM_STREAMS": "1",
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": self.compiled.get_property("INFERENCE_PRECISION_HINT"),
        }
        compiled = self.core.compile_model(self.core.read_model(self.model_path, self.weights_path), "CPU", config)
        req = compiled.create_infer_request()

        def reading() -> dict[tuple[str, str, str], float]:
            return {
                (p.node_name, p.node_type, p.exec_type): p.real_time.total_seconds() * 1e6
                for p in req.profiling_info
                if not str(p.status).endswith("NOT_RUN")
            }

        req.infer(list(feeds))
        first = reading()
        runs = int(runs)
        runs_us = []
        for _ in range(runs):
            t0 = _time.perf_counter()
            req.infer(list(feeds))
            runs_us.append((_time.perf_counter() - t0) * 1e6)
        ops: dict[str, Doc] = {}
        for (node, op_type, kernel), mean_all in reading().items():
            total = max(0.0, mean_all * (runs + 1) - first.get((node, op_type, kernel), 0.0))  # the timed runs' sum
            ops[node] = {
                "node": node,
                "op_type": op_type,
                "calls": runs,
                "total_us": total,
                "provider": kernel,
                "us": [total / runs] * runs,
            }
        return finish_op_profile("openvino", ops, runs_us)
