"""NCNN as a runtime (issue #24): ONNX -> pnnx -> .param + .bin (one artifact of two files) at fp32 and
fp16, parity checked by the agent's own NCNNRunner; fp32 pins NCNN's fp16 options off (a run-time setting,
not the file), which the host sends with every request for the file; the agent measures NCNN variants
beside the ONNX baseline on the local target; what NCNN cannot do here is said, not faked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgekit.formats import Format


def _xs(path) -> list[np.ndarray]:
    return [np.load(path)["x"]]


@pytest.fixture(scope="module")
def digits_onnx(digits, tmp_path_factory):
    from edgekit.convert.torch_to_onnx import export_onnx
    from edgekit.inputs.source import load_source

    src = load_source(digits.pt2, workdir=tmp_path_factory.mktemp("ncnn-src"))
    return export_onnx(src, tmp_path_factory.mktemp("ncnn-onnx") / "fp32.onnx", _xs(digits.eval))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_pnnx_writes_two_files_within_parity(digits, digits_onnx, tmp_path, precision):
    from edgekit.convert.onnx_to_ncnn import HOP, NcnnConfig, onnx_to_ncnn
    from edgekit.fsutil import sha256_files

    out = tmp_path / f"digits-{precision}.param"
    art = onnx_to_ncnn(digits_onnx, out, NcnnConfig(precision=precision), parity_inputs=_xs(digits.eval))
    assert art.format == Format.NCNN and [f.name for f in art.files] == [out.name, f"digits-{precision}.bin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f.name for f in art.files)  # pnnx's by-products gone
    assert art.sha256 == sha256_files(art.files)
    step = art.lineage[-1]
    assert step.name == HOP and step.metrics["parity_violations"] == [] and step.metrics["batch"] == 1
    assert art.runtime_options == {"fp16": "off" if precision == "fp32" else "on"}
    p = step.metrics["parity"]
    if precision == "fp32":
        assert p["max_abs_err"] < 1e-4, p  # fp16 options off: f32 arithmetic
    else:
        assert 1e-4 < p["max_abs_err"] < 5e-2 and p["top1_agreement"] >= 0.98, p  # visibly fp16, same classifier
    # fp16 weights halve the .bin
    if precision == "fp16":
        fp32 = onnx_to_ncnn(digits_onnx, tmp_path / "w32.param", NcnnConfig(), parity_inputs=_xs(digits.eval))
        assert out.with_suffix(".bin").stat().st_size < 0.6 * fp32.path.with_suffix(".bin").stat().st_size


def test_what_ncnn_cannot_take_is_refused_with_the_reason(digits_onnx, tmp_path):
    from edgekit.artifact import IOSpec, TensorSpec
    from edgekit.convert.onnx_to_ncnn import NcnnConfig, onnx_to_ncnn
    from edgekit.errors import ConversionError
    from edgekit.passes.convert import ConvertConfig

    ints = digits_onnx.model_copy(update={"io": IOSpec(inputs=(TensorSpec(name="ids", shape=(1, 8), dtype="int64"),),
                                                       outputs=digits_onnx.io.outputs)})
    with pytest.raises(ConversionError, match="NCNN takes float inputs; this model's ids \\(int64\\)"):
        onnx_to_ncnn(ints, tmp_path / "m.param", NcnnConfig(), parity_inputs=[np.zeros((1, 8), np.int64)])
    batched = digits_onnx.model_copy(update={"io": IOSpec(inputs=(TensorSpec(name="x", shape=(4, 1, 8, 8),
                                                                             dtype="float32"),),
                                                          outputs=digits_onnx.io.outputs)})
    with pytest.raises(ConversionError, match="no batch axis"):
        onnx_to_ncnn(batched, tmp_path / "m.param", NcnnConfig(), parity_inputs=[np.zeros((4, 1, 8, 8), np.float32)])
    assert not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match="ncnn2table"):  # INT8: named as missing, with the tool that is
        ConvertConfig(to="ncnn", precision="int8")


def test_the_agent_measures_ncnn_variants_with_their_pinned_setting(digits, tmp_path):
    import edgekit
    from edgekit.inputs.recipe import Recipe

    recipe = Recipe.model_validate({
        "baseline": "fp32",
        "variants": [
            {"name": "ncnn-fp32", "passes": [{"convert": {"to": "ncnn", "precision": "fp32"}}]},
            {"name": "ncnn-fp16", "passes": [{"convert": {"to": "ncnn", "precision": "fp16"}}]},
        ],
        "measure": {"warmup": 2, "runs": 10, "min_seconds": 0.05},
    })
    out = tmp_path / "out"
    rep = edgekit.deploy(digits.pt2, eval_data=digits.eval, calib_data=digits.calib, target="local",
                         recipe=recipe, out=out)
    by = {v.name: v for v in rep.variants}
    assert list(by) == ["fp32", "ncnn-fp32", "ncnn-fp16"]
    for name, fp16 in (("ncnn-fp32", "off"), ("ncnn-fp16", "on")):
        v = by[name]
        assert v.format == "ncnn" and v.runtime.name == "ncnn" and v.runtime.threads == 1
        assert v.runtime.options == {"fp16": fp16}, v.runtime.options  # the hop's pinned setting reached the device
        assert v.latency_ms.p50 > 0 and abs(v.accuracy.value - by["fp32"].accuracy.value) <= 1.0
    assert by["ncnn-fp32"].parity.max_abs_err < 1e-4  # on the device too: f32 arithmetic
    rt_ship = out / "ship" / "runtime.json"
    if rt_ship.exists() and json.loads(rt_ship.read_text())["runtime"] == "ncnn":
        rt = json.loads(rt_ship.read_text())
        assert rt["apply"]["batch"] == 1 and rt["apply"]["opt"]["num_threads"] == rt["threads"]
        assert [Path(f).suffix for f in json.loads((out / "ship" / "ship.json").read_text())["files"]] == \
            [".param", ".bin"]


def test_a_model_never_overwrites_the_weights_of_another_formats_model(digits, digits_onnx, tmp_path):
    """OpenVINO's m.xml and NCNN's m.param both keep weights in m.bin: the second conversion to the same stem
    is refused (it used to replace the IR's weights silently), and the first model stays whole."""
    from edgekit.convert.onnx_to_ncnn import NcnnConfig, onnx_to_ncnn
    from edgekit.convert.onnx_to_openvino import OpenvinoConfig, onnx_to_openvino
    from edgekit.errors import ConversionError

    ir = onnx_to_openvino(digits_onnx, tmp_path / "m.xml", OpenvinoConfig(), parity_inputs=_xs(digits.eval))
    with pytest.raises(ConversionError, match="m.bin holds the weights of m.xml"):
        onnx_to_ncnn(digits_onnx, tmp_path / "m.param", NcnnConfig(), parity_inputs=_xs(digits.eval))
    from edgekit.artifact import Artifact

    assert Artifact.from_file(ir.path, ir.format, ir.io).sha256 == ir.sha256  # the IR and its weights untouched
    assert not (tmp_path / "m.param").exists()


def test_an_op_pnnx_leaves_untranslated_is_named(tmp_path):
    """Wav2Vec2's feature encoder normalizes each channel over time (GroupNorm with a group per channel, ONNX
    InstanceNormalization on a 3-D tensor): pnnx keeps it as ``nn.InstanceNorm1d``, which NCNN has no layer
    for, and NCNN then refused the file with "cannot load" and a stderr line. The error names the op(s)."""
    import torch

    from edgekit.convert.onnx_to_ncnn import NcnnConfig, onnx_to_ncnn
    from edgekit.convert.torch_to_onnx import export_onnx
    from edgekit.errors import ConversionError
    from edgekit.inputs.source import load_source

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv1d(1, 8, 5, stride=2)
            self.norm = torch.nn.GroupNorm(8, 8)

        def forward(self, x):
            return torch.nn.functional.gelu(self.norm(self.conv(x)))

    x = np.random.default_rng(0).normal(size=(4, 1, 64)).astype(np.float32)
    ep = torch.export.export(Encoder().eval(), (torch.from_numpy(x[:1]),))
    torch.export.save(ep, tmp_path / "enc.pt2")
    src = load_source(tmp_path / "enc.pt2", workdir=tmp_path)
    onnx_art = export_onnx(src, tmp_path / "enc.onnx", [x[:1]])
    with pytest.raises(ConversionError, match=r"pnnx left op\(s\) that NCNN has no layer for: nn\.InstanceNorm1d"):
        onnx_to_ncnn(onnx_art, tmp_path / "enc.param", NcnnConfig(), parity_inputs=[x[:1]])
    assert not (tmp_path / "enc.param").exists() and not (tmp_path / "enc.bin").exists()
