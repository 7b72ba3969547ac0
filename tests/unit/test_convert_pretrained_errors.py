"""Pretrained models nobody here wrote, through ONNX -> TFLite without hand edits, on small synthetic
stand-ins built here: paddle2onnx's habits (dynamic axes written as dim_value -1, node names such as
'Softmax@0', shapes computed by Shape -> Cast -> Slice -> Concat -> Reshape), onnx2tf's errors as
the user reads them (no colour codes, the failing node named, no advice about onnx2tf's own flags),
routes that cannot apply, and multi-output models whose quantized file orders its outputs otherwise."""

from pathlib import Path

import numpy as np
import pytest

from edgekit.artifact import Artifact, IOSpec, LineageStep, TensorSpec
from edgekit.convert.chain import Route, first_passing, tflite_routes
from edgekit.errors import ConversionError
from edgekit.formats import Format

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as T  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402


def _dynamic(v, axis: int) -> None:
    d = v.type.tensor_type.shape.dim[axis]
    d.Clear()
    d.dim_value = -1  # how paddle2onnx marks a dynamic axis


def _paddle_like(path: Path) -> Path:
    """x [-1, 3, ?, ?] -> Conv -> a reshape whose target shape is computed from Shape (Cast, Slice,
    Concat: ONNX shape inference cannot follow it) -> Transpose -> LayerNorm -> MatMul -> Softmax,
    every node named the paddle2onnx way ('Softmax@0'): the PP-OCR recognizer's head in small."""
    rng = np.random.default_rng(0)
    c, k = 8, 5
    inits = [nh.from_array((rng.standard_normal((c, 3, 4, 1)) * 0.3).astype(np.float32), "conv.w"),
             nh.from_array(rng.standard_normal(c).astype(np.float32), "ln.w"),
             nh.from_array(rng.standard_normal(c).astype(np.float32), "ln.b"),
             nh.from_array(rng.standard_normal((c, k)).astype(np.float32), "fc.w"),
             nh.from_array(np.array([0], np.int64), "s0"), nh.from_array(np.array([2], np.int64), "s2"),
             nh.from_array(np.array([-1], np.int32), "m1"), nh.from_array(np.array(2.0, np.float32), "two"),
             nh.from_array(np.array(1e-5, np.float32), "eps")]
    nodes = [
        h.make_node("Conv", ["x", "conv.w"], ["c"], name="Conv@0"),
        h.make_node("Shape", ["c"], ["sh"], name="Shape@0"),
        h.make_node("Cast", ["sh"], ["sh32"], name="Cast@0", to=T.INT32),
        h.make_node("Slice", ["sh32", "s0", "s2"], ["sh2"], name="Slice@0"),
        h.make_node("Concat", ["sh2", "m1"], ["shape32"], name="Concat@0", axis=0),
        h.make_node("Cast", ["shape32"], ["shape64"], name="Cast@1", to=T.INT64),
        h.make_node("Reshape", ["c", "shape64"], ["flat"], name="Reshape@0"),
        h.make_node("Transpose", ["flat"], ["t"], name="Transpose@0", perm=[0, 2, 1]),
        h.make_node("ReduceMean", ["t"], ["mu"], name="ReduceMean@0", axes=[-1]),
        h.make_node("Sub", ["t", "mu"], ["d"], name="Sub@0"),
        h.make_node("Pow", ["d", "two"], ["d2"], name="Pow@0"),
        h.make_node("ReduceMean", ["d2"], ["var"], name="ReduceMean@1", axes=[-1]),
        h.make_node("Add", ["var", "eps"], ["ve"], name="Add@0"),
        h.make_node("Sqrt", ["ve"], ["sd"], name="Sqrt@0"),
        h.make_node("Div", ["d", "sd"], ["n"], name="Div@0"),
        h.make_node("Mul", ["n", "ln.w"], ["nw"], name="Mul@0"),
        h.make_node("Add", ["nw", "ln.b"], ["nb"], name="Add@1"),
        h.make_node("MatMul", ["nb", "fc.w"], ["logits"], name="MatMul@0"),
        h.make_node("Softmax", ["logits"], ["prob"], name="Softmax@0", axis=-1),
    ]
    x = h.make_tensor_value_info("x", T.FLOAT, [1, 3, "?", "?"])
    y = h.make_tensor_value_info("prob", T.FLOAT, [1, "?", k])
    _dynamic(x, 0)
    _dynamic(y, 0)
    model = h.make_model(h.make_graph(nodes, "paddle_like", [x], [y], inits),
                         opset_imports=[h.make_opsetid("", 13)], ir_version=8)
    onnx.save(model, str(path))
    return path


