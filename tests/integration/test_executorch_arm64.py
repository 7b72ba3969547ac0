"""ExecuTorch (.pte) on the arm64 twin, end to end: the host's executorch 1.5.1 lowers the digits
model to XNNPACK fp32 and int8 programs, and the device runs them on the runtime edgekit provisions
for aarch64 (PyPI's CPU-only torch 2.10.0 + executorch 1.1.0, `sim up --runtime executorch`):

    edgekit sim up pi5-et --arch arm64 --target rpi5 --runtime executorch
    edgekit deploy model.pt2 --recipe executorch.yaml --target rpi5 --device pi5-et ...

The twin is a Raspberry Pi 5 (qemu's cortex-a76: torch 2.10.0's aarch64 wheel needs ARMv8.1 LSE
atomics, which the Pi 4's Cortex-A72 lacks). Real components only. Needs root, the twin's tools, and
executorch on this host (`bash .ci/executorch.sh` installs it and runs this file). The aarch64
wheelhouse (~214 MB) is cached in ~/.cache/edgekit/wheelhouse/rpi5-py3.11 (EDGEKIT_TEST_ET_WHEELHOUSE).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import run_edgekit_subprocess
from test_arm64_twin import ACCURACY_TOLERANCE, _missing, _ok, started_twin

pytestmark = [pytest.mark.emu, pytest.mark.root, pytest.mark.slow, pytest.mark.executorch]

NAME = "pi5-et"
TARGET = "rpi5"


def _no_executorch() -> str | None:
    from edgekit.convert.torch_to_executorch import available

    if not available():
        return ("executorch is not installed on this host (it lowers the .pte files): `bash .ci/executorch.sh` "
                "installs the `executorch` extra and runs this test")
    return None


_skip = _missing() or _no_executorch()
if _skip:
    pytestmark.append(pytest.mark.skip(reason=_skip))

RECIPE = """baseline: fp32
variants:
  - name: executorch-fp32
    passes:
      - convert: {to: executorch, precision: fp32}
  - name: executorch-int8
    passes:
      - convert: {to: executorch, precision: int8}
