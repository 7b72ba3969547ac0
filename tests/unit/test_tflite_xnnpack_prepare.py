"""A .tflite file XNNPACK refuses at prepare (issue #25: "failed to prepare" on full-integer INT8 files) is not a
crash: the host's LiteRT probe retries it on LiteRT's built-in kernels, as the device's agent does (and says),
so the file is judged on what it computes (its parity), not dropped as a converter crash."""

from __future__ import annotations

import pytest

from tests.unit.test_search_float_fallback import _linear

pytest.importorskip("onnx2tf", reason="the tflite extra (onnx2tf) is part of the default install")


def test_an_int8_file_xnnpack_cannot_prepare_is_run_on_the_builtin_kernels_not_called_a_crash(cli, tmp_path):
    # the outlier weights and inputs give requantization scales XNNPACK's INT8 kernels refuse ("Node number 3
    # (TfLiteXNNPackDelegate) failed to prepare"); LiteRT's own kernels run the file, and INT8 has lost the model
    _linear(tmp_path, outlier=True)
    r = cli("convert", tmp_path / "m.onnx", "--to", "tflite", "--precision", "int8", "--calib-data",
            tmp_path / "calib.npz", "--out", tmp_path / "m.tflite")
    assert r.exit_code == 2, r.stdout + r.stderr
    assert "crashes loading or running" not in r.stderr, r.stderr
    assert "parity" in r.stderr and "cosine" in r.stderr, r.stderr  # judged on its outputs
    assert not (tmp_path / "m.tflite").exists()

