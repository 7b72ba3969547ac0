"""PyTorch -> Core ML with the real coremltools: convert, save, validate the spec. Prediction
needs macOS; on Linux the parity figure is null with the reason, never made up."""

import platform

import pytest

from edgekit.errors import ConversionError, DeviceError
from edgekit.formats import Format
from edgekit.inputs.data import load_npz

pytest.importorskip("coremltools")


@pytest.fixture(scope="module")
def source(digits, tmp_path_factory):
    from edgekit.inputs.source import load_source

    return load_source(digits.pt2, workdir=tmp_path_factory.mktemp("coreml-src"))


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_mlprogram_converts_and_validates(source, digits, tmp_path, precision):
    from edgekit.convert.torch_to_coreml import CoremlConfig, torch_to_coreml

    out = tmp_path / "m.mlpackage"
    art = torch_to_coreml(source, out, CoremlConfig(precision=precision), parity_inputs=list(load_npz(digits.eval).xs))
    assert art.format == Format.COREML and art.precision == precision and out.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.mlpackage"]  # no temp folder left behind
    m = art.lineage[-1].metrics
    assert art.lineage[-1].name == "torch->coreml" and m["spec"]["operations"] > 5 and m["spec"]["inputs"] == ["x"]
    assert m["reexport"] is None and m["input_casts"] == {}  # a contiguous float program goes in as it is
    assert m["spec"]["input_dtypes"] == ["float32"] and [s.dtype for s in art.io.inputs] == ["float32"]
    if platform.system() != "Darwin":
        assert m["parity"] is None and "needs macOS" in m["parity_reason"]
        assert "parity_violations" not in m  # nothing measured, nothing claimed


def test_int8_weights_are_smaller_than_fp16(source, digits, tmp_path):
    from edgekit.convert.torch_to_coreml import CoremlConfig, torch_to_coreml

    xs = list(load_npz(digits.eval).xs)
    a16 = torch_to_coreml(source, tmp_path / "a.mlpackage", CoremlConfig(precision="fp16"), parity_inputs=xs)
    a8 = torch_to_coreml(source, tmp_path / "b.mlpackage", CoremlConfig(precision="int8"), parity_inputs=xs)
    assert a8.size_bytes < 0.7 * a16.size_bytes


def test_onnx_source_and_wrong_suffix_are_refused(digits, tmp_path):
    from edgekit.convert.torch_to_coreml import torch_to_coreml
    from edgekit.convert.torch_to_onnx import export_onnx
    from edgekit.inputs.source import load_onnx, load_source

    src = load_source(digits.pt2, workdir=tmp_path)
    with pytest.raises(ConversionError, match=r"\.mlpackage"):
        torch_to_coreml(src, tmp_path / "m.mlmodel")
    onnx_art = export_onnx(src, tmp_path / "m.onnx", list(load_npz(digits.eval).xs))
    with pytest.raises(ConversionError, match="no ONNX front end"):
        torch_to_coreml(load_onnx(onnx_art.path), tmp_path / "m.mlpackage")


def test_coreml_target_stops_after_validation_with_a_clear_message(tmp_path):
    from edgekit.artifact import Artifact, IOSpec, TensorSpec
    from edgekit.convert.torch_to_coreml import set_aside_coreml
    from edgekit.inputs.targets import load_target

    pkg = tmp_path / "v.mlpackage"
    pkg.mkdir()
    (pkg / "Manifest.json").write_text("{}")
    io = IOSpec(inputs=(TensorSpec(name="x", shape=(1, 4), dtype="float32"),), outputs=())
    onnx_file = tmp_path / "m.onnx"
    onnx_file.write_bytes(b"x")
    variants = {"fp32": Artifact.from_file(onnx_file, Format.ONNX, io),
                "coreml-fp16": Artifact.from_file(pkg, Format.COREML, io)}
    rest, notes = set_aside_coreml(variants, load_target("local"))
    assert list(rest) == ["fp32"] and "coreml-fp16" in notes[0] and "macOS" in notes[0]
    with pytest.raises(DeviceError, match="needs a macOS host") as ei:
        set_aside_coreml(variants, load_target("iphone-coreml"))
    assert ei.value.exit_code == 3 and "coreml-fp16" in str(ei.value)