measure: {warmup: 2, runs: 10, min_seconds: 0.2}
gate: {max_accuracy_drop: 2.0}
"""


@pytest.fixture(scope="module")
def et_twin():
    """`edgekit sim up pi5-et --arch arm64 --target rpi5 --runtime executorch`, torn down by PID."""
    yield from started_twin(NAME, TARGET, ["executorch"], "et-arm64")


def test_twin_reports_its_executorch_runtime(et_twin):
    res = _ok(run_edgekit_subprocess("devices", "check", NAME, "--json", timeout=300), "devices check")
    doc = json.loads(res.stdout)
    assert doc["device"]["arch"] == "aarch64"
    assert doc["runtimes"].get("executorch") == "1.1.0", doc["runtimes"]
    assert {"onnxruntime", "litert"} <= set(doc["runtimes"]), doc["runtimes"]
    # openvino, ncnn and llama.cpp: rpi5 lists them, installed with their own --runtime
    # (test_openvino_ncnn_arm64.py, test_llama_cpp*.py)
    assert set(doc["missing_runtimes"]) <= {"openvino", "ncnn", "llama.cpp"} and doc["matches_target"] is True, doc
    assert "executorch" not in doc["missing_runtimes"], doc


def test_host_lowered_pte_runs_on_twin_like_on_host(et_twin, digits, tmp_path):
    """The .pte files executorch 1.5.1 writes on the host load and run on the device's 1.1.0 runtime
    with the host's accuracy and parity (the same agent runs them on the host's 1.5.1)."""
    recipe = tmp_path / "executorch.yaml"
    recipe.write_text(RECIPE)
    host_target = tmp_path / "local-et.yaml"  # this host through the local agent, with ExecuTorch
    import yaml

    spec = yaml.safe_load((Path(__file__).resolve().parents[2] / "targets" / "local.yaml").read_text())
    spec.update(name="local-et", runtimes=[*spec["runtimes"], "executorch"])  # whatever else local lists
    host_target.write_text(yaml.safe_dump(spec, sort_keys=False))
    from edgekit.inputs.targets import load_target

    assert "executorch" in load_target(host_target).runtimes  # the local.yaml edit above took
    common = [digits.pt2, "--eval-data", digits.eval, "--calib-data", digits.calib, "--recipe", recipe]
    t0 = time.perf_counter()
    _ok(run_edgekit_subprocess("deploy", *common, "--target", TARGET, "--device", NAME, "--out", tmp_path / "twin",
                               timeout=1800), "deploy .pte variants to the arm64 twin")
    deploy_s = time.perf_counter() - t0
    _ok(run_edgekit_subprocess("deploy", *common, "--target", host_target, "--out", tmp_path / "host", timeout=900),
        "deploy .pte variants on the host")
    on_twin = json.loads((tmp_path / "twin" / "report.json").read_text())
    on_host = json.loads((tmp_path / "host" / "report.json").read_text())
    assert on_twin["device"]["arch"] == "aarch64" and on_twin["device"]["emulated"] is True
    host = {v["name"]: v for v in on_host["variants"]}
    lines = [f"[et-arm64] deploy to the twin: {deploy_s:.1f} s"]
    for v in on_twin["variants"]:
        name, h = v["name"], host[v["name"]]
        if name == "fp32":
            continue
        assert v["runtime"]["name"] == "executorch" and v["runtime"]["version"] == "1.1.0", v["runtime"]
        assert h["runtime"]["name"] == "executorch", h["runtime"]
        assert v["format"] == "executorch" and v["accuracy"]["n"] == h["accuracy"]["n"] > 0
        assert abs(v["accuracy"]["value"] - h["accuracy"]["value"]) <= ACCURACY_TOLERANCE, (name, v["accuracy"],
                                                                                            h["accuracy"])
        assert v["parity"]["top1_agreement"] >= 0.99, (name, v["parity"])
        if name == "executorch-fp32":
            assert v["parity"]["max_abs_err"] < 1e-3, v["parity"]
        else:  # the int8 program's error against the float model is the host's own, not a device error
            assert abs(v["parity"]["max_abs_err"] - h["parity"]["max_abs_err"]) < 0.05, (v["parity"], h["parity"])
        lines.append(f"[et-arm64] {name}: executorch {v['runtime']['version']} on the twin vs "
                     f"{h['runtime']['version']} on the host; accuracy {v['accuracy']['value']:.2f} vs "
                     f"{h['accuracy']['value']:.2f}; parity max_abs_err {v['parity']['max_abs_err']:.2e} vs "
                     f"{h['parity']['max_abs_err']:.2e}; same file: {v['sha256'] == h['sha256']}; "
                     f"load {v['load_ms']:.0f} ms (emulated)")
    assert {v["name"] for v in on_twin["variants"]} >= {"executorch-fp32", "executorch-int8"}
    print("\n".join(lines))


def test_a_language_model_generates_on_the_twin_with_each_runtime(et_twin, tmp_path):
    """Issues #36/#37 on a board: a tiny Llama's KV-cache files (ONNX past/present for onnxruntime, the
    static-cache .pte for ExecuTorch 1.1.0), float and int4 (MatMulNBits 4-bit, 8da4w: the aarch64 int4 kernels),
    built on the host, proven at build, generating on the emulated Pi 5: every variant measured there
    (correctness: timings under emulation mean nothing) with the float model's quality."""
    VARIANTS = ("ort-fp32", "ort-int4", "et-fp32", "et-8da4w")
    from lm_zoo import build_tiny_lm, eval_text

    folder, text = build_tiny_lm("llama"), eval_text(tmp_path / "text")
    res = run_edgekit_subprocess("deploy", folder, "--eval-text", text, "--target", TARGET, "--device", NAME,
                                 "--context", "48",
                                 "--lm-variants", ",".join(VARIANTS), "--runs", "8", "--warmup", "2", "--threads", "1",
                                 "--min-seconds", "0.1",
                                 "--out", tmp_path / "lm", timeout=1800)
    assert res.exit_code in (0, 1), res.stdout[-2000:] + res.stderr[-3000:]
    rep = json.loads((tmp_path / "lm" / "report.json").read_text())
    assert rep["device"]["arch"] == "aarch64" and rep["model"]["task"] == "text-generation"
    got = {v["name"]: v for v in rep["variants"]}
    assert set(VARIANTS) == set(got), rep["decision"]
    for name, v in got.items():
        q, g = v["quality"], v["generation"]
        assert g["decode_tokens_per_s"] > 0 and g["prefill"], name
        assert q["kld_mean"] < (1e-5 if v["precision"] == "fp32" else 0.05), (name, q["kld_mean"])
        assert v["precision"] == ("fp32" if name.endswith("fp32") else "int4"), name
        if v["format"] == "executorch":
            assert v["runtime"]["version"] == "1.1.0", v["runtime"]
    print(f"[et-arm64] language model on the twin: " + "; ".join(
        f"{n} {v['runtime']['name']} {v['runtime']['version']}: KLD {v['quality']['kld_mean']:.2e}, "
        f"{v['generation']['decode_tokens_per_s']:.1f} tok/s (emulated)" for n, v in got.items()))