def _source(path: Path, tmp_path: Path):
    from edgekit.inputs.source import load_source

    return load_source(path, workdir=tmp_path)


def _data(shape, n: int = 8, seed: int = 1) -> list[np.ndarray]:
    return [np.random.default_rng(seed).standard_normal((n, *shape)).astype(np.float32)]


# --------------------------------------------------------------------------- messages (no converter run)
# what onnx2tf 1.28 prints when an op fails (utils/common_functions.py print_node_info), colours included
_O2T_LOG = (
    "\x1b[31mERROR:\x1b[0m The trace log is below.\n"
    "Traceback (most recent call last):\n"
    '  File "/x/onnx2tf/ops/Softmax.py", line 55, in custom_tf_nn_softmax\n'
    "    output = tf.nn.softmax(logits, axis, name)\n"
    "             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
    "ValueError: Exception encountered when calling layer \"tf.nn.softmax_2\" (type TFOpLambda).\n\n"
    "'Softmax@0' is not a valid scope name.\n\n"
    "\x1b[31mERROR:\x1b[0m input_onnx_file_path: /tmp/.edgekit-tflite-abc/model.onnx\n"
    "\x1b[31mERROR:\x1b[0m onnx_op_name: Softmax_0\n"
    "\x1b[31mERROR:\x1b[0m Read this and deal with it. https://github.com/PINTO0309/onnx2tf#parameter-replacement\n"
    "\x1b[31mERROR:\x1b[0m Alternatively, if the input OP has a dynamic dimension, use the -b or -ois option to "
    "rewrite it to a static shape and try again.\n"
    "\x1b[31mERROR:\x1b[0m If the input OP of ONNX before conversion is NHWC or an irregular channel arrangement "
    "other than NCHW, use the -kt or -kat option.\n"
    "\x1b[31mERROR:\x1b[0m Also, for models that include NonMaxSuppression in the post-processing, try the "
    "-onwdt option.\n")


def _small_graph():
    x = h.make_tensor_value_info("x", T.FLOAT, [1, 4])
    y = h.make_tensor_value_info("y", T.FLOAT, [1, 4])
    c = h.make_node("Constant", [], ["/Constant_output_0"], name="/Constant",
                    value=nh.from_array(np.ones((1, 4), np.float32)))
    add = h.make_node("Add", ["x", "/Constant_output_0"], ["z"], name="/Add")
    soft = h.make_node("Softmax", ["z"], ["y"], name="Softmax_0", axis=-1)
    return h.make_model(h.make_graph([c, add, soft], "g", [x], [y]), opset_imports=[h.make_opsetid("", 13)])


