"""OpenVINO and NCNN on the arm64 twins, end to end (#24): the host converts the digits model to OpenVINO IR
(fp32, the CPU plugin's default precision, NNCF INT8) and to NCNN (fp32, fp16), and the device runs them on
the aarch64 wheels edgekit provisions for the Raspberry Pi 5 and the Pi 4 (`sim up --runtime openvino --runtime
ncnn`):

    edgekit sim up pi5-ov --arch arm64 --target rpi5 --runtime openvino --runtime ncnn
    edgekit deploy model.pt2 --recipe cpu-runtimes.yaml --target rpi5 --device pi5-ov ...

Each twin is its board's cores under qemu (the Pi 5's cortex-a76, ARMv8.2 with fp16 arithmetic; the Pi 4's
cortex-a72, ARMv8.0 without it) with the board's /proc/cpuinfo and sysfs topology (edgekit/devices/sim_arm64.py
``fake_cpu_topology``): OpenVINO's CPU plugin reads the cores' MIDR_EL1 and hwloc's topology masks and
segfaults without them. The plugin's default precision is f16 on the A76 and f32 on the A72, which the report
records as the precision it ran at. Real components only; needs root and the twin's tools (as
test_arm64_twin.py). The aarch64 wheelhouses are cached in ~/.cache/edgekit/wheelhouse/TARGET-py3.11.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import run_edgekit_subprocess
from test_arm64_twin import ACCURACY_TOLERANCE, _missing, _ok, started_twin

pytestmark = [pytest.mark.emu, pytest.mark.root, pytest.mark.slow]

RUNTIMES = ["openvino", "ncnn"]
# board -> (twin name, OpenVINO's default precision on its cores: the A76 computes in fp16, the A72 cannot)
BOARDS = {"rpi5": ("pi5-ov", "f16"), "rpi4": ("pi4-ov", "f32")}


def _no_converters() -> str | None:
    from edgekit.convert.onnx_to_ncnn import available as ncnn_ok
    from edgekit.convert.onnx_to_openvino import available as ov_ok

    if not (ov_ok() and ncnn_ok()):
        return "the openvino and ncnn extras are not installed on this host (they make the IR and .param files)"
    return None


_skip = _missing() or _no_converters()
if _skip:
    pytestmark.append(pytest.mark.skip(reason=_skip))

RECIPE = """baseline: fp32
variants:
  - name: openvino-fp32
    passes:
      - convert: {to: openvino, precision: fp32}
  - name: openvino-auto
    passes:
      - convert: {to: openvino, precision: auto}
  - name: openvino-int8
    passes:
      - convert: {to: openvino, precision: int8}
  - name: ncnn-fp32
    passes:
      - convert: {to: ncnn, precision: fp32}
  - name: ncnn-fp16
    passes:
      - convert: {to: ncnn, precision: fp16}
