"""Per-op profiles on the device (edgekit/devices/profile.py + the agent's runners' ``profile``):
the real agent on the local target runs onnxruntime's profiler over a torch-exported model and its
ORT static-INT8 (QDQ) twin, every node traced to the PyTorch module it came from; a variant made
slower on purpose (real extra kernels) is picked for profiling by its latency and the diff names the
op types that made it slower, in the warning and the min-speedup check; LiteRT's Python API has no
op profiler and the answer says so, with no figures; the report's three views show the profiles."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgekit.artifact import Artifact
from edgekit.devices.profile import op_profile, profile_variants, profiled_names
from edgekit.devices.session import DeviceSession, RunSettings
from edgekit.formats import Format
from edgekit.inputs.targets import MeasureDefaults, load_target
from edgekit.report.model import OpProfile
from edgekit.report.profile_diff import profile_diff, profile_diffs
from tests.unit.agent_loader import load_agent

SETTINGS = RunSettings(measure=MeasureDefaults(warmup=3, runs=30, min_seconds=0.0, max_runs=30), with_eval=False)
CONVS = {"stem", "blocks.0.conv", "blocks.1.conv"}


def _net():
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(8, 8, 3, padding=1)
            self.act = torch.nn.ReLU()

        def forward(self, x):
            return self.act(self.conv(x)) + x

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Conv2d(1, 8, 3, padding=1)
            self.blocks = torch.nn.Sequential(Block(), Block())
            self.head = torch.nn.Linear(8 * 8 * 8, 10)

        def forward(self, x):
            return self.head(torch.flatten(self.blocks(torch.relu(self.stem(x))), 1))

    torch.manual_seed(0)
    return Net().eval()


def _slower(src: Artifact, dst) -> Artifact:
    """The same model plus real work: the input tiled to 2x32x64x64 through 6 Tanh kernels, added to
    the output times zero (the outputs do not change; the device does the work)."""
    import onnx
    from onnx import helper, numpy_helper

    m = onnx.load(str(src.path))
    g = m.graph
    out = g.output[0].name
    for n in g.node:
        n.output[:] = ["orig_" + o if o == out else o for o in n.output]
    g.initializer.extend([numpy_helper.from_array(np.array([1, 32, 8, 8], np.int64), "slow_reps"),
                          numpy_helper.from_array(np.array(0.0, np.float32), "slow_zero")])
    nodes = [helper.make_node("Tile", [g.input[0].name, "slow_reps"], ["slow_0"], name="slow_tile")]
    nodes += [helper.make_node("Tanh", [f"slow_{i}"], [f"slow_{i + 1}"], name=f"slow_tanh_{i}") for i in range(6)]
    nodes += [helper.make_node("ReduceMean", ["slow_6"], ["slow_mean"], keepdims=0, name="slow_mean"),
              helper.make_node("Mul", ["slow_mean", "slow_zero"], ["slow_nothing"], name="slow_mul"),
              helper.make_node("Add", ["orig_" + out, "slow_nothing"], [out], name="slow_add")]
    g.node.extend(nodes)
    onnx.save(m, str(dst))
    return Artifact.from_file(dst, Format.ONNX, src.io)


def _int8(src: Artifact, dst, x: np.ndarray) -> Artifact:
    """onnxruntime's static INT8 (QDQ, per channel), as edgekit's quantize pass makes it."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    class Reader:
        def __init__(self):
            self.it = iter([{src.io.inputs[0].name: x} for _ in range(4)])

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(src.path), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    return Artifact.from_file(dst, Format.ONNX, src.io, precision="int8")


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """fp32 (torch.export -> ONNX through edgekit), its INT8 twin and a slower twin, measured and
    profiled by the real agent on the local target in one device session."""
    import torch

    from edgekit.convert.torch_to_onnx import export_onnx
    from edgekit.inputs.source import from_module

    d = tmp_path_factory.mktemp("op-profile")
    x = np.random.default_rng(0).random((2, 1, 8, 8), dtype=np.float32)
    src = from_module(_net(), (torch.from_numpy(x),), d)
    fp32 = export_onnx(src, d / "fp32.onnx", [x])
    arts = {"fp32": fp32, "int8": _int8(fp32, d / "int8.onnx", x), "slow": _slower(fp32, d / "slow.onnx")}
    with DeviceSession(load_target("local"), None, source_io=fp32.io, plan=None) as s:
        measured = {n: s.measure(n, a, SETTINGS) for n, a in arts.items()}
        chosen = profiled_names(measured, "fp32")
        profile_variants(s, measured, profiled_names(measured, "fp32", every=True), SETTINGS)
        raw = s.profile_doc("fp32", fp32, SETTINGS, runs=5)
    base = measured["fp32"].result
    for m in measured.values():
        m.result.speedup_vs_baseline = round(base.latency_ms.p50 / m.result.latency_ms.p50, 3)
    return {"measured": measured, "chosen": chosen, "raw": raw, "dir": d}


