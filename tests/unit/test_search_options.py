"""Every deploy option reaches `--search` (or is refused there with a reason): issue #14's drift
list. One real search on the local device (real agent, real onnxruntime) with every measurable
option set at once, each option checked in the report it wrote; a second search against the first
one's report (the release gate, judged A/B); the refused option; the lock options."""

from __future__ import annotations

import sys
import time
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from edgekit.errors import BadInputError, DeviceError
from edgekit.inputs.recipe import PassStep, VariantSpec
from edgekit.orchestration.options import _SEARCH_REFUSES, DeployOptions
from edgekit.report.model import Report
from edgekit.variant_search import SearchOptions, search
from tests.unit.agent_loader import tiny_onnx

METER = """\
import os, time
# a stand-in meter (this machine has none): 2 W idle + 50 W per busy CPU second of its parent, the agent
fields = open(f"/proc/{os.getppid()}/stat").read().rsplit(")", 1)[1].split()
print(2.0 * time.time() + 50.0 * (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
"""


def _opts(tmp_path, **over) -> DeployOptions:
    (tmp_path / "meter.py").write_text(METER)
    o = DeployOptions(
        max_accuracy_drop=40.0, relative_accuracy_drop=True, metric="top5", outputs=["y"], strict_stats=True,
        min_speedup=0.01, latency_budget_ms=5000.0, memory_budget_mb=100000.0, size_budget_mb=100000.0, warmup=3,
        runs=12, min_seconds=0.0,
        threads=2, max_seconds=33.0, extra_warnings=["note from the caller"], warmup_mode="auto",
        sustained_seconds=1.0, energy_command=f"{sys.executable} {tmp_path / 'meter.py'}", use_cache=True,
        lock_wait=True, lock_timeout=30.0, eval_samples=48, max_latency_regression=0.5,
        max_release_accuracy_drop=7.0, max_memory_increase=0.9, max_size_increase=0.8, remeasure=True,
        benchmark_binary="device", host_threads=1)
    for k, v in over.items():
        setattr(o, k, v)
    return o


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("search-opts")
    model = tiny_onnx(d / "tiny.onnx")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 64)).astype(np.float32)
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)  # tiny_onnx's weights
    np.savez(d / "eval.npz", x=x, y=(x @ w).argmax(1))
    return model, d / "eval.npz"


CANDS = [VariantSpec(name="int8-dyn", passes=[PassStep(name="quantize", config={"mode": "dynamic"})])]
SOPTS = dict(candidates=CANDS, host_filter=False, screening_runs=6)


# What shows that search honoured each option, read off the report it wrote.
def _honoured(r: Report, tmp_path) -> dict:
    g, s = r.settings["gate"], r.settings
    sel = next(v for v in r.variants if v.selected)
    checks = {c.name for c in r.gate.checks}
    fp = r.variant("fp32")
    return {
        "host_threads": s["host"]["threads"] == 1 and s["host"]["source"] == "--host-threads"
        and r.search.host["threads"] == 1,
        "max_accuracy_drop": g["max_accuracy_drop"] == 40.0,
        "relative_accuracy_drop": g["relative_accuracy_drop"] is True,
        "metric": sel.accuracy.metric == "top5" and s["metric"]["name"] == "top5",
        "outputs": s["metric"]["outputs"] == ["y"],
        "strict_stats": g["strict_stats"] is True,
        "min_speedup": "min_speedup" in checks or sel.name == "fp32",
        "latency_budget_ms": g["latency_ms_p50"] == 5000.0 and "latency_p50_budget" in checks,
        "memory_budget_mb": g["peak_memory_mb"] == 100000.0 and "peak_memory_budget" in checks,
        "size_budget_mb": g["model_size_mb"] == 100000.0 and "model_size_budget" in checks,
        "warmup": s["measure"]["warmup"] == 3 and fp.latency_ms.warmup >= 3,
        "runs": s["measure"]["runs"] == 12 and fp.latency_ms.runs >= 12,
        "min_seconds": s["measure"]["min_seconds"] == 0.0,
        "threads": fp.runtime.threads == 2,
        "max_seconds": s["measure_options"]["max_seconds"] == 33.0,
        "extra_warnings": "note from the caller" in r.warnings,
        "remeasure": all(not v.measurement.get("reused") for v in r.variants),
        "warmup_mode": fp.latency_ms.model_extra.get("warmup_mode") == "auto",
        "sustained_seconds": fp.sustained is not None and fp.sustained["seconds"] >= 1.0,
        "energy_command": fp.energy_source == "external_command" and fp.energy_mj_per_inference is not None,
        "use_cache": s["passes"]["cache"] is not None,
        "eval_samples": s["eval_samples"] == 48 and s["eval_subset"]["n"] == 48,
        # reaches the final run settings (the session runs it on .tflite files only; ORT candidates here)
        "benchmark_binary": s["benchmark_binary"] == "device",
        "max_latency_regression": g["max_latency_regression"] == 0.5,
        "max_release_accuracy_drop": g["max_release_accuracy_drop"] == 7.0,
        "max_memory_increase": g["max_memory_increase"] == 0.9,
        "max_size_increase": g["max_size_increase"] == 0.8,
        # off (the default): the search profiles only the baseline and its selection, never the other finalists
        "profile": all((v.op_profile is not None) == (sel.name != "fp32" and v.name in ("fp32", sel.name))
                       for v in r.variants),
    }


