"""The browser as a device, for real: Debian's headless Chromium running the page agent
(device_agents/browser) with ONNX Runtime Web from npm (installed by .ci/install.sh), served from loopback.

    edgekit deploy model.pt2 --target browser --eval-data eval.npz --calib-data calib.npz --out out/

The digits demo and the zoo's MobileNetV2 deploy with the default short search from another folder with relative paths, the report
names the browser, the runtime and its WASM features, and the shipped file's accuracy is the host's; a
browser killed mid-measurement is a device failure (exit 3) that overwrites nothing; a model ONNX Runtime
Web cannot load is the variant's failure, with the runtime's own message."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from edgekit.agent import browser_transport as browser


def _missing() -> str | None:
    try:
        browser.chromium_path()
        browser.runtime_dist()
    except Exception as exc:  # DeviceError: what is missing and how to install it
        return f"{exc} ({getattr(exc, 'hint', '')})"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))
FAST = ("--runs", "20", "--min-seconds", "0.2", "--warmup", "3")


@pytest.fixture
def in_tmp(tmp_path, monkeypatch, digits):
    for name, src in (("model.pt2", digits.pt2), ("eval.npz", digits.eval), ("calib.npz", digits.calib)):
        (tmp_path / name).symlink_to(src)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _host_top1(ship: Path, eval_npz: Path) -> float:
    """The shipped file scored on this host as `edgekit run` runs it (the web runtime's native build)."""
    from edgekit.orchestration.run_shipped import run_shipped

    with np.load(eval_npz) as z:
        xs, y = {k: z[k] for k in z.files if k != "y"}, z["y"]  # one input: "x" (digits) or "pixel_values" (cnn)
    logits = next(iter(run_shipped(ship, xs).values()))
    return float(100.0 * np.mean(np.argmax(logits, axis=1) == y))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["digits", "cnn"])  # cnn: the zoo's transformers MobileNetV2 at 64x64
def test_default_deploy_to_the_browser_ships_what_the_host_scores(cli, in_tmp, model):
    if model != "digits":
        from tests import zoo

        for f in ("model.pt2", "eval.npz", "calib.npz"):
            (in_tmp / f).unlink()
            (in_tmp / f).symlink_to(zoo.get(model).dir / f)
    r = cli("deploy", "model.pt2", "--target", "browser", "--eval-data", "eval.npz", "--calib-data", "calib.npz",
            "--out", "out")
    assert r.exit_code in (0, 1), r.stdout + r.stderr
    rep = json.loads((in_tmp / "out/report.json").read_text())
    assert rep["search"]["mode"] == "quick"
    dev = rep["device"]
    assert dev["transport"] == "browser" and dev["arch"] == "wasm32" and dev["browser"].startswith("Chromium 1")
    assert dev["wasm"] == {"wasm_simd": True, "wasm_threads": True, "cross_origin_isolated": True}, dev
    measured = [v for v in rep["variants"] if v.get("latency_ms")]
    web = {"onnx": ("onnxruntime-web", "1.30.0"), "tflite": ("litert.js", "2.5.3")}
    assert measured and all((v["runtime"]["name"], v["runtime"]["version"]) == web[v["format"]]
                            for v in measured), [v["runtime"] for v in measured]
    assert {v["format"] for v in measured} == {"onnx", "tflite"}, [v["name"] for v in measured]  # both runtimes
    for v in measured:
        lat = v["latency_ms"]
        assert lat["timer_resolution_ms"] <= 0.02 and lat["iterations_per_sample"] >= 1 and lat["p50"] > 0, lat
        assert v["memory"]["peak_rss_mb"] and v["memory"]["source"] == "renderer VmHWM", v["memory"]
    ship = rep["decision"]["ship"]
    assert ship is not None, rep["decision"]
    shipped = next(v for v in rep["variants"] if v["name"] == ship)
    rt = json.loads((in_tmp / "out/ship/runtime.json").read_text())
    assert (rt["runtime"], rt["apply"]["package"]) in {("onnxruntime-web", "onnxruntime-web@1.30.0"),
                                                        ("litert.js", "@litertjs/core@2.5.3")}, rt
    # the page's outputs, scored on the host, are what the runtime's native build gives for the same file
    host = _host_top1(in_tmp / "out/ship", in_tmp / "eval.npz")
    assert shipped["accuracy"]["value"] == pytest.approx(host, abs=0.7), (ship, host)  # one of 160 cnn samples: 0.625


