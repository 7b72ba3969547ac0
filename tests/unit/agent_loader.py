"""Helpers for tests of the on-device agent: load the single-file agent as a module, and write a
tiny real ONNX model for it to run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

AGENT_PATH = Path(__file__).resolve().parents[2] / "device_agents" / "edgekit_agent.py"


def load_agent():
    """device_agents/edgekit_agent.py as a module (it is stdlib-only and never imports edgekit)."""
    name = "edgekit_agent_under_test"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, AGENT_PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def tiny_onnx(path: Path, n: int = 64) -> Path:
    """y = x @ W with x [1, n]: a real model onnxruntime runs in microseconds."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((n, n)).astype(np.float32), "W")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "tiny",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def tiny_request(model: Path, **extra) -> dict:
    req = {"protocol": 2, "variant": "tiny", "model": str(model), "runtime": "onnxruntime", "threads": 1,
           "warmup": 3, "runs": 20, "min_seconds": 0.05, "inputs": [{"name": "x", "shape": [1, 64],
                                                                    "dtype": "float32"}]}
    req.update(extra)
    return req
