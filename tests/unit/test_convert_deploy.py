"""`edgekit deploy` with TFLite variants: converted, run by the real agent with the LiteRT
interpreter, reported side by side with the ONNX variants; and which formats a target gets."""

from pathlib import Path

import pytest

from edgekit.inputs.recipe import Recipe, default_recipe
from edgekit.inputs.targets import load_target
from edgekit.passes.convert import ConvertConfig, variants_for_target
from edgekit.report.model import Report


def test_tflite_variant_runs_in_the_agent_beside_onnx(cli, digits, tmp_path):
    pytest.importorskip("onnx2tf")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("""
baseline: fp32
variants:
  - name: int8-static
    passes:
      - quantize: {mode: static}
  - name: tflite-int8
    passes:
      - convert: {to: tflite, precision: int8, io: int8}
measure: {warmup: 2, runs: 10, min_seconds: 0.05}
""")
    out = tmp_path / "out"
    r = cli("deploy", digits.pt2, "--target", "local", "--eval-data", digits.eval, "--calib-data", digits.calib,
            "--recipe", recipe, "--out", out)
    assert r.exit_code == 0, r.stderr
    rep = Report.load(out / "report.json")
    by = {v.name: v for v in rep.variants}
    assert [v.name for v in rep.variants] == ["fp32", "int8-static", "tflite-int8"]
    t = by["tflite-int8"]
    assert t.format == "tflite" and t.runtime.name == "litert" and t.precision == "int8"
    assert by["fp32"].format == "onnx" and by["fp32"].runtime.name == "onnxruntime"
    # measured on the device: real latency, and eval accuracy through int8 quantize/dequantize in the agent
    assert t.latency_ms.runs >= 10 and t.latency_ms.p50 > 0 and t.accuracy.n == 360
    assert t.accuracy.value > 90 and t.parity.top1_agreement > 0.95
    hop = next(s for s in t.lineage if s["name"] == "onnx->tflite")
    assert hop["kind"] == "convert" and hop["metrics"]["route"] == "onnx2tf"
    assert "parity" in hop["metrics"] and hop["metrics"]["parity_violations"] == []
    assert any(c.name == "parity[onnx->tflite]" and c.variant == "tflite-int8" for c in rep.gate.checks)
    assert "tflite-int8" in (out / "report.md").read_text()


def _names(rec: Recipe) -> list[str]:
    return [v.name for v in rec.variants]


def test_litert_targets_get_tflite_variants():
    rec = variants_for_target(default_recipe(True), load_target("rpi4"), has_calib=True)
    assert _names(rec) == ["int8-static", "tflite-fp32", "tflite-int8"]
    int8 = rec.variants[-1].passes[0]
    assert int8.name == "convert" and int8.config == {"to": "tflite", "precision": "int8", "io": "float"}
    no_calib = variants_for_target(default_recipe(False), load_target("pixel-arm64"), has_calib=False)
    assert no_calib.variants[-1].passes[0].config["quantization"] == "dynamic"


def test_onnx_targets_keep_the_recipe_and_iphone_gets_coreml():
    base = default_recipe(True)
    assert variants_for_target(base, load_target("local"), True) == base
    assert variants_for_target(base, load_target("jetson-orin-nano"), True) == base
    assert _names(variants_for_target(base, load_target("iphone-coreml"), True))[-3:] == [
        "coreml-fp32", "coreml-fp16", "coreml-int8"]


def test_a_recipe_that_converts_is_left_alone():
    rec = Recipe.model_validate({"variants": [{"name": "t", "passes": [{"convert": {"to": "tflite"}}]}]})
    assert variants_for_target(rec, load_target("rpi4"), True) == rec


def test_convert_step_config_errors_name_the_key():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="apply to to: tflite only"):
        ConvertConfig(to="coreml", io="int8")
    with pytest.raises(ValidationError, match="quantize it with a `quantize` step"):
        ConvertConfig(to="onnx", precision="int8")
    with pytest.raises(ValidationError):
        ConvertConfig(to="tflite", precison="int8")  # typo: extra keys are refused


@pytest.mark.slow
def test_iphone_target_converts_validates_and_says_macos(cli, digits, tmp_path):
    pytest.importorskip("coremltools")
    import platform

    if platform.system() == "Darwin":
        pytest.skip("on macOS Core ML can run; this checks the Linux behaviour")
    out = tmp_path / "out"
    r = cli("deploy", digits.pt2, "--target", "iphone-coreml", "--eval-data", digits.eval, "--out", out)
    assert r.exit_code == 3 and "needs a macOS host" in r.stderr
    assert "coreml-fp16" in r.stderr and "spec validated" in r.stderr
    assert sorted(p.name for p in (out / "artifacts").glob("*.mlpackage")) == [
        "coreml-fp16-0-convert.mlpackage", "coreml-fp32-0-convert.mlpackage", "coreml-int8-0-convert.mlpackage"]
    assert not (out / "report.json").exists()  # nothing measured, so no report claims anything
