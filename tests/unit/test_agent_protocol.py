"""The host side of the agent protocol against agents that misbehave, through the real code path:
``run_request`` with a real ``LocalTransport`` and a ``BundleDeployer`` whose agent file is a tiny script
(every file, the agent included, still goes through content-addressed delivery and the agent's own
``--sha256``), and the real agent for the model integrity check."""

from __future__ import annotations

import inspect
import json
import textwrap
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgekit.agent import bundle
from edgekit.agent.bundle import BundleDeployer
from edgekit.agent.protocol import PROTOCOL, AgentRunFailed, build_request, parse_agent_stdout, run_request
from edgekit.errors import AgentError, DeviceError, TransportError
from edgekit.inputs.targets import MeasureDefaults
from edgekit.transport.local import LocalTransport

# What every fake agent does right: answer --sha256 (the deployer's self-check and delivery use it).
FAKE_HEAD = '''
import hashlib, json, os, sys, time
if len(sys.argv) >= 2 and sys.argv[1] == "--sha256":
    def h(p):
        return hashlib.sha256(open(p, "rb").read()).hexdigest() if os.path.isfile(p) else None
    print(json.dumps({"protocol": %d, "ok": True, "sha256": {p: h(p) for p in sys.argv[2:]}}))
    sys.exit(0)
''' % PROTOCOL


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """y = relu(x) on a (1, 4) float input, loaded as edgekit's ONNX source (its Artifact and IO)."""
    from edgekit.inputs.source import load_source

    d = tmp_path_factory.mktemp("tiny")
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save(model, d / "tiny.onnx")
    return load_source(d / "tiny.onnx", workdir=d)


def _request(src, model_remote: str):
    """A real request for the tiny model (built by the host's own build_request, whichever keywords this
    version of it takes)."""
    kw = dict(variant="tiny", artifact=src.artifact, model_remote=model_remote, source_io=src.artifact.io,
              measure=MeasureDefaults(warmup=0, runs=3, min_seconds=0.0, max_runs=3), eval_remote=None,
              x_keys=["x"], y_key=None, outputs_remote=None)
    params = inspect.signature(build_request).parameters
    return build_request(**{k: v for k, v in kw.items() if k in params})


def _deployer(tmp_path, monkeypatch, agent_body: str | None = None) -> BundleDeployer:
    """A deployer on a local 'device' folder; with ``agent_body`` its agent file is that script."""
    if agent_body is not None:
        fake = tmp_path / "fake_agent.py"
        fake.write_text(FAKE_HEAD + textwrap.dedent(agent_body))
        monkeypatch.setattr(bundle, "agent_source", lambda: fake)
    return BundleDeployer(LocalTransport(workdir=tmp_path / "device"))


def _run(dep, src, **kw):
    remote = dep.deliver([src.artifact.path])[src.artifact.path]
    return run_request(dep, _request(src, remote), **kw)


# --- parse_agent_stdout ---------------------------------------------------------------------------

def test_parse_accepts_one_document_of_this_protocol():
    doc = parse_agent_stdout(json.dumps({"protocol": PROTOCOL, "ok": True, "x": 1}) + "\n", "", 0)
    assert doc == {"protocol": PROTOCOL, "ok": True, "x": 1}


def test_parse_protocol_mismatch_names_both_numbers():
    with pytest.raises(AgentError) as e:
        parse_agent_stdout(json.dumps({"protocol": 1, "ok": True}), "", 0)
    assert f"agent protocol 1 does not match the host's {PROTOCOL}" in e.value.message
    assert e.value.exit_code == 3
    with pytest.raises(AgentError, match=f"agent protocol None does not match the host's {PROTOCOL}"):
        parse_agent_stdout(json.dumps({"ok": True}), "", 0)  # no protocol at all


@pytest.mark.parametrize("stdout", ["Segmentation fault", "", '{"protocol": 2, "ok": tr', "[1, 2]",
                                    '{"protocol": 2}\n{"protocol": 2}'])
def test_parse_non_json_output_quotes_stdout_and_stderr(stdout):
    with pytest.raises(AgentError) as e:
        parse_agent_stdout(stdout, "Traceback (most recent call last):\nImportError: libfoo.so", 139)
    msg = e.value.message
    assert "did not print one JSON document (exit 139)" in msg
    assert repr(stdout.strip()[:200]) in msg and "ImportError: libfoo.so" in msg
    assert e.value.hint and "--probe" in e.value.hint


def test_parse_keeps_only_excerpts_of_long_output():
    with pytest.raises(AgentError) as e:
        parse_agent_stdout("x" * 5000, "e" * 5000 + "THE END", 1)
    assert "x" * 200 in e.value.message and "x" * 201 not in e.value.message
    assert "THE END" in e.value.message and "e" * 700 not in e.value.message


