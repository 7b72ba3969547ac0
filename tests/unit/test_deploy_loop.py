"""Issue #2: the closed loop on `local` and every bad input it must refuse (exit 2, nothing lost)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from edgekit.report.model import Report

FAST = ("--runs", "10", "--min-seconds", "0", "--warmup", "1", "--no-search")  # the fixed default variants


def _deploy(cli, digits, out, *extra):
    return cli("deploy", digits.pt2, "--target", "local", "--eval-data", digits.eval, "--calib-data", digits.calib,
               "--out", out, *FAST, *extra)


@pytest.fixture(scope="module")
def good_report(digits, tmp_path_factory):
    """One real deploy whose report the bad-input tests must leave untouched."""
    from edgekit.cli.main import main

    out = tmp_path_factory.mktemp("good")
    assert main(["deploy", str(digits.pt2), "--eval-data", str(digits.eval), "--calib-data", str(digits.calib),
                 "--out", str(out), *FAST]) == 0
    return out


def _unchanged(out, before: bytes):
    assert (out / "report.json").read_bytes() == before
    assert not [p for p in out.iterdir() if p.name.startswith(".report")], "temp files left behind"


def test_report_has_contract_fields(good_report):
    doc = json.loads((good_report / "report.json").read_text())
    for key in ("schema_version", "edgekit_version", "created_at", "target", "device", "baseline", "variants", "gate"):
        assert key in doc
    for key in ("name", "arch", "os", "cpu", "cores", "governor", "temperature_c"):
        assert key in doc["device"]
    v = doc["variants"][1]
    for key in ("name", "format", "runtime", "size_bytes", "sha256", "lineage", "load_ms", "latency_ms",
                "peak_memory_mb", "energy_mj_per_inference", "energy_source", "accuracy", "accuracy_drop",
                "parity", "selected"):
        assert key in v, key
    lat = v["latency_ms"]
    assert len(lat["raw"]) == lat["runs"] and lat["p50"] <= lat["p90"] <= lat["p99"]
    assert lat["ci95"][0] <= lat["p50"] <= lat["ci95"][1]
    # energy cannot be measured on this machine: null with a reason, never a number
    assert v["energy_mj_per_inference"] is None and v["energy_reason"]
    # the export hop's parity is in the lineage
    hops = [s for s in v["lineage"] if s["name"] == "torch->onnx"]
    assert hops and hops[0]["metrics"]["parity"]["cosine"] > 0.9999
    assert v["lineage"][-1]["name"] == "quantize" and v["precision"] == "int8"
    assert v["size_bytes"] < doc["variants"][0]["size_bytes"] / 2  # int8 weights


def test_impossible_latency_budget_fails_gate(cli, digits, tmp_path):
    r = _deploy(cli, digits, tmp_path, "--latency-budget-ms", "0.00001")
    assert r.exit_code == 1
    rep = Report.load(tmp_path / "report.json")
    assert not rep.gate.passed
    failed = rep.gate.failed_checks
    assert failed and failed[0].name == "latency_p50_budget" and failed[0].variant == "int8-static"
    assert "latency_p50_budget" in r.stdout


def test_accuracy_drop_gate_fails_on_a_broken_variant(cli, digits, tmp_path):
    # a recipe whose INT8 variant is calibrated on garbage: the device measures the damage, the gate fails it
    bad_calib = tmp_path / "bad_calib.npz"
    np.savez(bad_calib, x=np.full((8, 1, 8, 8), 1e-4, dtype=np.float32))
    r = cli("deploy", digits.pt2, "--eval-data", digits.eval, "--calib-data", bad_calib, "--out", tmp_path / "o",
            "--max-accuracy-drop", "0.5", *FAST)
    rep = Report.load(tmp_path / "o" / "report.json")
    int8 = rep.variant("int8-static")
    assert int8.accuracy_drop > 0.5
    assert r.exit_code == 1
    assert any(c.name == "accuracy_drop" and not c.passed for c in rep.gate.checks)


def test_onnx_input_and_dynamic_recipe(cli, digits, good_report, tmp_path):
    onnx_path = good_report / "artifacts" / "fp32.onnx"
    recipe = tmp_path / "r.yaml"
    recipe.write_text("variants:\n  - name: dyn\n    passes:\n      - quantize: {mode: dynamic}\n")
    r = cli("deploy", onnx_path, "--eval-data", digits.eval, "--recipe", recipe, "--out", tmp_path / "o", *FAST)
    assert r.exit_code == 0, r.stderr
    rep = Report.load(tmp_path / "o" / "report.json")
    assert [v.name for v in rep.variants] == ["fp32", "dyn"]
    assert rep.variant("fp32").parity.reference == "onnx (source)"


def test_state_dict_with_arch(cli, digits, tmp_path):
    arch = f"{os.path.join(os.path.dirname(__file__), '..', '..', 'examples', 'digits', 'model.py')}:DigitsCNN"
    r = cli("deploy", digits.pth, "--arch", arch, "--eval-data", digits.eval, "--out", tmp_path, *FAST)
    assert r.exit_code == 0, r.stderr
    assert Report.load(tmp_path / "report.json").variant("fp32").accuracy.value > 90


def test_python_api_with_module(digits, tmp_path):
    import torch
    from model import DigitsCNN  # examples/digits/model.py (pyproject.toml: pytest's pythonpath)

    import edgekit

    model = DigitsCNN(8)
    rep = edgekit.deploy(model, example_inputs=(torch.zeros(1, 1, 8, 8),), eval_data=digits.eval, out=tmp_path,
                         runs=5, min_seconds=0.0, warmup=0, search=False)
    assert isinstance(rep, edgekit.Report)
    assert rep.variant("int8-dynamic").latency_ms.runs >= 5
    # the gate judged the compressed variant against the fp32 baseline: its accuracy check carries the drop
    # the report shows, its verdict follows the 1-point default tolerance, and the gate is the AND of its checks
    fp32, dyn = rep.variant("fp32"), rep.variant("int8-dynamic")
    acc = [c for c in rep.gate.checks if c.name == "accuracy_drop"]
    assert [c.variant for c in acc] == ["int8-dynamic"], [c.model_dump() for c in rep.gate.checks]
    assert acc[0].value == pytest.approx(fp32.accuracy.value - dyn.accuracy.value, abs=1e-6) == dyn.accuracy_drop
    assert acc[0].limit == 1.0 and acc[0].passed == (acc[0].value <= 1.0 + 1e-9)
    assert rep.gate.passed == all(c.passed for c in rep.gate.checks)
    assert Report.load(tmp_path / "report.json").gate == rep.gate
    with pytest.raises(TypeError):
        edgekit.deploy(model, eval_data=digits.eval, not_an_option=1)


# --- bad input: exit 2, clear message, the earlier report untouched -------------------------------
def _bad(cli, digits, out, *args, model=None):
    before = (out / "report.json").read_bytes()
    r = cli("deploy", model or digits.pt2, "--eval-data", digits.eval, "--out", out, *FAST, *args)
    _unchanged(out, before)
    return r


def test_missing_model(cli, digits, good_report, tmp_path):
    r = _bad(cli, digits, good_report, model=tmp_path / "nope.pt2")
    assert r.exit_code == 2 and "not found" in r.stderr


def test_corrupt_pt2(cli, digits, good_report, tmp_path):
    bad = tmp_path / "model.pt2"
    bad.write_bytes(b"PK\x03\x04 definitely not a zip")
    r = _bad(cli, digits, good_report, model=bad)
    assert r.exit_code == 2 and "torch.export program" in r.stderr and "hint" in r.stderr


def test_onnx_that_does_not_load(cli, digits, good_report, tmp_path):
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"\x08\x07garbage")
    r = _bad(cli, digits, good_report, model=bad)
    assert r.exit_code == 2 and "not a valid ONNX model" in r.stderr


def test_pickle_without_arch_refused(cli, digits, good_report):
    r = _bad(cli, digits, good_report, model=digits.pth)
    assert r.exit_code == 2 and "weights_only=True" in r.stderr and "--arch" in r.stderr


def test_arbitrary_pickle_refused(cli, digits, good_report, tmp_path):
    import torch

    evil = tmp_path / "evil.pt"
    torch.save({"obj": object()}, evil)  # not loadable with weights_only=True
    arch = f"{os.path.join(os.path.dirname(__file__), '..', '..', 'examples', 'digits', 'model.py')}:DigitsCNN"
    r = _bad(cli, digits, good_report, "--arch", arch, model=evil)
    assert r.exit_code == 2 and "weights_only=True" in r.stderr


def test_unknown_suffix(cli, digits, good_report, tmp_path):
    f = tmp_path / "model.h5"
    f.write_bytes(b"x")
    r = _bad(cli, digits, good_report, model=f)
    assert r.exit_code == 2 and "unknown model format" in r.stderr


def test_eval_shape_mismatch(cli, digits, good_report, tmp_path):
    before = (good_report / "report.json").read_bytes()
    ev = tmp_path / "eval.npz"
    np.savez(ev, x=np.zeros((10, 1, 9, 9), np.float32), y=np.zeros(10, np.int64))
    r = cli("deploy", digits.pt2, "--eval-data", ev, "--out", good_report, *FAST)
    _unchanged(good_report, before)
    assert r.exit_code == 2 and "shape (1, 9, 9)" in r.stderr and "(1, 8, 8)" in r.stderr


def test_eval_dtype_mismatch(cli, digits, good_report, tmp_path):
    before = (good_report / "report.json").read_bytes()
    ev = tmp_path / "eval.npz"
    np.savez(ev, x=np.zeros((10, 1, 8, 8), np.int32), y=np.zeros(10, np.int64))
    r = cli("deploy", digits.pt2, "--eval-data", ev, "--out", good_report, *FAST)
    _unchanged(good_report, before)
    assert r.exit_code == 2 and "dtype int32" in r.stderr


def test_eval_missing_key(cli, digits, good_report, tmp_path):
    before = (good_report / "report.json").read_bytes()
    ev = tmp_path / "eval.npz"
    np.savez(ev, inputs=np.zeros((10, 1, 8, 8), np.float32), y=np.zeros(10, np.int64))
    r = cli("deploy", digits.pt2, "--eval-data", ev, "--out", good_report, *FAST)
    _unchanged(good_report, before)
    assert r.exit_code == 2 and "no array named 'x'" in r.stderr and "--x-key" in r.stderr and "inputs" in r.stderr
    r2 = cli("deploy", digits.pt2, "--eval-data", ev, "--x-key", "inputs", "--out", tmp_path / "o", *FAST)
    assert r2.exit_code == 0, r2.stderr


def test_eval_without_labels(cli, digits, good_report, tmp_path):
    ev = tmp_path / "eval.npz"
    np.savez(ev, x=np.zeros((10, 1, 8, 8), np.float32))
    r = _bad(cli, digits, good_report, "--eval-data", ev)
    assert r.exit_code == 2 and "labels" in r.stderr


def test_unknown_target(cli, digits, good_report):
    r = _bad(cli, digits, good_report, "--target", "toaster")
    assert r.exit_code == 2 and "unknown target 'toaster'" in r.stderr and "rpi4" in r.stderr


def test_remote_target_needs_device(cli, digits, good_report):
    r = _bad(cli, digits, good_report, "--target", "jetson-orin-nano")
    assert r.exit_code == 2 and "--device" in r.stderr


def test_unknown_recipe_key(cli, digits, good_report, tmp_path):
    rec = tmp_path / "r.yaml"
    rec.write_text("variants: []\nmeasur: {runs: 3}\n")
    r = _bad(cli, digits, good_report, "--recipe", rec)
    assert r.exit_code == 2 and "measur" in r.stderr and "unknown key" in r.stderr and str(rec) in r.stderr


def test_unknown_pass_in_recipe(cli, digits, good_report, tmp_path):
    rec = tmp_path / "r.yaml"
    rec.write_text("variants:\n  - name: a\n    passes: [{quantise: {}}]\n")
    r = _bad(cli, digits, good_report, "--recipe", rec)
    assert r.exit_code == 2 and "unknown pass 'quantise'" in r.stderr and "quantize" in r.stderr


def test_bad_pass_config_value(cli, digits, good_report, tmp_path):
    rec = tmp_path / "r.yaml"
    rec.write_text("variants:\n  - name: a\n    passes: [{quantize: {mode: half}}]\n")
    r = _bad(cli, digits, good_report, "--recipe", rec)
    assert r.exit_code == 2 and "mode" in r.stderr and "static" in r.stderr


def test_accuracy_drop_out_of_range(cli, digits, good_report):
    r = _bad(cli, digits, good_report, "--max-accuracy-drop", "-1")
    assert r.exit_code == 2 and "max_accuracy_drop" in r.stderr


def test_unwritable_output(cli, digits, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    r = cli("deploy", digits.pt2, "--eval-data", digits.eval, "--out", f / "sub", *FAST)
    assert r.exit_code == 2 and ("not writable" in r.stderr or "not a folder" in r.stderr), (r.exit_code, r.stderr)
    if os.geteuid() != 0:  # root ignores permission bits
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        r = cli("deploy", digits.pt2, "--eval-data", digits.eval, "--out", ro, *FAST)
        assert r.exit_code == 2 and "not writable" in r.stderr


def test_report_show(cli, good_report):
    r = cli("report", "show", good_report / "report.json")
    assert r.exit_code == 0 and "int8-static" in r.stdout and "PASSED" in r.stdout


def test_report_of_other_major_version_refused(cli, good_report, tmp_path):
    doc = json.loads((good_report / "report.json").read_text())
    doc["schema_version"] = "9.0"
    p = tmp_path / "report.json"
    p.write_text(json.dumps(doc))
    r = cli("report", "show", p)
    assert r.exit_code == 2 and "schema 9.0" in r.stderr


def test_help_does_not_import_heavy_frameworks():
    code = ("import sys; from edgekit.cli.main import main; "
            "rc = main(['--help']); "
            "heavy = [m for m in ('torch', 'tensorflow', 'onnxruntime', 'onnx') if m in sys.modules]; "
            "print('HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "HEAVY []" in out


def test_every_command_help_has_an_example(cli):
    from edgekit.cli.main import app

    import typer.main

    group = typer.main.get_command(app)
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            for sub_name, sub in cmd.commands.items():
                assert "Example" in (sub.help or ""), f"edgekit {name} {sub_name} --help has no example"
        else:
            assert "Example" in (cmd.help or ""), f"edgekit {name} --help has no example"
