"""ONNX Runtime (CPU execution provider): an ``.onnx`` file, its session options as a search dimension,
its own profiler's trace summed per node."""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

from ..protocol import EXIT_BAD_REQUEST, EXIT_RUNTIME, AgentFailure, Doc
from .base import Runner, finish_op_profile, no_op_profile


class OnnxRunner(Runner):
    """An ``.onnx`` file on onnxruntime's CPU execution provider, one sequential session."""

    name = "onnxruntime"

    @classmethod
    def probe(cls) -> tuple[str | None, str | None]:
        try:
            import onnxruntime
        except Exception as exc:  # a broken install is reported, not fatal
            return None, str(exc)
        return str(onnxruntime.__version__), None

    def load(self, model_path: str, request: Doc) -> None:
        threads = request.get("threads", 1)
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise AgentFailure(
                "runtime_missing", f"onnxruntime is not installed on this device ({exc})", EXIT_RUNTIME
            ) from exc
        self.version = ort.__version__
        so = ort.SessionOptions()
        so.intra_op_num_threads = int(threads)
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.log_severity_level = 3
        self.options = self._apply_options(ort, so, request.get("runtime_options"), int(threads))
        try:
            self.session = ort.InferenceSession(model_path, sess_options=so, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise AgentFailure(
                "model_load_failed", f"onnxruntime cannot load {model_path}: {exc}", EXIT_RUNTIME
            ) from exc
        self.threads = int(threads)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.input_shapes = [list(i.shape) for i in self.session.get_inputs()]
        self.model_path, self.session_options = model_path, so  # the profiling session is built alike

    def profile(self, feeds: Sequence[Any], runs: int) -> Doc:
        """onnxruntime's own profiler: a second session with ``enable_profiling`` (same options, so
        the same optimized graph and node names), its JSON trace summed per node."""
        import shutil
        import tempfile

        import onnxruntime as ort

        tmp = tempfile.mkdtemp(prefix="edgekit-ort-profile-")
        try:
            so = self.session_options  # already copied into the timed session: changing it is safe
            so.enable_profiling = True
            so.profile_file_prefix = os.path.join(tmp, "ort")
            sess = ort.InferenceSession(self.model_path, sess_options=so, providers=["CPUExecutionProvider"])
            feed = dict(zip(self.input_names, feeds))
            for _ in range(int(runs) + 1):
                sess.run(None, feed)
            with open(sess.end_profiling(), encoding="utf-8") as fh:
                trace = json.load(fh)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return self.profile_from_trace(trace)

    @staticmethod
    def profile_from_trace(trace: Any) -> Doc:
        """Kernel times per node from an onnxruntime trace, the first run (allocations, kernel
        selection) left out; ``total_us`` is the profiled runs' own wall time (model_run events)."""
        events = trace if isinstance(trace, list) else trace.get("traceEvents", [])
        model_runs = sorted(
            (e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"), key=lambda e: e["ts"]
        )
        if not model_runs:
            return no_op_profile("onnxruntime's trace has no model_run events")
        start = model_runs[0]["ts"] + model_runs[0]["dur"] if len(model_runs) > 1 else 0
        ops: dict[str, Doc] = {}
        for e in events:
            name = e.get("name", "")
            if e.get("cat") != "Node" or not name.endswith("_kernel_time") or e.get("ts", 0) < start:
                continue
            args = e.get("args") or {}
            node = name[: -len("_kernel_time")]
            op = ops.setdefault(
                node,
                {
                    "node": node,
                    "op_type": args.get("op_name"),
                    "calls": 0,
                    "total_us": 0.0,
                    "provider": args.get("provider"),
                    "us": [],
                },
            )
            op["calls"] += 1
            op["total_us"] += float(e.get("dur", 0))
            op["us"].append(float(e.get("dur", 0)))
        timed = model_runs[1:] or model_runs
        return finish_op_profile("onnxruntime", ops, [float(e["dur"]) for e in timed])

    # Runtime options a search may vary (edgekit's "runtime options as a search dimension"), checked
    # against onnxruntime 1.32's SessionOptions. execution_mode "parallel" runs independent nodes
    # concurrently on an inter-op pool of inter_op_threads (default: the request's threads; the
    # intra-op pool keeps the request's threads); inter_op_threads means nothing in sequential mode
    # (one node at a time) and is refused there.
    OPTIONS = {
        "graph_optimization_level": ("disable_all", "basic", "extended", "all"),
        "execution_mode": ("sequential", "parallel"),
        "inter_op_threads": None,
    }

    def _apply_options(self, ort: Any, so: Any, opts: Doc | None, threads: int = 1) -> Doc:
        """Set the requested options on ``so``; returns them as applied (what the report carries)."""
        opts = self.check_options(opts)
        levels = {
            "disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }
        applied: Doc = {}
        if "graph_optimization_level" in opts:
            so.graph_optimization_level = levels[opts["graph_optimization_level"]]
            applied["graph_optimization_level"] = opts["graph_optimization_level"]
        mode = opts.get("execution_mode")
        if mode == "parallel":
            so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
            so.inter_op_num_threads = int(opts.get("inter_op_threads") or threads)
            applied.update(execution_mode="parallel", inter_op_threads=so.inter_op_num_threads)
        elif "inter_op_threads" in opts:
            raise AgentFailure(
                "bad_request",
                "onnxruntime option inter_op_threads only matters with execution_mode "
                "'parallel' (sequential mode runs one node at a time)",
                EXIT_BAD_REQUEST,
            )
        elif mode == "sequential":
            applied["execution_mode"] = "sequential"  # the default, asked for explicitly
        return applied

    def batch_dynamic(self) -> bool:
        return all(not isinstance(s[0], int) for s in self.input_shapes if s)

    def static_batch(self) -> int | None:
        """The model's fixed batch size (None when the batch axis is dynamic)."""
        for s in self.input_shapes:
            if s and isinstance(s[0], int) and s[0] > 0:
                return int(s[0])
        return None

    def run(self, feeds: Sequence[Any]) -> list[Any]:
        return list(self.session.run(None, dict(zip(self.input_names, feeds))))
