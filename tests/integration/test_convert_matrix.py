"""The conversion matrix: six architectures (tests/models_zoo.py) x every format and precision,
with real converters (torch.onnx, onnx2tf + TensorFlow, litert-torch, coremltools), the LiteRT
interpreter running the same code as the device agent, and parity asserted against the
documented tolerances (edgekit/convert/parity.py). Heavy: marked slow, except one MLP case that
keeps a real conversion in the default run."""

import platform

import models_zoo
import pytest

from edgekit.convert.parity import TOLERANCES

pytest.importorskip("onnx2tf")

# (format, precision label, convert() keywords)
TFLITE = [("fp32", {}), ("fp16", {}), ("int8-dynamic", {"quantization": "dynamic"}), ("int8", {}),
          ("int8-int8io", {"io": "int8"})]
COREML = ["fp32", "fp16", "int8"]
# INT8 top-1 agreement with the float model we hold every architecture to on its 64 eval inputs
# (the parity tolerance for int8 is 0.90; these seeded tiny models reach 1.0 today).
MIN_INT8_TOP1 = TOLERANCES["int8"].min_top1_agreement


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo")
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = models_zoo.export(name, root / name)
        return cache[name]

    return get


def _convert(zoo, name, to, label, extra, tmp_path):
    from edgekit.convert.api import convert

    pt2, calib, ev = zoo(name)
    suffix = {"onnx": ".onnx", "tflite": ".tflite", "coreml": ".mlpackage"}[to]
    return convert(pt2, to=to, precision=label.split("-")[0], out=tmp_path / f"{name}-{label}{suffix}",
                   calib_data=calib, eval_data=ev, **extra)


def _check_parity(art, label):
    for step in art.lineage:
        if step.kind != "convert":
            continue
        m = step.metrics
        assert m["parity_violations"] == [], (step.name, m)
        par = m["parity"]
        precision = art.precision if step is art.lineage[-1] else "fp32"
        tol = TOLERANCES[precision]
        if tol.max_abs_err is not None:
            assert par["max_abs_err"] <= tol.max_abs_err, (step.name, par)
        assert par["cosine"] >= tol.min_cosine, (step.name, par)
    chain = art.lineage[-1].metrics.get("chain_parity") or art.lineage[-1].metrics["parity"]
    if label.startswith("int8"):
        assert chain["top1_agreement"] >= MIN_INT8_TOP1, chain


def test_mlp_tflite_int8_default_run(zoo, tmp_path):
    """One real conversion kept in the fast run: the MLP through ONNX to full-integer TFLite."""
    art = _convert(zoo, "mlp", "tflite", "int8", {}, tmp_path)
    assert art.format.value == "tflite" and [s.name for s in art.lineage if s.kind == "convert"] == [
        "torch->onnx", "onnx->tflite"]
    _check_parity(art, "int8")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(models_zoo.ZOO))
def test_onnx(zoo, tmp_path, name):
    art = _convert(zoo, name, "onnx", "fp32", {}, tmp_path)
    _check_parity(art, "fp32")
    assert art.lineage[-1].metrics["parity"]["max_abs_err"] < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("label, extra", TFLITE, ids=[t[0] for t in TFLITE])
@pytest.mark.parametrize("name", list(models_zoo.ZOO))
def test_tflite(zoo, tmp_path, name, label, extra):
    if name == "transformer" and label in ("int8", "int8-int8io"):
        # the support table (docs/benchmarks/conversion.md): exact GELU is ONNX Erf; TFLite has no builtin Erf
        # (a Flex op) and onnx2tf's builtin pseudo-Erf has a DIV whose int8 kernel meets a zero divisor at run time.
        from edgekit.errors import ConversionError

        with pytest.raises(ConversionError) as ei:
            _convert(zoo, name, "tflite", label, extra, tmp_path)
        msg = str(ei.value)
        assert "Erf (ONNX Erf at" in msg and "(DIV) failed to invoke" in msg
        assert not list(tmp_path.glob("*.tflite"))
        return
    art = _convert(zoo, name, "tflite", label, extra, tmp_path)
    _check_parity(art, label)
    if name == "transformer":  # exact GELU -> Erf would need a TF Flex op: the fallback route fixes it
        assert art.lineage[-1].metrics["route"] == "onnx2tf(pseudo_ops=Erf)"
    if label == "int8-int8io":
        assert art.io.inputs[0].dtype == "int8" and art.io.inputs[0].scale > 0