# --- run_request with agents that misbehave ----------------------------------------------------------

def test_agent_of_another_protocol_is_refused(tiny_model, tmp_path, monkeypatch):
    dep = _deployer(tmp_path, monkeypatch, f'''
        print(json.dumps({{"protocol": {PROTOCOL + 1}, "ok": True, "variant": "tiny"}}))
    ''')
    with pytest.raises(AgentError) as e:
        _run(dep, tiny_model)
    assert f"agent protocol {PROTOCOL + 1} does not match the host's {PROTOCOL}" in e.value.message
    assert e.value.exit_code == 3


def test_agent_printing_no_json_is_an_agent_error_with_its_output(tiny_model, tmp_path, monkeypatch):
    dep = _deployer(tmp_path, monkeypatch, '''
        print("loading model... done")
        print("RuntimeError: kernel not found", file=sys.stderr)
        sys.exit(7)
    ''')
    with pytest.raises(AgentError) as e:
        _run(dep, tiny_model)
    msg = e.value.message
    assert "did not print one JSON document (exit 7)" in msg
    assert "loading model... done" in msg and "RuntimeError: kernel not found" in msg
    assert e.value.exit_code == 3


def test_agent_that_hangs_is_a_transport_timeout(tiny_model, tmp_path, monkeypatch):
    """The agent hangs past the timeout: a TransportError at the timeout, and the agent is killed: a hung
    agent that was left running would write its marker 4 s after it started, and the test waits past that."""
    started, marker = tmp_path / "started", tmp_path / "still-running"
    dep = _deployer(tmp_path, monkeypatch, f'''
        open({str(started)!r}, "w").write("hanging")
        time.sleep(4)
        open({str(marker)!r}, "w").write("the agent was not stopped")
    ''')
    remote = dep.deliver([tiny_model.artifact.path])[tiny_model.artifact.path]
    dep.agent  # installed before the clock starts
    t0 = time.perf_counter()
    with pytest.raises(TransportError) as e:
        run_request(dep, _request(tiny_model, remote), timeout=2.0)
    took = time.perf_counter() - t0
    assert e.value.exit_code == 3 and "timed out after 2 s" in e.value.message, e.value.message
    assert 1.9 < took < 3.9, took  # at the timeout, not when the agent would have finished
    assert started.exists()  # the agent really ran (and hung)
    time.sleep(max(0.0, t0 + 8.0 - time.perf_counter()))  # 4 s past when a surviving agent writes its marker
    assert not marker.exists(), "the hung agent was left running past the timeout"


def test_real_agent_measures_then_refuses_a_tampered_model(tiny_model, tmp_path, monkeypatch):
    """The real agent checks the model's sha256 from the request before loading it: the same request that
    succeeds on the delivered model is refused once the file on the device is altered."""
    dep = _deployer(tmp_path, monkeypatch)  # the real device agent
    remote = dep.deliver([tiny_model.artifact.path])[tiny_model.artifact.path]
    req = _request(tiny_model, remote)
    ok = run_request(dep, req)
    assert ok.doc["ok"] and ok.doc["protocol"] == PROTOCOL and len(ok.doc["latency_ms"]["raw"]) >= 3

    data = bytearray(open(remote, "rb").read())
    data[-1] ^= 0x01  # one bit flipped on the device after delivery
    with open(remote, "wb") as fh:
        fh.write(bytes(data))
    with pytest.raises(DeviceError) as e:
        run_request(dep, req)
    msg = e.value.message
    assert "agent failed on variant 'tiny' (integrity)" in msg, msg
    assert f"expected {tiny_model.artifact.sha256[:12]}" in msg and "corrupted transfer" in msg
    assert e.value.exit_code == 3
    # the typed failure carries the agent's error kind (what tells a variant's fault from the device's)
    assert isinstance(e.value, AgentRunFailed), type(e.value)
    assert e.value.kind == "integrity" and e.value.variant == "tiny"


def test_real_agent_refuses_a_request_of_another_protocol(tiny_model, tmp_path, monkeypatch):
    """The other direction: the agent refuses a request that is not its protocol, naming both numbers."""
    dep = _deployer(tmp_path, monkeypatch)
    req = tmp_path / "req.json"
    req.write_text(json.dumps({"protocol": PROTOCOL + 1, "variant": "x"}))
    remote = dep.deliver([req])[req]
    res = dep.t.run([dep.t.python, dep.agent, remote], timeout=120)
    doc = json.loads(res.stdout)
    assert res.returncode != 0 and doc["ok"] is False and doc["error"]["kind"] == "bad_request"
    assert f"request protocol {PROTOCOL + 1} != agent protocol {PROTOCOL}" in doc["error"]["message"]
    np.testing.assert_equal(doc["protocol"], PROTOCOL)
