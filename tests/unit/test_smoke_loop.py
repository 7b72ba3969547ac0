"""The closed loop end to end on `local`, with the real agent subprocess and real onnxruntime."""

import json

from edgekit.report.model import Report


def test_deploy_digits_local_passes(cli, digits, tmp_path):
    out = tmp_path / "out"
    r = cli("deploy", digits.pt2, "--target", "local", "--eval-data", digits.eval, "--calib-data", digits.calib,
            "--out", out, "--runs", "20", "--min-seconds", "0.1", "--warmup", "2")
    assert r.exit_code == 0, r.stderr
    rep = Report.load(out / "report.json")
    assert [v.name for v in rep.variants] == ["fp32", "int8-static"]
    fp32, int8 = rep.variants
    assert fp32.accuracy.value > 90 and int8.accuracy.n == 360
    assert int8.latency_ms.runs >= 20 and int8.latency_ms.p50 > 0
    assert fp32.parity.top1_agreement == 1.0 and fp32.parity.max_abs_err < 1e-3
    assert rep.gate.passed and (out / "report.md").read_text().startswith("# edgekit report")
    assert json.loads((out / "report.json").read_text())["schema_version"].startswith("1.")
