"""Helpers for tests of the on-device agent: the agent as the host loads it (the package, imported from
the very zipapp the device runs), that zipapp's path, and a tiny real ONNX model for it to run."""

from __future__ import annotations

from pathlib import Path

from edgekit.agent.package import agent_pyz

AGENT_PATH: Path = agent_pyz()  # the built agent: `python3 AGENT_PATH REQUEST.json` is what a device runs


def load_agent():
    """The agent package (``edgekit_agent``), loaded in process from ``AGENT_PATH``."""
    from edgekit.agent.inprocess import load_agent as load

    return load()


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


def tiny_tflite(path: Path, size: int = 16) -> Path:
    """A real conv net as .tflite (two 3x3 convs, ReLU, global mean: [1, size, size, 3] -> [1, 16]),
    built with TensorFlow's converter: XNNPACK takes every node of it."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    w1 = tf.constant(rng.standard_normal((3, 3, 3, 8)).astype(np.float32))
    w2 = tf.constant(rng.standard_normal((3, 3, 8, 16)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([1, size, size, 3], tf.float32)])
    def f(x):
        y = tf.nn.relu(tf.nn.conv2d(x, w1, 1, "SAME"))
        y = tf.nn.relu(tf.nn.conv2d(y, w2, 2, "SAME"))
        return tf.reduce_mean(y, axis=[1, 2])

    conv = tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f)
    path.write_bytes(conv.convert())
    return path
