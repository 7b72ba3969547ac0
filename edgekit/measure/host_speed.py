"""Host-side speed of ONNX files under onnxruntime (1 thread, the CPU execution provider): the median thread
CPU time per inference, measured in alternating rounds so every file sees the same host state, and CPU time
rather than wall time, so other jobs holding the core do not count. What the accuracy-aware pass orders its INT8
encodings by (``passes/accuracy_aware/quantize._speed_probe``); a host estimate, never a device measurement."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

ROUNDS = 7  # alternating rounds; the median of them is the figure
ROUND_SECONDS = 0.02  # CPU time one file gets per round (at most 50 inferences)


def ort_sessions(paths: dict[str, Path], xs: list[np.ndarray], stream: Any = None) -> dict[str, tuple[Any, dict]]:
    """{name: (onnxruntime session, its feed)}: one sample of ``xs`` per file (``stream``: the constants and the
    state at zeros as well). A file onnxruntime cannot load, or one with a static batch above 1, is left out."""
    import onnxruntime as ort  # heavy: onnxruntime

    sessions = {}
    for name, p in paths.items():
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.log_severity_level = 3
        try:
            sess = ort.InferenceSession(str(p), sess_options=so, providers=["CPUExecutionProvider"])
        except Exception:  # onnxruntime cannot load this build: the caller's own run of it records why
            continue
        ins = sess.get_inputs()
        first = [np.asarray(x[:1]) for x in xs]
        if stream is not None:  # every input: the constants, the state at zeros (by name: the model's order)
            by_name = dict(zip(stream.inputs, stream.feed(first, stream.zeros())))
            first = [by_name[i.name] for i in ins]
        feed = {i.name: np.ascontiguousarray(x.astype(_np_type(i.type), copy=False)) for i, x in zip(ins, first)}
        if any(isinstance(d, int) and d > 1 for i in ins for d in i.shape[:1]):
            continue  # a static batch above 1: not probed
        sessions[name] = (sess, feed)
    return sessions


def cpu_ms_per_inference(sessions: dict[str, tuple[Any, dict]]) -> dict[str, float]:
    """{name: median thread CPU milliseconds per inference} over ``ROUNDS`` alternating rounds, after one
    warm-up inference each (which also sizes a round)."""
    t = time.thread_time()
    for sess, feed in sessions.values():
        sess.run(None, feed)
    per_round = max(1, min(50, int(ROUND_SECONDS / max((time.thread_time() - t) / len(sessions), 1e-6))))
    times: dict[str, list[float]] = {n: [] for n in sessions}
    for _ in range(ROUNDS):
        for n, (sess, feed) in sessions.items():
            t = time.thread_time()
            for _ in range(per_round):
                sess.run(None, feed)
            times[n].append((time.thread_time() - t) / per_round * 1000)
    return {n: float(np.median(v)) for n, v in times.items()}


def _np_type(ort_type: str) -> type:
    return {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32,
            "tensor(bool)": np.bool_, "tensor(float16)": np.float16}.get(ort_type, np.float32)
