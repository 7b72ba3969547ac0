"""TFLite Micro on the host (issue #44's Done-when tests): an op without a TFLM kernel refused with its layer named,
the arena found is the smallest that allocates, a model 10% over SRAM is exit 1 naming its peak tensors, the C
array round-trips, and TFLM's outputs agree with LiteRT's within the stated tolerance. Real components throughout:
the tflite-micro wheel's interpreter, LiteRT, onnx2tf and TensorFlow's INT8 converter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tflite_micro", reason="the micro extra (pip install 'edgekit[micro]') is not installed")

from edgekit.errors import BadInputError, GateFailed  # noqa: E402
from edgekit.inputs.targets import Microcontroller  # noqa: E402
from edgekit.micro.c_array import c_name, from_c_array, to_c_array  # noqa: E402
from edgekit.micro.fit import judge_fit, require_fit  # noqa: E402
from edgekit.micro.interpreter import smallest_arena  # noqa: E402
from edgekit.micro.kernels import tflm_kernels  # noqa: E402
from edgekit.micro.tflite_graph import read_graph  # noqa: E402
from edgekit.micro.workload import PARITY_STEPS, measure_micro  # noqa: E402


def _sine() -> Path:
    import tflite_micro

    return Path(tflite_micro.__file__).parent / "python" / "tflite_micro" / "sine_float.tflite"


def _allocates(model: Path, size: int) -> bool:
    """Independent of the bisection: one interpreter build at ``size`` in its own process."""
    code = ("import sys; from tflite_micro.python.tflite_micro import runtime; "
            "runtime.Interpreter.from_bytes(open(sys.argv[1], 'rb').read(), arena_size=int(sys.argv[2]))")
    return subprocess.run([sys.executable, "-c", code, str(model), str(size)], capture_output=True,
                          check=False).returncode == 0


def _export(module, shape, path: Path) -> Path:
    import torch

    ep = torch.export.export(module.eval(), (torch.zeros(shape),))
    torch.onnx.export(ep, (torch.zeros(shape),), str(path), dynamo=True, verbose=False)
    return path


def test_the_kernel_list_comes_from_the_wheel():
    k = tflm_kernels()
    assert {"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "SOFTMAX", "QUANTIZE"} <= k
    assert "GELU" not in k and "TILE" not in k  # TFLM has no kernel for these: the refusals below rely on it


def test_an_op_without_a_tflm_kernel_is_refused_naming_its_layer(tmp_path):
    import torch

    from edgekit.micro.onnx_ops import refuse_unsupported

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 4, 3)
            self.act = torch.nn.GELU()
            self.fc = torch.nn.Linear(4 * 6 * 6, 3)

        def forward(self, x):
            return self.fc(torch.flatten(self.act(self.conv(x)), 1))

    onnx_path = _export(Net(), (1, 1, 8, 8), tmp_path / "m.onnx")
    with pytest.raises(BadInputError) as e:
        refuse_unsupported(onnx_path)
    msg = str(e.value)
    assert "layer act (GELU)" in msg and "GELU, which TFLM has no kernel for" in msg and "1 op(s)" in msg
    # the same net with ReLU passes the check
    net = Net()
    net.act = torch.nn.ReLU()
    refuse_unsupported(_export(net, (1, 1, 8, 8), tmp_path / "ok.onnx"))


def test_the_arena_found_is_the_smallest_that_allocates():
    model = _sine()
    arena = smallest_arena(model)
    assert _allocates(model, arena.bytes)
    assert not _allocates(model, arena.bytes - 1) and not _allocates(model, arena.bytes - 16)
    assert arena.largest_failing == arena.bytes - 1
    assert arena.head is not None and arena.tail is not None and arena.recorded_total == arena.head + arena.tail


def test_the_c_array_round_trips_to_the_same_bytes(tmp_path):
    data = _sine().read_bytes()
    src, header = to_c_array(data, c_name("sine_float"))
    assert "alignas(16) const unsigned char sine_float[]" in src and f"sine_float_len = {len(data)};" in src
    assert "extern const unsigned char sine_float[];" in header
    assert from_c_array(src) == data
    assert c_name("3-model.v1") == "_3_model_v1"
    with pytest.raises(ValueError, match="_len says"):
        from_c_array(src.replace(f"= {len(data)};", f"= {len(data) + 1};"))


@pytest.fixture(scope="module")
def int8_model(tmp_path_factory):
    """A small CNN converted by edgekit's own chain to full-integer INT8 with int8 inputs and outputs."""
    import torch

    from edgekit.convert.chain import convert_to_tflite
    from edgekit.convert.tflite.config import TfliteConfig
    from edgekit.convert.torch_to_onnx import export_onnx
    from edgekit.inputs.data import load_npz
    from edgekit.inputs.source import load_source

    d = tmp_path_factory.mktemp("micro")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(8, 16, 3, padding=1, stride=2), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(16 * 4 * 4, 10)).eval()
    xs = np.random.default_rng(0).random((64, 1, 8, 8), dtype=np.float32)
    torch.export.save(torch.export.export(net, (torch.tensor(xs[:1]),)), d / "m.pt2")
    np.savez(d / "calib.npz", x=xs)
    src = load_source(str(d / "m.pt2"), example_inputs=(xs[:1],), workdir=d)
    onnx_art = export_onnx(src, d / "fp32.onnx", [xs])
    calib = load_npz(d / "calib.npz", x_key="x", y_key=None, require_labels=False, role="calib")
    cfg = TfliteConfig(precision="int8", quantization="full", io="int8", parity_bar="breakage")
    art = convert_to_tflite(onnx_art, d / "int8.tflite", cfg, source=src, calib=calib, parity_inputs=[xs])
    return art, xs


