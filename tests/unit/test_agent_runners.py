"""The agent's Runner contract: one RUNNERS dict from which --probe's runtimes and request dispatch
both come, a base that does the construction bookkeeping, and subclasses that only probe/load/run."""

import json

import numpy as np
import pytest

from agent_loader import load_agent, tiny_onnx, tiny_request


@pytest.fixture
def agent():
    return load_agent()


def test_runners_is_the_single_list(agent):
    assert {"onnxruntime", "litert"} <= set(agent.RUNNERS)
    for name, cls in agent.RUNNERS.items():
        assert issubclass(cls, agent.Runner) and cls.name == name
        assert cls.probe is not agent.Runner.probe and cls.load is not agent.Runner.load


def test_available_runtimes_is_derived_from_runners(agent, monkeypatch):
    class Fake(agent.Runner):
        name = "fake-rt"

        @classmethod
        def probe(cls):
            return "fake 1.0", None

    class Missing(agent.Runner):
        name = "missing-rt"

        @classmethod
        def probe(cls):
            return None, "not installed"

    monkeypatch.setitem(agent.RUNNERS, "fake-rt", Fake)
    monkeypatch.setitem(agent.RUNNERS, "missing-rt", Missing)
    found = agent.available_runtimes()
    assert found["fake-rt"] == "fake 1.0" and "missing-rt" not in found
    import onnxruntime

    assert found["onnxruntime"] == onnxruntime.__version__
    assert agent.probe()["runtimes"]["fake-rt"] == "fake 1.0"


def test_probe_reports_version_or_reason(agent, monkeypatch):
    version, reason = agent.OnnxRunner.probe()
    assert version and reason is None
    for mod in ("ai_edge_litert", "tflite_runtime"):
        monkeypatch.setitem(__import__("sys").modules, mod, None)
    version, reason = agent.LiteRTRunner.probe()
    assert version is None and "ai_edge_litert" in reason and "tflite_runtime" in reason
    assert "litert" not in agent.available_runtimes()


def test_open_and_constructor_load_the_same_way(agent, tmp_path):
    model = tiny_onnx(tmp_path / "tiny.onnx")
    req = tiny_request(model, threads=2)
    a = agent.OnnxRunner.open(str(model), req)
    b = agent.OnnxRunner(str(model), 2, input_specs=req["inputs"])
    x = np.ones((1, 64), np.float32)
    assert a.threads == b.threads == 2 and a.version == b.version
    np.testing.assert_array_equal(a.run([x])[0], b.run([x])[0])
    assert a.batch_dynamic() is False and a.static_batch() == 1


def test_base_defaults_and_abstract_methods(agent):
    r = agent.Runner()
    assert r.threads == 1 and r.version is None
    assert r.batch_dynamic() is False and r.static_batch() == 1
    with pytest.raises(NotImplementedError):
        agent.Runner.probe()
    with pytest.raises(NotImplementedError):
        r.load("m", {})
    with pytest.raises(NotImplementedError):
        r.run([])


def test_a_new_runner_is_dispatched_by_a_request(agent, tmp_path, monkeypatch, capsys):
    """A runner added to RUNNERS alone is what a request's runtime picks: measure() has no list of its own."""
    calls = {}

    class Doubler(agent.Runner):
        name = "doubler"

        @classmethod
        def probe(cls):
            return "doubler 0.1", None

        def load(self, model_path, request):
            calls["load"] = (model_path, request["threads"])
            self.threads, self.version = int(request["threads"]), "doubler 0.1"

        def batch_dynamic(self):
            return True

        def run(self, inputs):
            return [np.asarray(inputs[0]) * 2]

    monkeypatch.setitem(agent.RUNNERS, "doubler", Doubler)
    model = tmp_path / "m.bin"
    model.write_bytes(b"x")
    req = tiny_request(model, runtime="doubler", warmup=1, runs=3, min_seconds=0.0)
    path = tmp_path / "req.json"
    path.write_text(json.dumps(req))
    assert agent.main(["agent", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["runtime"]["name"] == "doubler" and doc["runtime"]["version"] == "doubler 0.1"
    assert calls["load"] == (str(model), 1) and doc["latency_ms"]["runs"] >= 3


def test_unknown_runtime_lists_the_runners(agent, tmp_path, capsys):
    model = tiny_onnx(tmp_path / "tiny.onnx")
    path = tmp_path / "req.json"
    path.write_text(json.dumps(tiny_request(model, runtime="nope")))
    assert agent.main(["agent", str(path)]) == agent.EXIT_BAD_REQUEST
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"]["kind"] == "bad_request" and "litert" in doc["error"]["message"]


def test_the_host_loads_the_agent_once_under_one_name():
    import sys

    from edgekit.agent import inprocess
    from edgekit.agent.bundle import agent_source
    from edgekit.convert.onnx_to_tflite import _agent

    mod = inprocess.load_agent()
    assert mod is inprocess.load_agent() is _agent() is sys.modules[inprocess.MODULE_NAME]
    assert mod.__file__ == str(agent_source()) and mod.Runner.__module__ == inprocess.MODULE_NAME
    assert inprocess.runs_on_host("onnxruntime") and inprocess.runs_on_host("litert")
    assert not inprocess.runs_on_host("coreml") and not inprocess.runs_on_host(None)
    assert not [m for m in sys.modules.values() if getattr(m, "__file__", None) == str(agent_source())
                and m is not mod and m.__name__ != "edgekit_agent_under_test"]
