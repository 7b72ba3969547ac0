"""Measurement cache: keys, validity, damaged entries, and reuse through the real deploy loop
(local device, real agent subprocess, real onnxruntime) with --remeasure."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np

from edgekit.measure.cache import MeasureCache, device_identity, measurement_key
from edgekit.report.model import Report

REQ = {"protocol": 2, "variant": "fp32", "model": "files/abc.onnx", "model_sha256": "abc", "runtime": "onnxruntime",
       "threads": 1, "warmup": 10, "runs": 50, "min_seconds": 1.0, "energy": {"sources": ["rapl"]}}
PROBE = {"agent_version": "0.1.0", "device": {"hostname": "pi", "machine_id": "m1", "cpu": "Cortex-A72",
                                              "arch": "aarch64", "cores": 4, "os": "linux", "os_release": "6.6"}}


def _key(req=REQ, version="1.23", probe=PROBE, name="lab-pi", agent=None):
    return measurement_key(req, runtime_version=version, identity=device_identity(probe, name, "ssh"),
                           agent=agent or {"version": "0.1.0", "sha256": "s1"})


def test_key_covers_model_runtime_threads_settings_device_and_agent():
    base = _key()
    assert _key(dict(REQ, variant="other-name")) == base  # a name is not a measurement setting
    changed = [
        _key(dict(REQ, model_sha256="def")),
        _key(version="1.24"),
        _key(dict(REQ, threads=4)),
        _key(dict(REQ, min_seconds=2.0)),
        _key(dict(REQ, warmup_mode="auto")),
        _key(probe={**PROBE, "device": {**PROBE["device"], "machine_id": "m2"}}),
        _key(name="other-pi"),
        _key(agent={"version": "0.1.0", "sha256": "s2"}),
    ]
    assert base not in changed and len(set(changed)) == len(changed)


def test_cache_round_trip_expiry_and_damage(tmp_path):
    c = MeasureCache(root=tmp_path, max_age_s=3600)
    doc = {"ok": True, "latency_ms": {"raw": [1.0, 2.0]}}
    c.put("ab" * 32, doc, [np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(2)])
    hit = c.get("ab" * 32)
    assert hit.doc == doc and [o.shape for o in hit.outputs] == [(2, 3), (2,)]
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2)
    assert c.get("ab" * 32, now=later) is None  # past its validity
    assert c.get("cd" * 32) is None
    (tmp_path / "ab" / ("ab" * 32) / "doc.json").write_text("{not json")
    assert c.get("ab" * 32) is None  # damaged: a miss, never trusted
    assert not [p for p in tmp_path.rglob(".*") if p.name.startswith(".")]  # no temp folders left


def test_deploy_reuses_measurements_until_remeasure(cli, digits, tmp_path, monkeypatch):
    monkeypatch.delenv("EDGEKIT_NO_MEASURE_CACHE", raising=False)
    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path / "home"))
    args = ["deploy", digits.pt2, "--target", "local", "--eval-data", digits.eval, "--runs", "5",
            "--min-seconds", "0.02", "--warmup", "2"]
    r1 = cli(*args, "--out", tmp_path / "a")
    assert r1.exit_code == 0, r1.stderr
    a = Report.load(tmp_path / "a" / "report.json")
    assert a.variants[0].measurement["reused"] is False
    # this machine has no energy sensor: null, with each source's reason
    assert a.variants[0].energy_mj_per_inference is None and "rapl" in a.variants[0].energy_reason

    r2 = cli(*args, "--out", tmp_path / "b")
    assert r2.exit_code == 0, r2.stderr
    b = Report.load(tmp_path / "b" / "report.json")
    vb = b.variants[0]
    assert vb.measurement["reused"] is True and vb.measurement["measured_at"]
    assert vb.latency_ms.raw == a.variants[0].latency_ms.raw and vb.accuracy.value == a.variants[0].accuracy.value
    assert any("reused from the measurement cache" in w and "--remeasure" in w for w in b.warnings)
    assert vb.parity is not None  # the cached eval outputs still give parity

    r3 = cli(*args, "--out", tmp_path / "c", "--remeasure")
    assert r3.exit_code == 0, r3.stderr
    c = Report.load(tmp_path / "c" / "report.json")
    assert c.variants[0].measurement["reused"] is False and c.variants[0].measurement.get("remeasured")
    assert c.variants[0].latency_ms.raw != a.variants[0].latency_ms.raw
    assert not any("measurement cache" in w for w in c.warnings)
    assert json.loads((tmp_path / "c" / "report.json").read_text())["variants"][0]["measurement"]["cache_key"]


def test_a_result_measured_on_a_busy_device_is_not_stored(tmp_path, monkeypatch):
    """A figure measured while other processes took the device's CPU carries that contention: a later run (perhaps
    on a quiet device) measures its own instead of inheriting it. A quiet result is stored and reused."""
    import types

    from edgekit.agent.inprocess import load_agent
    from edgekit.agent.protocol import AgentResult
    from edgekit.measure.cache import DeviceMeasurements
    from edgekit.measure.stats import BUSY_OTHER_CPU

    # the host's threshold is the agent's: the device says "busy" where the host stops caching
    assert load_agent().device.BUSY_OTHER_CPU == BUSY_OTHER_CPU
    deployer = types.SimpleNamespace(t=types.SimpleNamespace(kind="ssh"))
    m = DeviceMeasurements(deployer, device_name="lab-pi", cache=MeasureCache(root=tmp_path), remeasure=False)
    monkeypatch.setattr(m, "probe_doc", lambda: {**PROBE, "runtimes": {"onnxruntime": "1.23"}})
    runs: list[float] = []

    def measured(share):
        def run():
            runs.append(share)
            return AgentResult(variant="fp32", doc={"ok": True, "latency_ms": {"raw": [float(len(runs))]},
                                                     "device_state": {"other_cpu_fraction": share}}, outputs=None)
        return run

    req = types.SimpleNamespace(variant="fp32", runtime="onnxruntime", wire=lambda: dict(REQ))
    busy = m.measure(req, measured(0.6))
    assert busy.doc["latency_ms"]["raw"] == [1.0]
    assert m.info["fp32"]["reused"] is False and "busy device (other processes used 60%" in m.info["fp32"]["cache"]
    quiet = m.measure(req, measured(0.02))  # the busy figure was not kept: measured again
    assert runs == [0.6, 0.02] and quiet.doc["latency_ms"]["raw"] == [2.0] and m.info["fp32"].get("cache_key")
    again = m.measure(req, measured(0.02))  # the quiet one was: reused
    assert runs == [0.6, 0.02] and again.doc["latency_ms"]["raw"] == [2.0] and m.info["fp32"]["reused"] is True