def test_onnx2tf_log_loses_colours_and_flag_advice_and_names_the_node():
    from edgekit.convert.onnx2tf_errors import onnx2tf_failure

    exc = ValueError("Exception encountered when calling layer \"tf.nn.softmax_2\" (type TFOpLambda).\n\n"
                     "'Softmax@0' is not a valid scope name. A scope name has to match the following pattern: "
                     "^[A-Za-z0-9_.\\\\/>-]*$\n\nCall arguments received by layer \"tf.nn.softmax_2\":\n"
                     "  \u2022 logits=tf.Tensor(shape=(1, 4), dtype=float32)\n  \u2022 name='Softmax@0'\n")
    msg = onnx2tf_failure(exc, _O2T_LOG, _small_graph(), {"Softmax_0": "Softmax@0"})
    assert "\x1b[" not in msg and "[31m" not in msg
    for flag in ("-b or -ois", "-kt", "-kat", "-onwdt", "Read this", "trace log"):
        assert flag not in msg, (flag, msg)
    # the node as the user's model spells it, its op type, its inputs with their shapes; the cause itself
    assert "node 'Softmax@0' (Softmax; inputs z (1, 4))" in msg, msg
    assert "is not a valid scope name" in msg and "Call arguments" not in msg and "\n" not in msg


def test_bare_key_error_becomes_a_sentence_naming_the_tensor():
    from edgekit.convert.onnx2tf_errors import onnx2tf_failure

    msg = onnx2tf_failure(KeyError("/Constant_output_0"), "\x1b[31mERROR:\x1b[0m onnx_op_name: /Add\n", _small_graph())
    assert msg != "'/Constant_output_0'" and "\x1b[" not in msg
    assert "tensor '/Constant_output_0' (made by Constant node '/Constant'; read by Add node '/Add')" in msg, msg
    assert "node '/Add' (Add; inputs x (1, 4), /Constant_output_0 (1, 4))" in msg, msg


def _art(p: Path, violations: list[str]) -> Artifact:
    p.write_bytes(b"tflite")
    io = IOSpec(inputs=(TensorSpec(name="x", shape=(1, 3), dtype="float32"),),
                outputs=(TensorSpec(name="y", shape=(1, 2), dtype="float32"),))
    step = LineageStep(kind="convert", name="onnx->tflite", metrics={"parity_violations": violations})
    return Artifact.from_file(p, Format.TFLITE, io, lineage=[step])


def test_identical_route_failures_are_said_once(tmp_path):
    def fails(counter: int):
        def run(p: Path):
            raise ConversionError(f"onnx2tf failed converting node 'Softmax@0' (Softmax): ValueError: layer "
                                  f"'tf.nn.softmax_{counter}' in /tmp/.edgekit-tflite-{counter}x/model.onnx",
                                  hop="onnx->tflite")
        return run

    routes = [Route("onnx2tf", fails(0)), Route("onnx2tf(keep_input_layout)", fails(1)),
              Route("onnx2tf(defaults)", fails(2)), Route("litert-torch", lambda p: _art(p, ["cosine 0.2 < 0.99999"]))]
    with pytest.raises(ConversionError) as ei:
        first_passing(routes, tmp_path / "m.tflite")
    msg = ei.value.message
    assert msg.count("Softmax@0") == 1, msg
    assert "onnx2tf(keep_input_layout): same error as onnx2tf" in msg
    assert "onnx2tf(defaults): same error as onnx2tf" in msg and "litert-torch: parity: cosine" in msg


def _rank2_model(path: Path) -> Path:
    x = h.make_tensor_value_info("x", T.FLOAT, [1, 6])
    y = h.make_tensor_value_info("y", T.FLOAT, [1, 3])
    w = nh.from_array(np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32), "w")
    node = h.make_node("MatMul", ["x", "w"], ["y"], name="fc")
    onnx.save(h.make_model(h.make_graph([node], "fc", [x], [y], [w]), opset_imports=[h.make_opsetid("", 13)]),
              str(path))
    return path