@pytest.mark.slow  # two full searches (~50-80 s): the default step keeps the per-option unit checks
def test_every_deploy_option_reaches_search_or_is_refused(data, tmp_path):
    model, ev = data
    r = search(model, eval_data=ev, out=tmp_path / "a", options=SearchOptions(**SOPTS),
               deploy_options=_opts(tmp_path))
    got = _honoured(r, tmp_path)
    assert r.search.selected is not None and (tmp_path / "a" / "ship").is_dir() and r.compared_with is None

    # the same search against the first one's report (its models moved): the selection is judged A/B, only it
    (tmp_path / "a" / "report.json").rename(tmp_path / "release.json")
    (tmp_path / "a" / "artifacts").rename(tmp_path / "release-models")
    r2 = search(model, eval_data=ev, out=tmp_path / "b", options=SearchOptions(**SOPTS),
                deploy_options=_opts(tmp_path, baseline_report=tmp_path / "release.json", ab_blocks=7,
                                     release_method="ab", baseline_artifacts=tmp_path / "release-models",
                                     sustained_seconds=None))
    lat = [c for c in r2.gate.checks if c.name == "latency_regression"]
    assert [c.variant for c in lat] == [r2.search.selected], r2.gate.checks
    detail = r2.compared_with.method_detail[r2.search.selected]
    from edgekit.report.diff import counterpart

    # judged against its namesake, or the file the first search shipped (the choice may differ by a tuned row)
    prev = counterpart(Report.load(tmp_path / "release.json"), r2.search.selected, r2.search.selected)
    recorded = prev.artifact_path
    got.update({
        "baseline_report": r2.compared_with.path == str(tmp_path / "release.json"),
        # a model that was under the moved artifacts folder is found through --baseline-artifacts (fp32 is
        # the user's own .onnx here, still at its recorded path)
        "baseline_artifacts": detail["baseline_file"] == str(tmp_path / "release-models" / Path(recorded).name)
        if recorded.startswith(str(tmp_path / "a" / "artifacts")) else detail["baseline_file"] == recorded,
        "release_method": r2.compared_with.method == "ab" and r2.compared_with.method_detail["requested"] == "ab",
        "ab_blocks": detail["blocks"] == 7
        and detail["same_file"] is (prev.sha256 == r2.variant(r2.search.selected).sha256),
    })
    every = {f.name for f in fields(DeployOptions)}
    # a new DeployOptions field must be honoured (checked in a report above, or by the named test) or refused
    covered = set(got) | set(CHECKED_BY_OTHER_TESTS) | set(_SEARCH_REFUSES)
    assert every == covered, sorted(every ^ covered)
    assert [k for k, ok in got.items() if not ok] == []


# options whose effect shows before or around the device, not in a report: checked by these tests
CHECKED_BY_OTHER_TESTS = {"postprocess": "test_search_reads_the_postprocess_option",
                          "train_data": "test_quantize_qat.py::test_search_ships_the_qat_rescue",
                          "lock_wait": "test_search_takes_the_lock_options",
                          "lock_timeout": "test_search_takes_the_lock_options",
                          "metric_options": "test_metrics_tasks.py::test_metric_options_from_a_recipe_reach_the_eval_plan "
                                            "(resolve_metric_spec, which deploy and the search both prepare with)",
                          "constants": "test_stateful_inputs.py::test_the_search_and_its_host_filter_take_the_stream",
                          "state": "test_stateful_inputs.py::test_the_search_and_its_host_filter_take_the_stream",
                          "teacher": "test_budget_goals.py::test_a_teacher_whose_outputs_do_not_match_fails_before_any_"
                                     "training (a budget search's distilled student; without a goal it is refused)"}


def test_search_reads_the_postprocess_option(data, tmp_path):
    model, ev = data
    with pytest.raises(BadInputError, match="no_such_module"):
        search(model, eval_data=ev, out=tmp_path / "o", options=SearchOptions(**SOPTS),
               deploy_options=DeployOptions(metric="map50", postprocess="no_such_module:boxes"))


def test_search_refuses_the_fleet_options_with_the_reason(data, tmp_path):
    model, ev = data
    with pytest.raises(BadInputError, match="measures its candidates on one device"):
        search(model, eval_data=ev, out=tmp_path / "o", options=SearchOptions(**SOPTS),
               deploy_options=DeployOptions(pool="local:lab"))
    assert not (tmp_path / "o").exists() or not (tmp_path / "o" / "report.json").exists()


def test_search_takes_the_lock_options(data, tmp_path, monkeypatch):
    from edgekit.devices.inventory import DeviceEntry, add_device
    from edgekit.devices.lock import DeviceLock

    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path / "home"))
    add_device(DeviceEntry(name="bench", kind="local", target="local", workdir=str(tmp_path / "dev")))
    model, ev = data
    with DeviceLock("bench"):  # another deploy holds the device
        with pytest.raises(DeviceError) as e:
            search(model, eval_data=ev, out=tmp_path / "o", device="bench", options=SearchOptions(**SOPTS),
                   deploy_options=DeployOptions(lock_wait=False, runs=5, min_seconds=0.0))
    assert e.value.exit_code == 3 and "bench" in e.value.message
    with DeviceLock("bench"):  # waiting, but only so long
        started = time.monotonic()
        with pytest.raises(DeviceError) as e:
            search(model, eval_data=ev, out=tmp_path / "o", device="bench", options=SearchOptions(**SOPTS),
                   deploy_options=DeployOptions(lock_timeout=2.0, runs=5, min_seconds=0.0))
        waited = time.monotonic() - started
    assert e.value.exit_code == 3 and "bench" in e.value.message
    assert waited >= 2.0, waited  # it did wait for the lock before giving up