measure: {warmup: 2, runs: 10, min_seconds: 0.2}
gate: {max_accuracy_drop: 2.0}
"""


@pytest.fixture(scope="module", params=list(BOARDS))
def ov_twin(request):
    """`edgekit sim up pi5-ov --arch arm64 --target rpi5 --runtime openvino --runtime ncnn` (and the Pi 4's),
    torn down by PID: (twin name, target, OpenVINO's expected default precision)."""
    name, auto = BOARDS[request.param]
    for _ in started_twin(name, request.param, RUNTIMES, f"ov-{request.param}"):
        yield name, request.param, auto


def test_twin_reports_the_board_s_cpu_and_both_runtimes(ov_twin):
    name, target, _ = ov_twin
    res = _ok(run_edgekit_subprocess("devices", "check", name, "--json", timeout=300), "devices check")
    doc = json.loads(res.stdout)
    assert doc["device"]["arch"] == "aarch64"
    assert doc["runtimes"].get("openvino", "").startswith("2026.4") and doc["runtimes"].get("ncnn"), doc["runtimes"]
    # executorch and llama.cpp (rpi5 lists both): not asked for here, each has its own --runtime and test
    assert set(doc["missing_runtimes"]) <= {"executorch", "llama.cpp"}, doc
    assert not set(RUNTIMES) & set(doc["missing_runtimes"]), doc


def test_openvino_and_ncnn_files_run_on_the_twin_like_on_the_host(ov_twin, digits, tmp_path):
    name, target, auto = ov_twin
    recipe = tmp_path / "cpu-runtimes.yaml"
    recipe.write_text(RECIPE)
    import yaml

    spec = yaml.safe_load((Path(__file__).resolve().parents[2] / "targets" / "local.yaml").read_text())
    spec.update(name="local-ov-ncnn", runtimes=list(dict.fromkeys([*spec["runtimes"], *RUNTIMES])))
    host_target = tmp_path / "local-ov-ncnn.yaml"  # this host through the local agent, with both runtimes
    host_target.write_text(yaml.safe_dump(spec, sort_keys=False))
    common = [digits.pt2, "--eval-data", digits.eval, "--calib-data", digits.calib, "--recipe", recipe]
    t0 = time.perf_counter()
    _ok(run_edgekit_subprocess("deploy", *common, "--target", target, "--device", name, "--out", tmp_path / "twin",
                               timeout=1800), "deploy OpenVINO and NCNN variants to the arm64 twin")
    deploy_s = time.perf_counter() - t0
    _ok(run_edgekit_subprocess("deploy", *common, "--target", host_target, "--out", tmp_path / "host", timeout=900),
        "deploy OpenVINO and NCNN variants on the host")
    on_twin = json.loads((tmp_path / "twin" / "report.json").read_text())
    on_host = json.loads((tmp_path / "host" / "report.json").read_text())
    assert on_twin["device"]["arch"] == "aarch64" and on_twin["device"]["emulated"] is True
    host = {v["name"]: v for v in on_host["variants"]}
    twin = {v["name"]: v for v in on_twin["variants"]}
    assert set(twin) >= {"openvino-fp32", "openvino-auto", "openvino-int8", "ncnn-fp32", "ncnn-fp16"}, (
        set(twin), [(c["name"], c.get("reason")) for c in on_twin.get("search", {}).get("candidates", [])])
    lines = [f"[ov-{target}] deploy to the twin: {deploy_s:.1f} s"]
    for variant, v in twin.items():
        if variant == "fp32":
            continue
        h = host[variant]
        runtime = variant.split("-")[0]
        assert v["runtime"]["name"] == runtime == h["runtime"]["name"], (v["runtime"], h["runtime"])
        assert v["sha256"] == h["sha256"]  # the host's file, run on the device's aarch64 runtime
        assert v["accuracy"]["n"] == h["accuracy"]["n"] > 0
        assert abs(v["accuracy"]["value"] - h["accuracy"]["value"]) <= ACCURACY_TOLERANCE, (
            variant, v["accuracy"], h["accuracy"])
        assert v["parity"]["top1_agreement"] >= 0.99, (variant, v["parity"])
        lines.append(f"[ov-{target}] {variant}: {runtime} {v['runtime'].get('version')} on the twin; accuracy "
                     f"{v['accuracy']['value']:.2f} vs host {h['accuracy']['value']:.2f}; parity max_abs_err "
                     f"{v['parity']['max_abs_err']:.2e}; options {v['runtime'].get('options')}")
    # OpenVINO's float precision is the plugin's, read back from the compiled model: f32 when the IR asks
    # for it; the default is f16 on the A76 (fp16 arithmetic) and f32 on the A72, where this x86 host runs bf16
    # or f32
    opts = {n: (twin[n]["runtime"].get("options") or {}) for n in ("openvino-fp32", "openvino-auto")}
    assert opts["openvino-fp32"].get("inference_precision") == "f32", opts
    assert opts["openvino-auto"].get("inference_precision") == auto, opts
    assert twin["openvino-fp32"]["parity"]["max_abs_err"] < 1e-3, twin["openvino-fp32"]["parity"]
    assert twin["ncnn-fp32"]["parity"]["max_abs_err"] < 1e-3, twin["ncnn-fp32"]["parity"]
    print("\n".join(lines))