def test_keep_input_layout_is_skipped_with_its_reason_on_a_rank2_model(tmp_path):
    from edgekit.convert.onnx_to_tflite import TfliteConfig

    art = _source(_rank2_model(tmp_path / "fc.onnx"), tmp_path).artifact
    routes = {r.name: r for r in tflite_routes(art, TfliteConfig(), calib=None, parity_inputs=_data((6,)))}
    keep = routes["onnx2tf(keep_input_layout)"]
    assert keep.skip and "rank 2" in keep.skip and routes["onnx2tf"].skip is None

    ran = []

    def failing(p: Path):
        raise ConversionError("onnx2tf stopped: something", hop="onnx->tflite")

    def never(p: Path):
        ran.append(p)
        raise AssertionError("a skipped route ran")

    got = first_passing([Route("onnx2tf", failing), Route(keep.name, never, skip=keep.skip),
                         Route("onnx2tf(defaults)", lambda p: _art(p, []))], tmp_path / "m.tflite")
    tried = got.lineage[-1].metrics["routes_tried"]
    assert not ran and tried[1]["route"] == "onnx2tf(keep_input_layout)" and tried[1].get("skipped") is True
    assert "rank 2" in tried[1]["error"] and got.lineage[-1].metrics["route"] == "onnx2tf(defaults)"


def test_quantized_outputs_are_matched_by_name_or_shape_not_position():
    from edgekit.convert.tflite.layout import _align

    # the fp32 file (onnx2tf) and the dynamic-range file (TFLiteConverter) of one two-head model:
    # the second lists its outputs in the other order, under other names, without a signature
    f32 = [{"name": "Identity", "index": 11, "shape": [1, 2]}, {"name": "Identity_1", "index": 12, "shape": [1, 4]}]
    dyn = [{"name": "PartitionedCall:1", "index": 12, "shape": [1, 4]},
           {"name": "PartitionedCall:0", "index": 11, "shape": [1, 2]}]
    specs32 = [TensorSpec(name="Identity", shape=(1, 2), dtype="float32"),
               TensorSpec(name="Identity_1", shape=(1, 4), dtype="float32")]
    onnx_specs = [TensorSpec(name="prob", shape=(1, 2), dtype="float32"),
                  TensorSpec(name="box", shape=(1, 4), dtype="float32")]
    assert [d["name"] for d in _align(dyn, f32, specs32, onnx_specs, {}, "output")] == \
        ["PartitionedCall:0", "PartitionedCall:1"]
    # the signature (output_K is the K-th ONNX output) decides where shapes cannot
    same = [{"name": "a", "index": 5, "shape": [1, 4]}, {"name": "b", "index": 6, "shape": [1, 4]}]
    f32s = [{"name": "Identity", "index": 1, "shape": [1, 4]}, {"name": "Identity_1", "index": 2, "shape": [1, 4]}]
    s32 = [TensorSpec(name="Identity", shape=(1, 4), dtype="float32"),
           TensorSpec(name="Identity_1", shape=(1, 4), dtype="float32")]
    by_sig = _align(same, f32s, s32, onnx_specs, {"output_0": 6, "output_1": 5}, "output")
    assert [d["name"] for d in by_sig] == ["b", "a"]
    assert _align(same, f32s, s32, onnx_specs, {}, "output") == [None, None]  # left to the values, never position


def test_litert_torch_outputs_are_matched_by_signature_shape_or_values_not_position():
    """The litert-torch route's file, its output tensors put in the PyTorch program's order
    (torch_to_tflite.ordered_outputs): the signature's output_K first, then a unique shape, then the
    values on the probe; position never decides."""
    from edgekit.convert.torch_to_tflite import ordered_outputs

    dout = [{"name": "t0", "index": 10, "shape": [3, 4]}, {"name": "t1", "index": 11, "shape": [3, 2]},
            {"name": "t2", "index": 12, "shape": [3, 4]}]
    rng = np.random.default_rng(0)
    refs = [rng.normal(size=s).astype(np.float32) for s in ((3, 4), (3, 2), (3, 4))]
    never = lambda ds: pytest.fail("the values were not needed")  # noqa: E731
    sig = {"output_0": 12, "output_1": 10, "output_2": 11}  # the program's order, by the file's own keys
    refs_sig = [refs[0], refs[2], refs[1]]
    assert [d["name"] for d in ordered_outputs(dout, sig, refs_sig, never)] == ["t2", "t0", "t1"]
    two = [dout[1], {"name": "big", "index": 13, "shape": [3, 4]}]  # unique shapes, no signature
    assert [d["name"] for d in ordered_outputs(two, {}, [refs[0], refs[1]], never)] == ["big", "t1"]
    # no signature and two (3, 4) outputs: the file's values say which is which
    ran = {"t0": refs[2] + 1e-6, "t1": refs[1], "t2": refs[0] - 1e-6}
    got = ordered_outputs(dout, {}, refs, lambda ds: [ran[d["name"]] for d in ds])
    assert [d["name"] for d in got] == ["t2", "t1", "t0"]
    with pytest.raises(ConversionError, match="has 3 outputs, the PyTorch program 2"):
        ordered_outputs(dout, {}, refs[:2], never)
    with pytest.raises(ConversionError, match=r"shape \(5, 5\)"):
        ordered_outputs(dout[:1], {}, [np.zeros((5, 5), np.float32)], lambda ds: [ran["t0"]])