def test_the_onnxruntime_profile_maps_a_torch_export_to_its_modules(profiled):
    raw = profiled["raw"]
    assert raw["source"] == "onnxruntime" and raw["reason"] is None and raw["runs"] == 5
    assert all(o["calls"] == 5 and o["total_us"] >= 0 and o["provider"] == "CPUExecutionProvider" for o in raw["ops"])
    p = profiled["measured"]["fp32"].result.op_profile
    assert isinstance(p, OpProfile) and p.source == "onnxruntime" and p.runs == 20
    assert p.ops and p.ops[0].ms > 0 and p.run_ms > 0 and [o.ms for o in p.ops] == sorted((o.ms for o in p.ops), reverse=True)
    # onnxruntime runs the convolutions fused with their ReLU (``relu_1_nchwc``): traced to the Conv2d
    convs = {o.module for o in p.ops if o.op_type in ("Conv", "FusedConv")}
    assert convs == CONVS, [(o.node, o.op_type, o.module) for o in p.ops]
    assert {o.module for o in p.ops if "Gemm" in (o.op_type or "")} == {"head"}
    assert {o.module_class for o in p.ops if o.module in CONVS} == {"Conv2d"}
    # what is left untraced is onnxruntime's own layout transforms
    assert all(o.op_type.startswith("Reorder") for o in p.ops if o.module is None), p.ops
    assert p.mapped_share >= 0.7 and p.by_op_type[0].ms > 0


