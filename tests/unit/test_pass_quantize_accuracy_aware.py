"""Accuracy-aware INT8 with real onnxruntime quantization and evaluation: a model built to be
quantization-sensitive (a huge activation outlier), the digits model, and every failure path."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from edgekit.errors import ConfigError, DataError, PassError
from edgekit.inputs.data import load_npz
from edgekit.inputs.source import load_onnx, ort_reference
from edgekit.passes import PassContext, get_pass
from edgekit.passes.accuracy_aware.config import tolerance_points

ARCH = str(Path(__file__).resolve().parents[2] / "examples" / "digits" / "model.py") + ":DigitsCNN"


def _accuracy(path, ds) -> float:
    out = ort_reference(Path(path))(list(ds.xs))
    return float((out.argmax(1) == ds.y).mean() * 100)


def _export(model, path: Path) -> Path:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), (torch.zeros(1, 1, 8, 8),), str(path), dynamo=False,
                          input_names=["x"], output_names=["logits"])
    return path


@pytest.fixture(scope="module")
def data(digits):
    return (load_npz(digits.calib, y_key=None, require_labels=False, role="calib"), load_npz(digits.eval))


@pytest.fixture(scope="module")
def outlier_onnx(outlier_module, tmp_path_factory) -> Path:
    return _export(outlier_module, tmp_path_factory.mktemp("outlier") / "outlier.onnx")


@pytest.fixture(scope="module")
def outlier_module(digits):
    """The trained digits CNN with one hidden unit scaled by 1e4 and the next layer's weights by
    1e-4: the same function in float, but the per-tensor INT8 scale of that activation is set by
    the outlier and every other unit rounds to zero."""
    import torch

    from edgekit.inputs.source import import_object

    model = import_object(ARCH)()
    model.load_state_dict(torch.load(digits.pth, weights_only=True))

    class Outlier(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m
            s = torch.ones(64)
            s[0] = 1e4
            self.register_buffer("s", s)
            with torch.no_grad():
                m.head[3].weight[:, 0] /= 1e4

        def forward(self, x):
            h = self.m.head[2](self.m.head[1](self.m.head[0](self.m.features(x))))
            return self.m.head[3](h * self.s)

    return Outlier(model).eval()


def _ctx(tmp_path, data):
    calib, ev = data
    return PassContext(workdir=tmp_path, calib=calib, eval=ev)


def test_outlier_model_full_int8_fails_and_accuracy_aware_keeps_that_layer_in_float(outlier_onnx, data, tmp_path):
    import onnx

    src = load_onnx(outlier_onnx).artifact
    ctx = _ctx(tmp_path, data)
    fp32_acc = _accuracy(outlier_onnx, data[1])
    aa = get_pass("quantize_accuracy_aware")(src, {"max_accuracy_drop": 0.5}, ctx, out_name="aa")
    m = aa.lineage[-1].metrics
    # plain INT8 in the encoding the pass started from (the host's fastest: U8S8 on x86 with VNNI)
    enc = m["full_int8"]["encoding"]
    plain = get_pass("quantize")(src, {"mode": "static", "format": enc.split("-")[0],
                                       "activation_type": "uint8" if "-u8" in enc else "int8",
                                       "per_channel": "per-channel" in enc}, ctx, out_name="plain")
    plain_drop = fp32_acc - _accuracy(plain.path, data[1])
    assert plain_drop > 0.5, f"plain INT8 was expected to break on the outlier, drop {plain_drop}"
    measured = _accuracy(aa.path, data[1])  # independent of the pass's own bookkeeping
    assert fp32_acc - measured <= 0.5 and measured == pytest.approx(m["accuracy"], abs=1e-3)
    assert m["full_int8"]["drop"] == pytest.approx(plain_drop, abs=1e-3)
    # the ops kept in float are those around the outlier: the Mul that makes it and the Gemm that reads it
    graph = onnx.load(str(outlier_onnx)).graph
    mul = next(n for n in graph.node if n.op_type == "Mul")
    reader = next(n for n in graph.node if mul.output[0] in n.input)
    assert set(m["float_ops"]) == {mul.name, reader.name}
    assert all(d["reason"] and d["op_type"] in ("Mul", "Gemm", "MatMul") for d in m["kept_in_float"])
    assert aa.precision == "mixed" and m["trials"] >= 2
    # the rest is really INT8: weights of the convs are quantized
    qgraph = onnx.load(str(aa.path)).graph
    assert sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") or n.op_type.startswith("QLinear")
               for n in qgraph.node) >= 3


def test_no_configuration_meets_the_tolerance_raises_with_the_best_found(outlier_onnx, data, tmp_path):
    src = load_onnx(outlier_onnx).artifact
    with pytest.raises(PassError) as err:
        get_pass("quantize_accuracy_aware")(src, {"max_accuracy_drop": 0.5, "max_float_ops": 1}, _ctx(tmp_path, data),
                                            out_name="fail")
    msg = str(err.value)
    assert "no INT8 configuration met the tolerance" in msg and "max_float_ops reached" in msg
    assert "best found keeps " in msg and "-u8s8-" in msg and "drops" in msg
    assert "no model was written" in msg
    assert err.value.exit_code == 2
    assert not (tmp_path / "fail.onnx").exists() and not list(tmp_path.glob(".fail*"))


def test_digits_accuracy_aware_int8_within_half_a_point(digits, data, tmp_path):
    import torch

    from edgekit.inputs.source import import_object

    model = import_object(ARCH)()
    model.load_state_dict(torch.load(digits.pth, weights_only=True))
    fp32 = _export(model, tmp_path / "fp32.onnx")
    aa = get_pass("quantize_accuracy_aware")(load_onnx(fp32).artifact, {"max_accuracy_drop": 0.5},
                                             _ctx(tmp_path, data))
    drop = _accuracy(fp32, data[1]) - _accuracy(aa.path, data[1])
    assert drop <= 0.5
    assert aa.size_bytes < fp32.stat().st_size / 2  # really INT8 weights


def test_relative_tolerance_is_percent_of_the_baseline():
    assert tolerance_points(1.0, False, 80.0) == 1.0
    assert tolerance_points(1.0, True, 80.0) == pytest.approx(0.8)


@pytest.mark.parametrize("bad", [-1, 100.5])
def test_tolerance_out_of_range_is_a_config_error(outlier_onnx, data, tmp_path, bad):
    with pytest.raises(ConfigError) as err:
        get_pass("quantize_accuracy_aware")(load_onnx(outlier_onnx).artifact, {"max_accuracy_drop": bad},
                                            _ctx(tmp_path, data))
    assert "max_accuracy_drop" in str(err.value) and err.value.exit_code == 2


def test_eval_without_labels_is_a_data_error(outlier_onnx, data, digits, tmp_path):
    unlabeled = load_npz(digits.calib, y_key=None, require_labels=False)
    ctx = PassContext(workdir=tmp_path, calib=data[0], eval=unlabeled)
    with pytest.raises(DataError, match="no labels"):
        get_pass("quantize_accuracy_aware")(load_onnx(outlier_onnx).artifact, {}, ctx)
    with pytest.raises(DataError, match="needs an eval set"):
        get_pass("quantize_accuracy_aware")(load_onnx(outlier_onnx).artifact, {},
                                            PassContext(workdir=tmp_path, calib=data[0]))


@pytest.mark.slow
def test_inc_backend_refuses_the_outlier_model_instead_of_returning_its_last_try(outlier_module, data, tmp_path):
    """INC 3.10's autotune returns a model when it runs out of configs; edgekit must not pass it on."""
    import torch

    ep = torch.export.export(outlier_module, (torch.zeros(1, 1, 8, 8),))
    torch.export.save(ep, str(tmp_path / "outlier.pt2"))
    from edgekit.inputs.source import load_pt2

    with pytest.raises(PassError, match="INC found no INT8 configuration within 0.50 accuracy points") as err:
        get_pass("quantize_inc")(load_pt2(tmp_path / "outlier.pt2").artifact,
                                 {"max_accuracy_drop": 0.5, "max_trials": 2}, _ctx(tmp_path, data), out_name="inc")
    assert "no model was written" in str(err.value) and not (tmp_path / "inc.onnx").exists()