def test_parity_names_the_output_that_is_out_of_order():
    from edgekit.convert.parity import compare_outputs

    refs = [np.zeros((4, 2)), np.zeros((4, 4))]
    with pytest.raises(ConversionError) as ei:
        compare_outputs(refs, [np.zeros((4, 4)), np.zeros((4, 2))], "onnx", ["prob", "box"])
    assert "output 'prob'" in ei.value.message and "out of order" in ei.value.message


# --------------------------------------------------------------------------- real onnx2tf conversions
needs_onnx2tf = pytest.mark.skipif(__import__("importlib").util.find_spec("onnx2tf") is None,
                                   reason="the tflite extra is not installed")


@needs_onnx2tf
def test_paddle_like_model_with_minus_one_axis_converts_from_the_data_shapes(tmp_path):
    from edgekit.convert.chain import convert_to_tflite
    from edgekit.convert.onnx_to_tflite import TfliteConfig, run_tflite

    src = _source(_paddle_like(tmp_path / "p.onnx"), tmp_path)
    assert src.artifact.io.inputs[0].shape == (None, 3, None, None)  # dim_value -1 is a dynamic axis
    xs = _data((3, 4, 16))
    art = convert_to_tflite(src.artifact, tmp_path / "p.tflite", TfliteConfig(), parity_inputs=xs, route="onnx2tf")
    m = art.lineage[-1].metrics
    assert m["route"] == "onnx2tf" and m["parity_violations"] == [] and m["parity"]["max_abs_err"] < 1e-4, m
    assert art.lineage[-1].config["input_shapes"] == {"x": [1, 3, 4, 16]}
    assert art.lineage[-1].config["input_shapes_from"] == "data"
    # the Shape -> Cast -> Slice -> Concat -> Reshape chain was folded, so onnx2tf saw every shape
    assert m["simplified"]["applied"] is True and m["simplified"]["shapeless_after"] == 0, m["simplified"]
    np.testing.assert_allclose(run_tflite(art.path, art.io, xs), src.reference(xs), atol=1e-4)


@needs_onnx2tf
def test_an_onnx2tf_failure_names_the_node_without_colour_codes(tmp_path):
    from edgekit.convert.chain import convert_to_tflite
    from edgekit.convert.onnx_to_tflite import TfliteConfig

    # without the folding, onnx2tf guesses the layout of the shapeless tensors and fails at the LayerNorm's Mul
    src = _source(_paddle_like(tmp_path / "p.onnx"), tmp_path)
    with pytest.raises(ConversionError) as ei:
        convert_to_tflite(src.artifact, tmp_path / "p.tflite", TfliteConfig(simplify=False),
                          parity_inputs=_data((3, 4, 16)), route="onnx2tf")
    msg = str(ei.value)
    assert "\x1b[" not in msg and "[31m" not in msg
    for flag in ("-b or -ois", "-kt or -kat", "-onwdt"):
        assert flag not in msg, msg
    first = msg.splitlines()[1]
    assert "onnx2tf failed converting node 'Mul@0' (Mul; inputs n (shape unknown), ln.w (8,))" in first, msg
    assert "Dimensions must be equal" in first
    assert "onnx2tf(keep_input_layout): same error as onnx2tf" in msg, msg
    # edgekit's own options instead of onnx2tf's flags, and the sizes the model was fixed to
    assert "--input-shape" in ei.value.hint and "input sizes from the data's shapes: x (1, 3, 4, 16)" in ei.value.hint
    assert not (tmp_path / "p.tflite").exists()


