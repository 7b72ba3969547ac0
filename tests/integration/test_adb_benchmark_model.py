"""The benchmark_model mode over the real adb client and the test adbd.

No real TFLite benchmark_model binary can run on this host (the user supplies it; edgekit never
downloads one), so the binary here is tests/integration/fake_benchmark_model.py, a FAKE that checks
its arguments and replays a real published output of the tool. What is real: the adb transport,
pushing the binary by content with on-device verification, chmod, taskset pinning, the argv the
real tool takes, and parsing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from adb_fixtures import adb_device, adb_env, needs_adb  # noqa: F401

from edgekit.agent.benchmark_model import run_benchmark_model
from edgekit.errors import AgentError, BadInputError
from edgekit.transport.adb import AdbTransport

pytestmark = needs_adb
FAKE = Path(__file__).with_name("fake_benchmark_model.py")


def _transport(d, **kw) -> AdbTransport:
    return AdbTransport(tcp=f"127.0.0.1:{d.port}", workdir=str(d.root / "data/local/tmp/edgekit"),
                        python=sys.executable, boot_timeout=20, **kw)


def _model_on_device(t, tmp_path) -> str:
    m = tmp_path / "m.tflite"
    m.write_bytes(b"\x1c\x00\x00\x00TFL3" + bytes(64))  # the flatbuffer identifier the fake checks
    t.push(m, "files/m.tflite")
    return "files/m.tflite"


def test_push_run_parse_and_pin(adb_device, tmp_path):
    with _transport(adb_device, pin_mask="1") as t:
        model = _model_on_device(t, tmp_path)
        r = run_benchmark_model(t, model, binary=FAKE, threads=2, warmup=3, runs=20, min_seconds=0.5)
        sent = t.bytes_sent
        # the real output the fake replays: init 5.579 ms, 50 runs, median 1239.807 ms
        rep = r.to_report()
        assert rep["measured_by"] == "benchmark_model"
        assert rep["load_ms"] == pytest.approx(5.579) and rep["latency_ms"]["p50"] == pytest.approx(1239.807)
        assert rep["peak_memory_mb"] is None and "peak_memory_mb" in rep["unavailable"]
        rec = json.loads((adb_device.root / "data/local/tmp/edgekit/files/fake_benchmark_model.args.json").read_text())
        assert rec["affinity"] == [0]  # taskset 1 = cpu 0
        assert "--num_threads=2" in rec["argv"] and "--warmup_runs=3" in rec["argv"]
        assert "--num_runs=20" in rec["argv"] and "--min_secs=0.5" in rec["argv"]
        # the binary is content-addressed on the device: a second run pushes nothing
        run_benchmark_model(t, model, binary=FAKE)
        assert t.bytes_sent == sent


def test_failure_and_missing_binary(adb_device, tmp_path):
    with _transport(adb_device) as t:
        model = _model_on_device(t, tmp_path)
        (adb_device.root / "data/local/tmp/edgekit/files/EDGEKIT_FAKE_BM_FAIL").write_text("")
        with pytest.raises(AgentError, match="ANEURALNETWORKS_OP_FAILED") as ei:
            run_benchmark_model(t, model, binary=FAKE)
        assert ei.value.exit_code == 3
        with pytest.raises(BadInputError, match="no benchmark_model on the device") as ei:
            run_benchmark_model(t, model, binary=None)
        assert "never downloads" in ei.value.hint
        with pytest.raises(BadInputError, match=r"runs \.tflite models"):
            run_benchmark_model(t, "files/m.onnx", binary=FAKE)
