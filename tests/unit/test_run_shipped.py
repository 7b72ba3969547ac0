"""The ship contract: ``ship/`` alone says how to call the file (names, layouts, transposes, the static
shape it was converted at), and ``edgekit run ship/`` / ``run_shipped`` feed it as the agent did."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from edgekit.errors import BadInputError, DataError, ModelLoadError
from edgekit.orchestration.run_shipped import run_shipped
from edgekit.orchestration.ship import write_ship
from edgekit.report.model import RuntimeInfo, VariantResult


def _variant(name: str, art, runtime: str) -> VariantResult:
    return VariantResult(name=name, format=art.format.value, precision=art.precision,
                         runtime=RuntimeInfo(name=runtime, threads=1), size_bytes=art.path.stat().st_size,
                         sha256=art.sha256)


@pytest.fixture(scope="module")
def shipped(digits, tmp_path_factory):
    """The digits CNN as a TFLite file (NHWC inside, NCHW in the source) shipped to ship/, and the
    ONNX reference's outputs on the eval set."""
    pytest.importorskip("onnx2tf")
    from edgekit.convert.api import convert
    from edgekit.inputs.source import load_source, ort_reference_all

    tmp = tmp_path_factory.mktemp("ship")
    src = load_source(digits.pt2, workdir=tmp)
    onnx_art = convert(digits.pt2, to="onnx", out=tmp / "m.onnx", calib_data=digits.calib)
    tfl = convert(digits.pt2, to="tflite", out=tmp / "m.tflite", calib_data=digits.calib)
    write_ship(tmp / "out", _variant("tflite-fp32", tfl, "litert"), tfl, src.artifact.io)
    x = np.load(digits.eval)["x"]
    ref = ort_reference_all(onnx_art.path)([x])[0]
    return tmp, x, ref, src.artifact.io


def test_the_ship_contract_names_the_layout_and_a_moved_folder_runs_from_it_alone(shipped, tmp_path):
    tmp, x, ref, source_io = shipped
    face = json.loads((tmp / "out" / "ship" / "ship.json").read_text())["interface"]
    (i,), (o,) = face["inputs"], face["outputs"]
    # the file takes NHWC where the source took NCHW: the contract says so, with the source's names
    assert i["source_name"] == source_io.inputs[0].name and i["transpose"] == [0, 2, 3, 1] and i["shape"][1:] == [1, 8, 8]
    assert o["source_name"] == source_io.outputs[0].name and face["batch"] == 1
    moved = tmp_path / "elsewhere"
    shutil.copytree(tmp / "out" / "ship", moved)  # nothing outside the folder is needed
    ys = run_shipped(moved, {source_io.inputs[0].name: x})
    y = ys[source_io.outputs[0].name]
    assert y.shape == ref.shape and np.abs(y - ref).max() < 1e-3  # NCHW fed right, all 360 samples (batch 1 file)
    assert (y.argmax(1) == ref.argmax(1)).mean() == 1.0


def test_edgekit_run_writes_outputs_and_a_failed_run_keeps_the_old_file(cli, shipped, digits, tmp_path):
    tmp, x, ref, source_io = shipped
    out = tmp_path / "y.npz"
    r = cli("run", tmp / "out" / "ship", "--input", digits.eval, "--out", out)
    assert r.exit_code == 0, r.stderr
    with np.load(out) as z:
        assert np.abs(z[source_io.outputs[0].name] - ref).max() < 1e-3
    before = out.read_bytes()
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=x[:, :, :4, :])  # wrong spatial size
    r = cli("run", tmp / "out" / "ship", "--input", bad, "--out", out)
    assert r.exit_code == 2 and "litert could not run" in r.stderr and "interface" in r.stderr
    assert out.read_bytes() == before and not list(tmp_path.glob(".y.npz*"))
    r = cli("run", tmp / "out" / "ship", "--input", digits.eval, "--out", tmp_path / "y.txt")
    assert r.exit_code == 2 and ".npz" in r.stderr


def test_a_changed_file_missing_input_or_old_ship_json_is_refused(shipped, tmp_path):
    tmp, x, _, _ = shipped
    ship = tmp_path / "ship"
    shutil.copytree(tmp / "out" / "ship", ship)
    with pytest.raises(DataError, match="missing") as e:
        run_shipped(ship, {"image": x, "other": x})
    assert "x" in e.value.hint
    meta = json.loads((ship / "ship.json").read_text())
    model = ship / "tflite-fp32.tflite"
    model.write_bytes(model.read_bytes()[:-1] + b"\0")
    with pytest.raises(ModelLoadError, match="not the file that was measured"):
        run_shipped(ship, {"x": x})
    del meta["interface"]
    (ship / "ship.json").write_text(json.dumps(meta))
    with pytest.raises(BadInputError, match="no interface"):
        run_shipped(ship, {"x": x})


def test_a_core_ml_file_says_where_it_runs(tmp_path):
    (tmp_path / "runtime.json").write_text(json.dumps({"runtime": "coreml", "file": "m.mlpackage"}))
    with pytest.raises(BadInputError, match="Core ML model: it runs on coreml") as e:
        run_shipped(tmp_path, {"x": np.zeros((1, 3))})
    assert "device it was measured on" in e.value.hint


def test_a_new_ship_removes_the_old_model_only(shipped, digits, tmp_path):
    from edgekit.inputs.source import load_source

    tmp, *_ = shipped
    shutil.copytree(tmp / "out", tmp_path / "out")
    (tmp_path / "out" / "ship" / "NOTES.txt").write_text("the user's own file")
    src = load_source(digits.pt2, workdir=tmp_path)
    onnx_art = src.artifact if src.artifact.format.value == "onnx" else None
    from edgekit.convert.api import convert

    onnx_art = onnx_art or convert(digits.pt2, to="onnx", out=tmp_path / "m.onnx", calib_data=digits.calib)
    write_ship(tmp_path / "out", _variant("fp32", onnx_art, "onnxruntime"), onnx_art, src.artifact.io)
    names = sorted(p.name for p in (tmp_path / "out" / "ship").iterdir())
    assert names == ["NOTES.txt", "fp32.onnx", "runtime.json", "ship.json"], names