class _TwoHeads:
    """An MTCNN-like net: one body, a (N, 2) face-probability head and a (N, 4) box head."""

    @staticmethod
    def export(path: Path, sizes: tuple[int, int] = (2, 4)) -> Path:
        torch = pytest.importorskip("torch")

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
                self.prob = torch.nn.Linear(8, sizes[0])
                self.box = torch.nn.Linear(8, sizes[1])

            def forward(self, x):
                z = self.body(x)
                return torch.softmax(self.prob(z), 1), self.box(z)

        torch.manual_seed(0)
        torch.onnx.export(Net().eval(), (torch.randn(1, 3, 12, 12),), str(path), input_names=["x"],
                          output_names=["prob", "box"], opset_version=17, dynamo=False)
        return path


@needs_onnx2tf
def test_multi_output_dynamic_int8_keeps_each_output_with_its_name(tmp_path):
    from edgekit.convert.chain import convert_to_tflite
    from edgekit.convert.onnx_to_tflite import TfliteConfig, run_tflite_all
    from edgekit.convert.tflite.host_harness import _tflite_details

    src = _source(_TwoHeads.export(tmp_path / "two.onnx"), tmp_path)
    xs = _data((3, 12, 12), n=16)
    art = convert_to_tflite(src.artifact, tmp_path / "two.tflite",
                            TfliteConfig(precision="int8", quantization="dynamic"), parity_inputs=xs, route="onnx2tf")
    m = art.lineage[-1].metrics
    assert m["route"] == "onnx2tf" and m["routes_tried"] == [] and m["parity_violations"] == [], m
    assert list(m["parity_outputs"]) == ["prob", "box"]
    # the artifact's outputs are in the source's order, each naming the TFLite tensor with its shape
    _, dout = _tflite_details(art.path)
    shapes = {d["name"]: tuple(int(v) for v in d["shape"]) for d in dout}
    assert [shapes[s.name] for s in art.io.outputs] == [(1, 2), (1, 4)]
    got = run_tflite_all(art.path, art.io, xs)
    for ref, y in zip(src.reference_all(xs), got):
        np.testing.assert_allclose(y, ref, atol=0.05)


@needs_onnx2tf
def test_same_shape_outputs_without_names_are_told_apart_by_their_values(tmp_path, monkeypatch):
    from edgekit.convert import onnx_to_tflite as o2t
    from edgekit.convert.chain import convert_to_tflite
    from edgekit.convert.tflite import layout

    # a quantized file whose signature is unreadable and whose two (1, 4) outputs have no ONNX names:
    # nothing but their values tells them apart (position alone would be a guess)
    monkeypatch.setattr(layout, "_signature_indices", lambda path: ({}, {}))
    src = _source(_TwoHeads.export(tmp_path / "two.onnx", sizes=(4, 4)), tmp_path)
    xs = _data((3, 12, 12), n=16)
    art = convert_to_tflite(src.artifact, tmp_path / "two.tflite",
                            o2t.TfliteConfig(precision="int8", quantization="dynamic"), parity_inputs=xs,
                            route="onnx2tf")
    m = art.lineage[-1].metrics
    assert m["route"] == "onnx2tf" and m["routes_tried"] == [] and m["parity_violations"] == [], m
    for ref, y in zip(src.reference_all(xs), o2t.run_tflite_all(art.path, art.io, xs)):
        np.testing.assert_allclose(y, ref, atol=0.05)
