"""The one device stage (edgekit/devices/session.py) on the local device: real agent subprocess,
real onnxruntime. A variant the agent cannot run is a typed MeasureFailure and the session goes
on; a broken device raises; A/B blocks alternate and never come from the measurement cache."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.agent.protocol import AgentRequest
from edgekit.artifact import Artifact
from edgekit.devices.session import DeviceSession, Measured, MeasureFailure, RunSettings
from edgekit.errors import DeviceError
from edgekit.formats import Format
from edgekit.inputs.data import load_npz
from edgekit.inputs.source import load_source
from edgekit.inputs.targets import MeasureDefaults, load_target
from edgekit.metrics import MetricSpec
from edgekit.metrics.evaluate import eval_plan
from tests.unit.agent_loader import tiny_onnx

FAST = RunSettings(measure=MeasureDefaults(warmup=2, runs=10, min_seconds=0.0, max_runs=10))


@pytest.fixture
def setup(tmp_path):
    model = tiny_onnx(tmp_path / "tiny.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "eval.npz", x=rng.standard_normal((16, 64)).astype(np.float32), y=rng.integers(0, 64, 16))
    src = load_source(model, workdir=tmp_path)
    ds = load_npz(tmp_path / "eval.npz", x_key="x", y_key="y", require_labels=False, role="eval")
    plan = eval_plan(MetricSpec(), src, ds)
    return src, ds, plan, tmp_path


def _broken(tmp_path, like: Artifact) -> Artifact:
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"this is not an onnx model")
    return Artifact.from_file(bad, Format.ONNX, like.io)


def test_a_bad_variant_is_a_typed_failure_and_the_session_goes_on(setup):
    src, ds, plan, tmp = setup
    with DeviceSession(load_target("local"), None, source_io=src.artifact.io, plan=plan) as s:
        s.use_eval(ds, tmp)
        bad = s.measure("broken", _broken(tmp, src.artifact), FAST)
        good = s.measure("fp32", src.artifact, FAST)
    assert isinstance(bad, MeasureFailure)
    assert bad.kind == "model_load_failed" and "broken" in bad.message
    err = bad.error(["a"], ["b"])
    assert err.exit_code == 3 and "not measured: b" in err.message
    assert isinstance(good, Measured) and good.result.accuracy is not None and good.result.accuracy.n == 16
    assert len(good.result.latency_ms.raw) == 10
    assert s.facts_before is None  # the local transport has no platform facts (adb has)


def test_a_broken_device_raises_instead_of_blaming_the_variant(setup):
    from edgekit.transport.local import LocalTransport

    src, ds, plan, tmp = setup
    t = LocalTransport(str(tmp / "dev"))
    t.python = str(tmp / "no-such-python")  # the device cannot start the agent at all
    with pytest.raises(DeviceError) as e:
        with DeviceSession(load_target("local"), None, source_io=src.artifact.io, plan=plan, transport=t) as s:
            s.measure("fp32", src.artifact, FAST)
    assert e.value.exit_code == 3 and not getattr(e.value, "variant_fault", False)


def test_the_request_is_typed_and_carries_every_measure_option(setup):
    from edgekit.agent.protocol import MeasureOptions

    src, ds, plan, tmp = setup
    opts = MeasureOptions(warmup_mode="auto", sustained_seconds=3.0, energy_command=("meter", "--j"), max_seconds=5)
    with DeviceSession(load_target("local"), None, source_io=src.artifact.io, plan=plan) as s:
        s.use_eval(ds, tmp)
        req = s.request("v", src.artifact, FAST.but(options=opts))
    assert isinstance(req, AgentRequest)
    w = req.wire()
    assert w["warmup_mode"] == "auto" and w["sustained"]["seconds"] == 3.0
    assert w["energy"]["external_command"] == ["meter", "--j"] and "external_command" in w["energy"]["sources"]
    assert w["max_seconds"] == 5.0 and req.timeout_s > 5.0 and w["eval"]["x_keys"] == ["x"]
    with pytest.raises(Exception):
        AgentRequest.model_validate({**w, "no_such_field": 1})  # built once, validated strictly


def test_ab_blocks_alternate_and_bypass_the_measurement_cache(setup, monkeypatch, tmp_path):
    monkeypatch.delenv("EDGEKIT_NO_MEASURE_CACHE", raising=False)
    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path / "home"))
    src, ds, plan, tmp = setup
    other = Artifact.from_file(tiny_onnx(tmp / "other.onnx", n=64), Format.ONNX, src.artifact.io)
    with DeviceSession(load_target("local"), None, source_io=src.artifact.io, plan=plan) as s:
        blocks = s.measure_ab(src.artifact, other, FAST, blocks=4)
        again = s.measure_ab(src.artifact, other, FAST, blocks=2)
    assert blocks.order == list("abbaabba") and len(blocks.a) == 4 and len(blocks.b) == 4
    assert all(len(b) >= 10 for b in blocks.a + blocks.b)
    # fresh timings every time, never the cache's
    assert again.a[0] != blocks.a[0]
    assert not any(i.get("reused") for i in s.measurements.info.values())
