"""`edgekit deploy --target pixel-arm64` end to end over the real adb client and the test adbd.

The "phone" is tests/integration/adbd.py: the real adb client and server talk the ADB wire protocol
to it over loopback, and it runs the device side (the Python agent, onnxruntime) on this host.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from adb_fixtures import adb_device, adb_env, needs_adb  # noqa: F401
from adbd import Faults

import edgekit
from edgekit.errors import TransportError
from edgekit.transport.adb import AdbTransport

pytestmark = needs_adb
FAKE_BM = Path(__file__).with_name("fake_benchmark_model.py")  # a FAKE benchmark_model: see its docstring


def _transport(d) -> AdbTransport:
    # the daemon runs commands on this host: the device's Python is the one with the runtimes
    return AdbTransport(tcp=f"127.0.0.1:{d.port}", workdir=str(d.root / "data/local/tmp/edgekit"),
                        python=sys.executable, boot_timeout=20)


def test_small_deploy_over_adb(adb_device, digits, tmp_path):
    """The default run's real ADB deploy: the real adb client and server, the pixel-arm64 target, and a recipe
    that keeps onnxruntime variants (its convert step is to ONNX), so no TFLite conversion: seconds, not minutes."""
    adb_device.set_prop("ro.product.model", "Pixel 7")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("variants:\n  - name: int8-static\n"
                      "    passes: [{convert: {to: onnx}}, {quantize: {mode: static}}]\n")
    with _transport(adb_device) as t:
        report = edgekit.deploy(digits.pt2, target="pixel-arm64", eval_data=digits.eval, calib_data=digits.calib,
                                recipe=recipe, out=tmp_path / "out", transport=t, runs=5, min_seconds=0.0, warmup=1)
        sent = t.bytes_sent
    assert [(v.name, v.format) for v in report.variants] == [("fp32", "onnx"), ("int8-static", "onnx")]
    for v in report.variants:
        assert v.latency_ms.runs >= 5 and v.latency_ms.p50 > 0
        assert v.accuracy is not None and v.accuracy.n == 360 and v.accuracy.value > 90, v.name
    assert report.target == "pixel-arm64" and report.device["transport"] == "adb"
    assert report.device["android"]["model"] == "Pixel 7"
    # both models went to the phone's workdir through adb push, stored by their hash
    files = adb_device.root / "data/local/tmp/edgekit/files"
    assert {f"{v.sha256}.onnx" for v in report.variants} <= {p.name for p in files.iterdir()}
    assert sent >= sum(v.size_bytes for v in report.variants)
    assert report.gate.passed, [c.message for c in report.gate.failed_checks]


@pytest.mark.slow  # the deploy converts to TFLite first (> 20 s here)
def test_deploy_digits_over_adb(adb_device, digits, tmp_path):
    adb_device.set_prop("ro.product.model", "Pixel 7")
    adb_device.set_prop("ro.board.platform", "gs201")
    with _transport(adb_device) as t:
        report = edgekit.deploy(digits.pt2, target="pixel-arm64", eval_data=digits.eval, calib_data=digits.calib,
                                out=tmp_path / "out", transport=t, runs=20, min_seconds=0.1, warmup=2,
                                benchmark_binary=FAKE_BM, search=False)  # the target's fixed default variants
        sent_first = t.bytes_sent
    names = [v.name for v in report.variants]
    assert len(names) >= 2 and len(set(names)) == len(names)
    for v in report.variants:
        assert v.accuracy is not None and v.accuracy.n > 0 and v.accuracy.value > 80
        assert v.latency_ms.runs >= 20 and v.latency_ms.p50 > 0
        assert v.parity is not None
    assert report.target == "pixel-arm64"
    # .tflite variants also carry benchmark_model's figures (here the fake's replayed real output);
    # latency, accuracy and parity in the variant itself stay the Python agent's
    tfl = [v for v in report.variants if v.format == "tflite"]
    assert tfl, "pixel-arm64 prefers litert: deploy should have built TFLite variants"
    for v in report.variants:
        bm = getattr(v, "benchmark_model", None)
        if v.format == "tflite":
            assert bm["measured_by"] == "benchmark_model" and bm["load_ms"] == pytest.approx(5.579)
        else:
            assert bm is None
    dev = report.device
    assert dev["transport"] == "adb"
    assert dev["android"]["model"] == "Pixel 7" and dev["android"]["soc"] == "gs201"
    assert dev["android"]["android_version"] == "14"
    on_disk = json.loads((tmp_path / "out" / "report.json").read_text())
    assert on_disk["device"]["android"]["model"] == "Pixel 7"
    assert sent_first > 0
    # the bundle is content-addressed: a second deploy re-sends only its requests
    with _transport(adb_device) as t:
        edgekit.deploy(digits.pt2, target="pixel-arm64", eval_data=digits.eval, calib_data=digits.calib,
                       out=tmp_path / "out2", transport=t, runs=5, min_seconds=0.0, warmup=0, search=False)
        assert t.bytes_sent < sent_first / 4


@pytest.mark.slow
def test_deploy_dropped_mid_push_is_exit_3_and_writes_no_report(adb_env, digits, tmp_path):
    d = adb_env.device(tmp_path / "root", faults=Faults(drop_mid_push=True, drop_after_bytes=20_000))
    out = tmp_path / "out"
    try:
        t = _transport(d)
        with pytest.raises(TransportError) as ei:
            edgekit.deploy(digits.pt2, target="pixel-arm64", eval_data=digits.eval, out=out, transport=t)
        t.close()
        assert ei.value.exit_code == 3
        assert "failed" in str(ei.value) and "check the cable" in ei.value.hint
        assert not (out / "report.json").exists()
    finally:
        adb_env.adb("disconnect", f"127.0.0.1:{d.port}")
        d.stop()
