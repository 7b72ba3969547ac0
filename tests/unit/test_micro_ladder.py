"""The microcontroller's INT8 ladder (issue #44 item 2): full-integer INT8 rungs (calibration samples, per-channel
vs per-tensor weight scales) judged by TFLite Micro's accuracy; the first inside the gate's tolerance ships."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from edgekit.errors import ConversionError
from edgekit.orchestration.micro import MICRO_CONFIG
from edgekit.orchestration.micro_ladder import MAX_CALIBRATION, climb, rungs


def test_the_rungs_are_few_and_follow_the_calibration_set():
    small = rungs(MICRO_CONFIG, 96)
    assert [r.cfg.per_channel for r in small] == [True, False]  # no more samples to calibrate on: two rungs
    assert small[0].cfg == MICRO_CONFIG and "96 calibration samples" in small[0].name
    big = rungs(MICRO_CONFIG, 5000)
    assert [r.cfg.calibration_samples for r in big] == [200, MAX_CALIBRATION, 200]
    assert big[2].cfg.per_channel is False and big[2].cfg.io == "int8"


def _fake(drops, fail=()):
    def build(i, rung):
        if i in fail:
            raise ConversionError(f"rung {i} broke", hop="onnx->tflite")
        return SimpleNamespace(size_bytes=100 + i), SimpleNamespace(arena=SimpleNamespace(bytes=1000 + i), d=drops[i])

    return build, (lambda m: m.d)


def test_the_first_rung_inside_the_tolerance_ships_and_the_rest_are_not_tried():
    ladder = rungs(MICRO_CONFIG, 5000)
    build, drop = _fake([3.0, 0.5, 0.0])
    c = climb(ladder, build, drop, 1.0, lambda s: None)
    assert c.rung is ladder[1] and c.record["shipped"] == ladder[1].name
    assert [r["inside_tolerance"] for r in c.record["rungs"]] == [False, True]
    assert c.record["not_tried"] == [ladder[2].name]


def test_none_inside_ships_the_least_drop_and_a_later_rung_s_failure_is_recorded():
    ladder = rungs(MICRO_CONFIG, 5000)
    build, drop = _fake([3.0, 2.0, 9.0], fail={1})
    c = climb(ladder, build, drop, 1.0, lambda s: None)
    assert c.rung is ladder[0] and "rung 1 broke" in c.record["rungs"][1]["error"]
    assert "not_tried" not in c.record
    with pytest.raises(ConversionError):  # the first rung's failure is the run's
        climb(ladder, *_fake([0.0], fail={0}), 1.0, lambda s: None)


def test_the_per_tensor_rung_writes_one_weight_scale_per_tensor(tmp_path):
    pytest.importorskip("onnx2tf")
    import tensorflow as tf
    import torch

    from edgekit.convert.chain import convert_to_tflite
    from edgekit.convert.torch_to_onnx import export_onnx
    from edgekit.inputs.data import load_npz
    from edgekit.inputs.source import load_source

    net = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 8 * 8, 4)).eval()
    x = np.random.default_rng(0).random((32, 1, 8, 8), dtype=np.float32)
    torch.export.save(torch.export.export(net, (torch.tensor(x[:1]),)), tmp_path / "m.pt2")
    np.savez(tmp_path / "c.npz", x=x)
    calib = load_npz(tmp_path / "c.npz", y_key=None, require_labels=False, role="calib")
    onnx = export_onnx(load_source(tmp_path / "m.pt2", workdir=tmp_path), tmp_path / "m.onnx", list(calib.xs))
    scales = {}
    for r in rungs(MICRO_CONFIG, calib.n):
        art = convert_to_tflite(onnx, tmp_path / f"{r.cfg.per_channel}.tflite", r.cfg, calib=calib,
                                parity_inputs=list(calib.xs))
        interp = tf.lite.Interpreter(model_path=str(art.path))
        conv_w = [t for t in interp.get_tensor_details() if len(t["shape"]) == 4 and t["dtype"] == np.int8
                  and t["shape"][0] == 8 and t["shape"][-1] == 1]  # the conv's OHWI weights
        scales[r.cfg.per_channel] = len(conv_w[0]["quantization_parameters"]["scales"])
    assert scales == {True: 8, False: 1}


@pytest.mark.slow  # three conversions and TFLM runs: ~25 s here
def test_a_deploy_whose_first_rung_misses_the_tolerance_climbs_and_ships_the_least_drop(tmp_path):
    pytest.importorskip("tflite_micro", reason="the micro extra (pip install 'edgekit[micro]') is not installed")
    import json

    import torch
    from typer.testing import CliRunner

    from edgekit.cli.main import app

    torch.manual_seed(0)  # an untrained 10-class net scored against its own float labels: INT8 flips a few
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 8 * 8, 10)).eval()
    x = np.random.default_rng(0).random((300, 1, 8, 8), dtype=np.float32)
    y = net(torch.tensor(x)).argmax(1).numpy()
    torch.export.save(torch.export.export(net, (torch.tensor(x[:1]),)), tmp_path / "m.pt2")
    np.savez(tmp_path / "eval.npz", x=x[:200], y=y[:200])
    np.savez(tmp_path / "calib.npz", x=np.concatenate([x, x]))  # 600 samples: the ladder has its middle rung
    res = CliRunner().invoke(app, ["deploy", str(tmp_path / "m.pt2"), "--eval-data", str(tmp_path / "eval.npz"),
                                   "--calib-data", str(tmp_path / "calib.npz"), "--target", "nrf52840",
                                   "--max-accuracy-drop", "0", "--out", str(tmp_path / "out")])
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    tflm = next(v for v in report["variants"] if v["name"] == "tflm-int8")
    ladder = tflm["micro"]["int8_ladder"]
    drops = [r["accuracy_drop"] for r in ladder["rungs"]]
    assert drops[0] > 0, "INT8 lost nothing on this net: the test needs a first rung outside the tolerance"
    assert len(drops) >= 2 and not any(r["inside_tolerance"] for r in ladder["rungs"][:-1])
    assert ladder["rungs"][1]["calibration_samples"] == 600
    shipped = next(r for r in ladder["rungs"] if r["rung"] == ladder["shipped"])
    assert shipped["accuracy_drop"] == min(drops)  # none inside: the least drop (the first on a tie)
    assert tflm["accuracy_drop"] == pytest.approx(shipped["accuracy_drop"], abs=1e-6)  # the file measured is it
    assert res.exit_code == (0 if shipped["inside_tolerance"] else 1), res.output