def test_the_quantizer_nodes_are_traced_to_the_float_modules(profiled):
    p = profiled["measured"]["int8"].result.op_profile
    qdq = [o for o in p.ops if o.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert qdq and all(o.module is not None for o in qdq), [(o.node, o.module) for o in qdq if o.module is None]
    # the model's input is quantized in the model's own forward; a weight where it is read
    assert next(o.module for o in qdq if o.node.startswith("x_QuantizeLinear")) == ""
    weights = [o for o in qdq if ".weight" in o.node]
    assert all(o.module == o.node.split(".weight")[0] for o in weights), weights
    compute = {o.module for o in p.ops if o.op_type in ("Conv", "QLinearConv", "FusedConv")}
    assert compute == CONVS


def test_a_slower_variant_is_profiled_and_the_diff_names_the_ops_that_made_it_slower(profiled):
    from edgekit.inputs.recipe import GateConfig
    from edgekit.report.gate import evaluate_gate, slower_warnings

    measured = profiled["measured"]
    base, slow = measured["fp32"].result, measured["slow"].result
    assert slow.latency_ms.p50 > 3 * base.latency_ms.p50
    # picked for profiling by its latency alone (CIs separated), with the baseline
    assert profiled["chosen"][0] == "fp32" and "slow" in profiled["chosen"]
    d = profile_diff(base.op_profile, slow.op_profile, "fp32", "slow")
    assert d.same_runtime and d.delta_ms > 0
    assert d.rows[0].op_type == "Tanh" and d.rows[0].base_nodes == 0 and d.rows[0].other_nodes == 6
    assert d.summary.startswith("slow is ") and " slower than fp32" in d.summary
    assert "6 Tanh (new) add" in d.summary, d.summary
    tanh_ms = next(r.delta_ms for r in d.rows if r.op_type == "Tanh")
    assert tanh_ms > 0.5 * d.delta_ms  # the op types named are where the time went
    assert {o.module for o in slow.op_profile.ops if o.op_type == "Tanh"} == {None}  # not from the PyTorch model

    results = [m.result for m in measured.values()]
    warning = next(w for w in slower_warnings(results, "fp32") if w.startswith("slow is SLOWER"))
    assert "per-op profile: slow is" in warning and "Tanh" in warning and "measured p50" in warning
    gate = evaluate_gate(results, "fp32", GateConfig(min_speedup=1.0), judged=["slow"])
    check = next(c for c in gate.checks if c.name == "min_speedup")
    assert not check.passed and "Tanh" in check.message


def test_a_profile_across_runtimes_or_without_figures_says_so():
    ort = op_profile({"source": "onnxruntime", "runs": 2, "total_us": 400.0, "median_run_us": 200.0,
                      "ops": [{"node": "n", "op_type": "Conv", "calls": 2, "total_us": 300.0, "median_us": 150.0}]})
    et = op_profile({"source": "executorch", "runs": 2, "total_us": 200.0, "median_run_us": 100.0,
                     "ops": [{"node": "Convolution (NHWC, F32) IGEMM #1", "op_type": "Convolution (NHWC, F32) IGEMM",
                              "calls": 2, "total_us": 160.0, "median_us": 80.0}]})
    d = profile_diff(ort, et, "fp32", "et-fp32")
    assert not d.same_runtime and "compared by op type only" in d.summary and "faster" in d.summary
    # a measured p50 that disagrees with the profiler is said, with why (the profiler's per-node cost)
    told = profile_diff(ort, et, "fp32", "et-fp32", p50=(1.0, 2.0)).summary
    assert "measured p50 2 vs 1 ms" in told and "outweighs the measured difference" in told
    none = op_profile({"source": None, "ops": [], "reason": "no profiler here"})
    assert not none.available and none.ops == [] and none.reason == "no profiler here"
    assert "no profiler here" in profile_diff(ort, none, "fp32", "tflite").summary
    assert op_profile(None).reason  # an agent that sent nothing


def _tiny_tflite(path):
    """y = x + x as a .tflite flatbuffer, written with LiteRT's own schema (no converter needed)."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as s

    m = s.ModelT()
    m.version, m.description, m.buffers = 3, "edgekit test: y = x + x", [s.BufferT()]
    code = s.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = s.BuiltinOperator.ADD
    code.version = 1
    m.operatorCodes = [code]
    tensors = []
    for name in ("x", "y"):
        t = s.TensorT()
        t.name, t.shape, t.type, t.buffer = name, [1, 8], s.TensorType.FLOAT32, 0
        tensors.append(t)
    op = s.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [0, 0], [1]
    op.builtinOptionsType, op.builtinOptions = s.BuiltinOptions.AddOptions, s.AddOptionsT()
    g = s.SubGraphT()
    g.tensors, g.inputs, g.outputs, g.operators = tensors, [0], [1], [op]
    m.subgraphs = [g]
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    path.write_bytes(bytes(b.Output()))
    return path


def test_litert_has_no_op_profiler_in_python_and_the_agent_says_why(tmp_path, capsys):
    pytest.importorskip("ai_edge_litert")
    from ai_edge_litert.compiled_model import CompiledModel
    from ai_edge_litert.interpreter import Interpreter

    # what the reason claims, checked against the installed package: no profiler API to call
    assert not [m for cls in (Interpreter, CompiledModel) for m in dir(cls) if "profil" in m.lower()]
    agent = load_agent()
    model = _tiny_tflite(tmp_path / "add.tflite")
    req = {"protocol": 2, "variant": "t", "model": str(model), "runtime": "litert", "threads": 1, "warmup": 2,
           "runs": 5, "min_seconds": 0.0, "inputs": [{"name": "x", "shape": [1, 8], "dtype": "float32"}],
           "profile": {"runs": 5}}
    (tmp_path / "req.json").write_text(json.dumps(req))
    assert agent.cli.main(["agent", str(tmp_path / "req.json")]) == 0
    doc = json.loads(capsys.readouterr().out)
    prof = doc["op_profile"]
    assert prof["source"] is None and prof["ops"] == [] and prof["total_us"] is None
    assert "Python API exposes no per-op profiler" in prof["reason"] and "benchmark_model" in prof["reason"]
    assert len(doc["latency_ms"]["raw"]) == 5  # the timed figures are there as always
    p = op_profile(prof, model)
    assert not p.available and p.reason == prof["reason"]


def test_a_runner_without_a_profiler_answers_null_with_the_reason():
    agent = load_agent()
    prof = agent.runners.Runner().profile([], 3)
    assert prof["source"] is None and prof["ops"] == [] and "no per-op profiler" in prof["reason"]


@pytest.mark.slow
@pytest.mark.executorch  # CI's ExecuTorch step runs it, after it installs executorch
def test_executorch_event_tracer_profile(tmp_path):
    """ExecuTorch's ETDump through the agent: XNNPACK's own kernel names and times."""
    pytest.importorskip("executorch")
    import torch

    from edgekit.convert.torch_to_executorch import torch_to_executorch
    from edgekit.inputs.source import from_module

    x = np.random.default_rng(0).random((2, 1, 8, 8), dtype=np.float32)
    src = from_module(_net(), (torch.from_numpy(x),), tmp_path)
    pte = torch_to_executorch(src, tmp_path / "net.pte", precision="fp32", parity_inputs=[x])
    agent = load_agent()
    runner = agent.runners.RUNNERS["executorch"](str(pte.path), 1)
    prof = runner.profile([x], 10)
    assert prof["source"] == "executorch" and prof["runs"] == 10 and prof["total_us"] > 0
    assert any(o["op_type"].startswith("Convolution") and o["provider"] == "delegate" for o in prof["ops"])
    p = op_profile(prof, pte)
    assert p.available and p.ops[0].module is None and "ETRecord" in p.mapping


def test_the_report_shows_the_profiles_and_the_diff(profiled, tmp_path):
    from edgekit.report.model import Report
    from edgekit.report.write import write_report
    from tests.unit.report_factory import report, variant

    measured = profiled["measured"]
    fp32, slow = variant("fp32"), variant("slow", median=4.0, precision="int8", seed=1)
    fp32.op_profile, slow.op_profile = measured["fp32"].result.op_profile, measured["slow"].result.op_profile
    r = report([fp32, slow])
    r.profile_diffs = profile_diffs(r.variants, "fp32")
    assert len(r.profile_diffs) == 1 and "Tanh" in r.profile_diffs[0].summary
    paths = write_report(r, tmp_path)
    md = paths["md"].read_text()
    assert "## Per-op profile on the device" in md and "**slow vs fp32**: slow is" in md
    assert "blocks.0.conv (Conv2d)" in md and "| Tanh | 0 | 6 |" in md
    page = paths["html"].read_text()
    assert 'id="plot-op-profile"' in page and "<script" not in page
    fig = page[page.index('id="plot-op-profile"'):]
    assert "<svg" in fig[:3000] and "Tanh (0/6)" in fig
    assert "id=op-profile" in page and "blocks.1.conv" in page
    back = Report.load(paths["json"]) if hasattr(Report, "load") else Report.model_validate_json(paths["json"].read_text())
    assert isinstance(back.variants[1].op_profile, OpProfile) and back.profile_diffs[0].rows[0].op_type == "Tanh"