def test_a_fixed_deploy_in_two_threads_reloads_the_page_and_scores_like_the_host(cli, in_tmp):
    r = cli("deploy", "model.pt2", "--target", "browser", "--eval-data", "eval.npz", "--no-search", "--threads", "2",
            "--out", "out", *FAST)
    assert r.exit_code in (0, 1), r.stdout + r.stderr
    rep = json.loads((in_tmp / "out/report.json").read_text())
    fp32 = next(v for v in rep["variants"] if v["name"] == "fp32")
    assert fp32["runtime"]["threads"] == 2 and fp32["runtime"]["features"]["wasm_threads"] is True
    # the page's outputs against PyTorch's on the host, every eval sample
    par = fp32["parity"]
    assert par["reference"] == "pytorch" and par["n"] == 360 and par["top1_agreement"] == 1.0, par
    assert par["max_abs_err"] < 1e-4, par


def test_a_browser_killed_mid_measurement_is_a_device_failure_and_overwrites_nothing(in_tmp):
    (in_tmp / "out").mkdir()
    (in_tmp / "out/report.json").write_text('{"kept": true}')
    exe = Path(sys.executable).with_name("edgekit")
    # the browser target with no cap on timed runs: fp32's timed runs really last --min-seconds (the stock cap,
    # 5000 runs, ends them in under a second on this model, and the kill would land between jobs)
    import yaml

    spec = yaml.safe_load((Path(__file__).resolve().parents[2] / "targets" / "browser.yaml").read_text())
    spec.update(name="browser-uncapped", measure=dict(spec["measure"], max_runs=10_000_000))
    (in_tmp / "browser-uncapped.yaml").write_text(yaml.safe_dump(spec))
    proc = subprocess.Popen([str(exe), "deploy", "model.pt2", "--target", "browser-uncapped.yaml", "--eval-data",
                             "eval.npz", "--no-search", "--out", "out", "--min-seconds", "60", "--runs", "20"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=in_tmp)
    from edgekit.sim.procs import descendants

    # the kill waits for the deploy to say it measures fp32 (60 s of timed runs): a browser killed while the
    # page idles between the probe and the first job is restarted by the next job (seen in CI under load)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    killed, deadline = None, time.monotonic() + 240
    while killed is None and time.monotonic() < deadline and proc.poll() is None:
        if any("measuring fp32 on the device" in line for line in lines):
            time.sleep(8)  # inside the 60 s of timed runs
            for pid in descendants(proc.pid):
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"--type=" not in cmd and b"edgekit-chromium-" in cmd:  # the browser, not a helper
                    os.kill(pid, signal.SIGKILL)
                    killed = pid
                    break
        time.sleep(0.5)
    proc.stdout.read()
    proc.wait(timeout=300)
    reader.join(timeout=30)
    err = "".join(lines)
    assert killed is not None, err[-2000:]
    assert proc.returncode == 3, (proc.returncode, err[-2000:])
    assert "browser died" in err and "fp32" in err, err[-2000:]
    assert json.loads((in_tmp / "out/report.json").read_text()) == {"kept": True}


def _keras_tflites(d: Path) -> dict[str, Path]:
    """A small conv net as LiteRT files: fp32, and full INT8 with int8 inputs and outputs."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    inp = tf.keras.Input((8, 8, 1), batch_size=1, name="x")
    h = tf.keras.layers.Conv2D(4, 3, activation="relu")(inp)
    out = tf.keras.layers.Dense(3)(tf.keras.layers.Flatten()(h))
    m = tf.keras.Model(inp, out)
    rng = np.random.default_rng(0)
    files = {"fp32": tf.lite.TFLiteConverter.from_keras_model(m).convert()}
    c = tf.lite.TFLiteConverter.from_keras_model(m)
    c.optimizations = [tf.lite.Optimize.DEFAULT]
    c.representative_dataset = lambda: ([rng.normal(size=(1, 8, 8, 1)).astype(np.float32)] for _ in range(16))
    c.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    c.inference_input_type = c.inference_output_type = tf.int8
    files["int8io"] = c.convert()
    out_paths = {}
    for k, b in files.items():
        (d / f"{k}.tflite").write_bytes(b)
        out_paths[k] = d / f"{k}.tflite"
    return out_paths


def test_litert_js_runs_a_tflite_in_the_page_as_the_host_interpreter_does(tmp_path):
    """LiteRT.js in the page, fed by the file's signature names, returns what this host's LiteRT interpreter
    returns for every eval sample; an int8-I/O file, which LiteRT.js's tensors cannot carry, is the variant's
    model_load_failed with LiteRT.js's own message."""
    from ai_edge_litert.interpreter import Interpreter

    from edgekit.agent.browser_bridge import measure_in_page
    from edgekit.fsutil import sha256_file

    files = _keras_tflites(tmp_path)
    x = np.random.default_rng(1).normal(size=(12, 8, 8, 1)).astype(np.float32)
    np.savez(tmp_path / "ev.npz", x=x, y=np.zeros(12, np.int64))
    t = browser.BrowserTransport(tmp_path / "dev")
    docs = {}
    try:
        for name, src in files.items():
            it = Interpreter(model_path=str(src))
            det, odet = it.get_input_details()[0], it.get_output_details()[0]
            dst = Path(t.workdir) / "files" / src.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(src.read_bytes())
            req = tmp_path / f"{name}.json"
            req.write_text(json.dumps({
                "protocol": 2, "variant": name, "model": str(dst), "format": "tflite", "runtime": "litert",
                "model_sha256": sha256_file(dst), "threads": 1, "warmup": 2, "runs": 10, "min_seconds": 0,
                "inputs": [{"name": det["name"], "dtype": np.dtype(det["dtype"]).name, "shape": [1, 8, 8, 1]}],
                "outputs": [{"name": odet["name"], "dtype": np.dtype(odet["dtype"]).name, "shape": [1, 3]}],
                "eval": {"path": str(tmp_path / "ev.npz"), "x_keys": ["x"], "batch_size": 1},
                "outputs_path": str(tmp_path / f"{name}-out.npz")}))
            docs[name] = measure_in_page(t.page, str(req), timeout=180)
    finally:
        t.close()
    doc, code = docs["fp32"]
    assert code == 0 and doc["ok"], doc
    assert doc["runtime"]["name"] == "litert.js" and doc["runtime"]["version"] == "2.5.3", doc["runtime"]
    it = Interpreter(model_path=str(files["fp32"]))
    it.allocate_tensors()
    ref = []
    for i in range(len(x)):
        it.set_tensor(it.get_input_details()[0]["index"], x[i:i + 1])
        it.invoke()
        ref.append(it.get_tensor(it.get_output_details()[0]["index"]).copy())
    got = np.load(tmp_path / "fp32-out.npz")["output_0"]
    assert got.shape == (12, 3) and np.abs(got - np.concatenate(ref)).max() < 1e-5
    doc, code = docs["int8io"]
    assert code != 0 and doc["error"]["kind"] == "model_load_failed", doc
    assert doc["error"]["message"].startswith("litert.js: ") and "INT8" in doc["error"]["message"], doc


def _page_p50(profile, workdir: Path, model: Path, x: np.ndarray) -> tuple[float, dict]:
    from edgekit.agent.browser_bridge import measure_in_page
    from edgekit.fsutil import sha256_file

    t = browser.BrowserTransport(workdir, profile=profile)
    try:
        dst = Path(t.workdir) / "files" / model.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(model.read_bytes())
        np.save(Path(t.workdir) / "files" / "x.npy", x)
        req = workdir / "req.json"
        req.write_text(json.dumps({
            "protocol": 2, "variant": "fp32", "model": str(dst), "format": "onnx", "runtime": "onnxruntime",
            "model_sha256": sha256_file(dst), "threads": 1, "warmup": 3, "runs": 30, "min_seconds": 0.5,
            "inputs": [{"name": "x", "dtype": "float32", "shape": list(x.shape)}], "outputs": []}))
        doc, code = measure_in_page(t.page, str(req), timeout=180)
    finally:
        t.close()
    assert code == 0 and doc["ok"], doc
    return float(np.median(doc["latency_ms"]["raw"])), doc["device"]


@pytest.mark.serial  # a ratio of two timings: alone, so the other worker's load does not land on one side
def test_browser_mobile_throttles_the_page_cpu_and_says_so(tmp_path, digits):
    """The phone profile's DevTools throttle really slows the page (the same model, both pages in one test),
    and the facts carry the rate, which keys the measurement cache apart from the plain browser's."""
    from edgekit.convert.torch_to_onnx import export_onnx
    from edgekit.inputs.source import load_source
    from edgekit.inputs.targets import load_target
    from edgekit.measure.cache import device_identity

    mobile = load_target("browser-mobile")
    assert mobile.browser.cpu_throttle == 4 and mobile.browser.emulated
    x = np.load(digits.eval)["x"][:1]
    model = export_onnx(load_source(digits.pt2, workdir=tmp_path), tmp_path / "digits.onnx", [x]).path
    plain, plain_dev = _page_p50(None, tmp_path / "plain", model, x)
    slow, slow_dev = _page_p50(mobile.browser, tmp_path / "mobile", model, x)
    print(f"page p50 {plain:.4f} ms, throttled x4 {slow:.4f} ms: {slow / plain:.2f}x")
    # 4x asked: 3.9-6.8x measured alone; the page without the throttle call read 0.9-1.1x (the mutation)
    assert slow > 2.5 * plain, (slow, plain)
    assert "browser_emulation" not in plain_dev
    emu = slow_dev["browser_emulation"]
    assert emu["cpu_throttle"] == 4 and emu["viewport"] == [412, 915] and emu["mobile"] is True, emu
    assert device_identity({"device": slow_dev}, None, "browser") != device_identity({"device": plain_dev}, None,
                                                                                      "browser")


@pytest.mark.slow  # a whole fixed deploy in a throttled page (~50 s); the throttle itself is pinned above
def test_a_deploy_to_browser_mobile_is_an_emulation_and_gates_no_latency(cli, in_tmp):
    r = cli("deploy", "model.pt2", "--target", "browser-mobile", "--eval-data", "eval.npz", "--no-search",
            "--latency-budget-ms", "0.0001", "--out", "out", *FAST)
    assert r.exit_code in (0, 1), r.stdout + r.stderr
    rep = json.loads((in_tmp / "out/report.json").read_text())
    dev = rep["device"]
    assert dev["emulated"] is True and dev["latency_representative"] is False, dev
    assert "CPU throttling x4" in dev["emulation"] and dev["browser_emulation"]["cpu_throttle"] == 4, dev
    # an absurd latency budget is not applied to an emulated CPU's figures: named as not applicable
    lat = [c for c in rep["gate"]["checks"] if c["name"].startswith("latency")]
    assert lat and all(c["passed"] and "not applicable" in c["message"] for c in lat), lat
    assert any("emulated" in w for w in rep["warnings"]), rep["warnings"]


def test_a_model_onnx_runtime_web_cannot_load_fails_the_variant_with_the_runtimes_message(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from edgekit.agent.browser_bridge import measure_in_page
    from edgekit.fsutil import sha256_file

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    # Swish exists from opset 24: declared at 23, ONNX Runtime (Web) has no such operator
    g = helper.make_graph([helper.make_node("Swish", ["x"], ["y"])], "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])
    m.ir_version = 10
    t = browser.BrowserTransport(tmp_path / "dev")
    try:
        model = Path(t.workdir) / "files" / "swish.onnx"
        model.parent.mkdir(parents=True)
        onnx.save(m, model)
        req = tmp_path / "req.json"
        req.write_text(json.dumps({"protocol": 2, "variant": "swish", "model": str(model), "format": "onnx",
                                   "runtime": "onnxruntime", "model_sha256": sha256_file(model), "threads": 1,
                                   "warmup": 1, "runs": 2, "min_seconds": 0, "inputs": [
                                       {"name": "x", "dtype": "float32", "shape": [1, 4]}], "outputs": []}))
        doc, code = measure_in_page(t.page, str(req), timeout=120)
    finally:
        t.close()
    assert code != 0 and doc["ok"] is False, doc
    assert doc["error"]["kind"] == "model_load_failed"  # a variant fault: the search drops it, the run goes on
    assert "onnxruntime-web" in doc["error"]["message"] and "Swish" in doc["error"]["message"], doc