def test_tflm_agrees_with_litert_within_the_stated_tolerance(int8_model):
    art, xs = int8_model
    part = Microcontroller(core="cortex-m4f", clock_mhz=64, sram_kb=256, flash_kb=1024)
    m = measure_micro(art.path, art.io, part, [xs])
    assert art.io.inputs[0].dtype == "int8" and art.io.outputs[0].scale and art.io.inputs[0].zero_point is not None
    row = m.disagreement[art.io.outputs[0].name]
    assert m.within_tolerance and row["max_steps"] <= PARITY_STEPS, row
    assert row["top1_agreement"] >= 0.95 and m.tflm[0].shape == m.litert[0].shape == (64, 10)
    assert m.fit.fits and m.arena.bytes < 64 * 1024
    assert set(m.graph.op_set) <= tflm_kernels() and "CONV_2D" in m.graph.op_set
    # MACs by hand: conv 1->8 3x3 on 8x8 (4608), conv 8->16 3x3 /2 (4x4x16 x 72 = 18432), FC 256->10 (2560)
    assert m.graph.macs_by_op == {"CONV_2D": 4608 + 18432, "FULLY_CONNECTED": 2560}


def test_a_model_ten_percent_over_sram_is_exit_1_naming_the_peak_tensors(int8_model):
    art, _ = int8_model
    arena = smallest_arena(art.path)
    graph = read_graph(art.path.read_bytes())
    # a part whose SRAM budget (after a 10% margin) is the arena / 1.1: the arena is 10% over
    part = Microcontroller(core="cortex-m0plus", clock_mhz=48, sram_kb=arena.bytes / 1.1 / 0.9 / 1024, flash_kb=1024)
    fit = judge_fit(part, arena, art.path.stat().st_size, graph.peak)
    assert not fit.fits and fit.flash_ok
    with pytest.raises(GateFailed) as e:
        require_fit(fit, "tiny-part")
    assert e.value.exit_code == 1
    msg = str(e.value)
    assert "does NOT fit" in msg and "(10.0%) over" in msg
    assert graph.peak is not None and graph.peak.tensors[0].name in msg and f"op {graph.peak.op_index}" in msg
    assert e.value.hint is not None and "must shrink by at least" in e.value.hint  # what would have to shrink
    assert fit.as_dict()["what_must_shrink"] and fit.as_dict()["peak"]["tensors"][0]["shape"]
    roomy = judge_fit(part.model_copy(update={"sram_kb": arena.bytes / 0.9 / 1024 + 1}), arena, 100, graph.peak)
    require_fit(roomy, "roomy-part")  # one byte of room more than the arena: fits


def test_the_latency_estimate_states_its_fit_and_its_error():
    from edgekit.micro.latency_estimate import PUBLISHED, fit_core

    board, mhz, ips = PUBLISHED["cortex-m4"]
    exact = {m: int(mhz * 1e6 / ips[m] / 3.0) for m in ips}  # MACs that make every model exactly 3 cycles/MAC
    fit = fit_core("cortex-m4f", exact)
    assert fit is not None and fit.board == board and abs(fit.cycles_per_mac - 3.0) < 1e-3
    assert fit.max_abs_error < 1e-3 and abs(fit.estimate_ms(exact["kws"], mhz) - 1000 / ips["kws"]) < 0.01
    skewed = {**exact, "ic": exact["ic"] // 2}  # one model off by 2x: its leave-one-out error shows it
    assert abs(fit_core("cortex-m4", skewed).loo_errors["ic"] + 0.5) < 0.01
    assert fit_core("cortex-m55", exact) is None  # no published figure for that core class: no estimate


def test_an_op_with_no_lowering_or_a_custom_domain_is_named(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from edgekit.micro.onnx_ops import unsupported_ops

    nodes = [helper.make_node("Erf", ["x"], ["e"], name="blocks.0/erf"),
             helper.make_node("Relu", ["e"], ["r"], name="ok_relu"),
             helper.make_node("MyOp", ["r"], ["y"], name="custom", domain="com.example")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                      helper.make_opsetid("com.example", 1)]), tmp_path / "m.onnx")
    bad = unsupported_ops(tmp_path / "m.onnx")
    assert [(b.node, b.op) for b in bad] == [("blocks.0/erf", "Erf"), ("custom", "com.example.MyOp")]
    assert "Flex op" in bad[0].why and "custom-domain" in bad[1].why