@pytest.mark.slow
@pytest.mark.parametrize("precision", COREML)
@pytest.mark.parametrize("name", list(models_zoo.ZOO))
def test_coreml(zoo, tmp_path, name, precision):
    pytest.importorskip("coremltools")
    art = _convert(zoo, name, "coreml", precision, {}, tmp_path)
    m = art.lineage[-1].metrics
    assert m["spec"]["operations"] > 0
    # coremltools has no aten.gru lowering: edgekit converts again after core-ATen decompositions
    assert m["decomposition"] == ("core-aten" if name == "gru" else "aten")
    if platform.system() == "Darwin":
        _check_parity(art, precision)
    else:
        assert m["parity"] is None and "macOS" in m["parity_reason"]


@pytest.mark.slow
@pytest.mark.litert_torch  # CI's litert-torch step runs these, in its own venv (.ci/litert_torch.sh)
@pytest.mark.parametrize("name", ["mobilenet", "transformer", "gru"])
def test_litert_torch_route(zoo, tmp_path, name):
    from edgekit.convert.torch_to_tflite import available

    if not available():
        pytest.skip("litert-torch is not installed (pip install 'edgekit[litert-torch]')")
    art = _convert(zoo, name, "tflite", "fp32", {"route": "litert-torch"}, tmp_path)
    m = art.lineage[-1].metrics
    assert art.lineage[-1].name == "torch->tflite" and m["route"] == "litert-torch"
    assert m["parity_violations"] == [] and m["parity"]["max_abs_err"] < 1e-3
    assert art.io.inputs[0].transpose is None  # litert-torch keeps the PyTorch layout


@pytest.mark.slow
@pytest.mark.litert_torch  # CI's litert-torch step runs it, in its own venv (.ci/litert_torch.sh)
def test_litert_torch_route_keeps_each_output_of_a_three_head_model(tmp_path):
    """Three heads, two of one shape: each TFLite output is the program's output of the same rank
    (matched through the file's output_K signature keys), and parity holds per output."""
    import numpy as np
    import torch

    from edgekit.convert.api import convert
    from edgekit.convert.torch_to_tflite import available

    if not available():
        pytest.skip("litert-torch is not installed (pip install 'edgekit[litert-torch]')")

    class Heads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.a, self.b, self.c = (torch.nn.Linear(8, 16), torch.nn.Linear(16, 4),
                                                 torch.nn.Linear(16, 2), torch.nn.Linear(16, 4))

        def forward(self, x):
            h = torch.relu(self.body(x))
            return self.c(h) * 3.0, self.b(h), self.a(h)

    torch.manual_seed(0)
    x = np.random.default_rng(0).normal(size=(16, 8)).astype(np.float32)
    pt2 = tmp_path / "heads.pt2"
    torch.export.save(torch.export.export(Heads().eval(), (torch.from_numpy(x[:1]),)), str(pt2))
    np.savez(tmp_path / "calib.npz", x=x)
    art = convert(pt2, to="tflite", precision="fp32", out=tmp_path / "heads.tflite", calib_data=tmp_path / "calib.npz",
                  route="litert-torch")
    m = art.lineage[-1].metrics
    assert m["route"] == "litert-torch" and m["parity_violations"] == [], m
    assert [s.shape[-1] for s in art.io.outputs] == [4, 2, 4]
    from ai_edge_litert.interpreter import Interpreter

    sig = Interpreter(model_path=str(tmp_path / "heads.tflite")).get_signature_runner().get_output_details()
    names = {int(d["index"]): k for k, d in sig.items()}
    index = {d["name"]: int(d["index"]) for d in
             Interpreter(model_path=str(tmp_path / "heads.tflite")).get_output_details()}
    assert [names[index[s.name]] for s in art.io.outputs] == ["output_0", "output_1", "output_2"]
