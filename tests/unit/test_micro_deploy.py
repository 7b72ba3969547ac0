"""`edgekit deploy --target nrf52840` end to end (issue #44): the full-integer INT8 file through TFLite Micro on
this host, the report's gate judging the TFLM outputs, the fit and TFLM-vs-LiteRT; ship/ with the C array, the
arena and the resolver's ops; `edgekit run ship/` reproducing the report's accuracy through TFLM."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("tflite_micro", reason="the micro extra (pip install 'edgekit[micro]') is not installed")


# exports, converts (onnx2tf + TensorFlow) and runs TFLM: 15 s here
def test_deploy_to_a_microcontroller_ships_what_the_firmware_needs(tmp_path):
    import torch
    from typer.testing import CliRunner

    from edgekit.cli.main import app
    from edgekit.micro.c_array import from_c_array
    from edgekit.orchestration.run_shipped import run_shipped

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 8 * 8, 4)).eval()
    rng = np.random.default_rng(0)
    x = rng.random((96, 1, 8, 8), dtype=np.float32)
    y = net(torch.tensor(x)).argmax(1).numpy()  # labels the float model gets right: the drop is the INT8 file's
    torch.export.save(torch.export.export(net, (torch.tensor(x[:1]),)), tmp_path / "m.pt2")
    np.savez(tmp_path / "eval.npz", x=x, y=y)
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["deploy", str(tmp_path / "m.pt2"), "--eval-data", str(tmp_path / "eval.npz"),
                                   "--target", "nrf52840", "--out", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report.json").read_text())
    tflm = next(v for v in report["variants"] if v["name"] == "tflm-int8")
    checks = {c["name"]: c for c in report["gate"]["checks"]}
    assert {"micro_sram_fit", "micro_flash_fit", "accuracy_drop"} <= set(checks)  # the gate judges TFLM's outputs
    assert tflm["micro"]["litert"]["disagreement_with_tflm"]  # LiteRT's beside them, reported
    assert tflm["runtime"]["name"] == "tflite-micro" and tflm["latency_ms"] is None
    micro = tflm["micro"]
    assert micro["arena"]["bytes"] == checks["micro_sram_fit"]["value"] and micro["latency_reason"]
    assert micro["io"]["inputs"][0]["dtype"] == "int8" and micro["io"]["inputs"][0]["scale"] > 0
    assert "litert" in micro and micro["fit"]["flash"]["interpreter_source"]
    ladder = micro["int8_ladder"]  # judged by TFLM's accuracy: the first rung is inside the tolerance, so it ships
    assert ladder["shipped"] == ladder["rungs"][0]["rung"] and ladder["rungs"][0]["inside_tolerance"]
    assert ladder["rungs"][0]["accuracy_drop"] == pytest.approx(tflm["accuracy_drop"], abs=1e-6)
    assert ladder["not_tried"] and "per-tensor" in ladder["not_tried"][-1]

    ship = out / "ship"
    meta = json.loads((ship / "micro.json").read_text())
    assert meta["arena_bytes"] == micro["arena"]["bytes"] and "CONV_2D" in meta["ops"]
    assert from_c_array((ship / "tflm_int8_model.cc").read_text()) == (ship / "tflm-int8.tflite").read_bytes()
    assert "resolver.AddConv2D();" in (ship / "micro_ops.h").read_text()
    got = run_shipped(ship, {"input": x})
    top1 = float(np.mean(np.argmax(next(iter(got.values())), -1) == y) * 100)
    assert abs(top1 - tflm["accuracy"]["value"]) < 1e-6


def test_a_microcontroller_target_takes_no_recipe_or_search():
    from edgekit.errors import BadInputError
    from edgekit.inputs.targets import load_target
    from edgekit.orchestration.options import DeployOptions
    from edgekit.pipeline.deploy import variant_mode

    spec = load_target("nrf52840")
    assert variant_mode(None, None, DeployOptions(), spec, False) == "recipe"
    with pytest.raises(BadInputError, match="microcontroller"):
        variant_mode(None, True, DeployOptions(), spec, False)


@pytest.mark.slow  # a second export and conversion: ~15 s here
def test_a_model_over_the_parts_sram_is_exit_1_naming_the_peak_tensors(tmp_path):
    import torch
    import yaml
    from typer.testing import CliRunner

    from edgekit.cli.main import app

    net = torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(16 * 16 * 16, 2)).eval()
    x = np.random.default_rng(1).random((32, 1, 16, 16), dtype=np.float32)
    torch.export.save(torch.export.export(net, (torch.tensor(x[:1]),)), tmp_path / "m.pt2")
    np.savez(tmp_path / "eval.npz", x=x, y=np.zeros(32, dtype=np.int64))
    part = {"name": "tiny", "arch": "armv6-m", "os": "none", "cores": 1, "runtimes": ["tflite-micro"],
            "transport": "host-interpreter", "microcontroller": {"core": "cortex-m0plus", "clock_mhz": 48,
                                                                 "sram_kb": 4, "flash_kb": 256}}
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(part))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["deploy", str(tmp_path / "m.pt2"), "--eval-data", str(tmp_path / "eval.npz"),
                                   "--target", str(tmp_path / "tiny.yaml"), "--out", str(out)])
    assert res.exit_code == 1, res.output
    report = json.loads((out / "report.json").read_text())
    sram = next(c for c in report["gate"]["checks"] if c["name"] == "micro_sram_fit")
    assert not sram["passed"] and "does NOT fit" in sram["message"] and "the activations peak at" in sram["message"]
    peak = next(v for v in report["variants"] if v["name"] == "tflm-int8")["micro"]["fit"]["peak"]
    assert peak["tensors"][0]["name"] in sram["message"]
    assert any("must shrink by at least" in w for w in report["warnings"])
    assert "--train-data" in sram["message"] and "would open pruning" in sram["message"]  # what would open pruning
    assert json.loads((out / "ship" / "ship.json").read_text())["shipped"] is False


@pytest.mark.slow  # two conversions and a TFLM run: ~25 s here
def test_a_full_integer_tflite_deploys_as_given_and_a_float_one_is_exit_2_naming_the_fix(tmp_path):
    import torch
    from typer.testing import CliRunner

    from edgekit.cli.main import app
    from edgekit.convert.chain import convert_to_tflite
    from edgekit.convert.tflite.config import TfliteConfig
    from edgekit.convert.torch_to_onnx import export_onnx
    from edgekit.errors import BadInputError
    from edgekit.inputs.data import load_npz
    from edgekit.inputs.source import load_source
    from edgekit.orchestration.micro import MICRO_CONFIG

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 8 * 8, 4)).eval()
    x = np.random.default_rng(0).random((64, 1, 8, 8), dtype=np.float32)
    y = net(torch.tensor(x)).argmax(1).numpy()
    torch.export.save(torch.export.export(net, (torch.tensor(x[:1]),)), tmp_path / "m.pt2")
    np.savez(tmp_path / "c.npz", x=x)
    calib = load_npz(tmp_path / "c.npz", y_key=None, require_labels=False, role="calib")
    onnx = export_onnx(load_source(tmp_path / "m.pt2", workdir=tmp_path), tmp_path / "m.onnx", list(calib.xs))
    int8 = convert_to_tflite(onnx, tmp_path / "int8.tflite", MICRO_CONFIG, calib=calib, parity_inputs=list(calib.xs))
    fp32 = convert_to_tflite(onnx, tmp_path / "fp32.tflite", TfliteConfig(), parity_inputs=list(calib.xs))
    # a .tflite takes data in its own layout and dtype: NHWC, int8 (real = (q - zero_point) * scale)
    spec = int8.io.inputs[0]
    q = np.clip(np.round(x.transpose(0, 2, 3, 1) / spec.scale + spec.zero_point), -128, 127).astype(np.int8)
    np.savez(tmp_path / "eval_q.npz", x=q, y=y)
    np.savez(tmp_path / "eval_f.npz", x=x.transpose(0, 2, 3, 1), y=y)

    def deploy(model, data, out):
        return CliRunner().invoke(app, ["deploy", str(model), "--eval-data", str(data), "--target", "nrf52840",
                                        "--out", str(tmp_path / out)])

    res = deploy(int8.path, tmp_path / "eval_q.npz", "out")
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    tflm = next(v for v in report["variants"] if v["name"] == "tflm-int8")
    assert report["baseline"] == "given-int8" and tflm["selected"] and tflm["micro"]["arena"]["bytes"] > 0
    assert "skipped" in tflm["micro"]["int8_ladder"]
    assert (tmp_path / "out" / "ship" / "tflm-int8.tflite").read_bytes() == int8.path.read_bytes()  # as given
    bad = deploy(fp32.path, tmp_path / "eval_f.npz", "bad").exception
    assert isinstance(bad, BadInputError) and bad.exit_code == 2  # the CLI's main() exits with it
    assert "not a full-integer INT8 TFLite file" in bad.message and "float32, not int8" in bad.message
    assert "TFLITE_BUILTINS_INT8" in bad.hint  # the fix
