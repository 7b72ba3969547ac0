"""Op coverage and shape checks before converting: fast, no TensorFlow import."""

import onnx
import pytest
from onnx import TensorProto, helper

from edgekit.convert.opcheck import check_ops, dynamic_dims, model_ops, require_ops, require_static_shapes
from edgekit.errors import ConversionError


def _model(nodes, inp_shape=(1, 4)):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(inp_shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph(nodes, "g", [x], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.acme", 1)])


def test_lists_ops_with_node_names():
    m = _model([helper.make_node("Relu", ["x"], ["a"], name="act1"), helper.make_node("Abs", ["a"], ["y"], name="abs1")])
    assert model_ops(m) == {"Relu": ["act1"], "Abs": ["abs1"]}
    assert check_ops(m).ok


def test_custom_domain_op_is_named_with_node():
    m = _model([helper.make_node("Relu", ["x"], ["a"], name="act1"),
                helper.make_node("FancyGate", ["a"], ["y"], name="blocks.3.gate", domain="com.acme")])
    rep = check_ops(m)
    assert not rep.ok and rep.unsupported == {"com.acme::FancyGate": ["blocks.3.gate"]}
    with pytest.raises(ConversionError) as ei:
        require_ops(m, "onnx->tflite")
    msg = str(ei.value)
    assert "[onnx->tflite]" in msg and "com.acme::FancyGate" in msg and "blocks.3.gate" in msg
    assert ei.value.exit_code == 2


def test_standard_op_onnx2tf_lacks_is_refused():
    # ONNX has ops onnx2tf has no module for (e.g. the ML/training ones); pick one it lacks right now
    from edgekit.convert.opcheck import onnx2tf_supported_ops

    supported = onnx2tf_supported_ops()
    assert {"Conv", "Gemm", "Softmax", "LayerNormalization", "GRU", "Resize", "Concat"} <= supported
    missing = next(op for op in ("CenterCropPad", "Col2Im", "STFT", "ImageDecoder", "RegexFullMatch")
                   if op not in supported)
    m = _model([helper.make_node(missing, ["x"], ["y"], name="the_node")])
    with pytest.raises(ConversionError, match=f"{missing} at 'the_node'"):
        require_ops(m, "onnx->tflite")


def test_dynamic_sizes_ask_for_input_shape():
    m = _model([helper.make_node("Relu", ["x"], ["y"], name="r")], inp_shape=("N", 3, "H", "W"))
    assert dynamic_dims(m) == {"x": [2, 3]}  # the batch axis alone is fine (fixed to 1)
    with pytest.raises(ConversionError, match="--input-shape"):
        require_static_shapes(m, "onnx->tflite")
    require_static_shapes(m, "onnx->tflite", {"x": (1, 3, 8, 8)})  # given: no error


def test_data_sizes_pair_with_the_inputs_the_data_feeds_by_name():
    """A streaming model's state input comes first (Silero VAD: ``state`` before ``input``); the data holds
    only ``input``'s samples. They size ``input``, never ``state`` by position."""
    import numpy as np

    from edgekit.convert.opcheck import sizes_from_samples

    state = helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "B", 128])
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", "T"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph([helper.make_node("Relu", ["input"], ["y"])], "g", [state, x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    samples = [np.zeros((5, 512), np.float32)]
    assert sizes_from_samples(m, samples, fed={"state"}) == {"input": (1, 512)}
    # without naming what the stream feeds, one array for two inputs sizes nothing (no positional guess)
    assert sizes_from_samples(m, samples) == {}
    both = [np.zeros((2, 1, 128), np.float32), np.zeros((5, 512), np.float32)]
    assert sizes_from_samples(m, both) == {"state": (2, 1, 128), "input": (1, 512)}
