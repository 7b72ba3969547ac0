"""The test zoo (transformers architectures, trained here) through what a user runs, from another
working directory with relative paths: deploy with the task's metric, deploy --search, convert to
TFLite without sample data, convert to Core ML, and accuracy-aware quantization with the task's metric. Each model
is deployed once, as a user would first: the search, judged with the task's metric."""

from __future__ import annotations

import json
import os

import pytest

from tests import zoo

pytestmark = pytest.mark.slow
FAST = ("--runs", "5", "--min-seconds", "0", "--warmup", "1")


@pytest.fixture
def in_zoo_dir(tmp_path):
    """A working folder holding relative links to every zoo model's files."""
    old = os.getcwd()
    os.chdir(tmp_path)
    yield tmp_path
    os.chdir(old)


def _link(m, where):
    d = where / m.name
    d.mkdir()
    for f in ("model.pt2", "eval.npz", "calib.npz", "train.npz"):
        (d / f).symlink_to(m.dir / f)
    return f"{m.name}/"


def _metric_args(m):
    args = ["--metric", m.metric]
    if m.metric == "map50":
        args += ["--max-metric-drop", "5"]  # 128 images: mAP's resolution is a few points
    return args


def _deploy(cli, where, name, out, *extra):
    """`edgekit deploy` of zoo model ``name`` with its task's metric, relative paths; (model, exit, report)."""
    m = zoo.get(name)
    p = _link(m, where)
    r = cli("deploy", p + "model.pt2", "--eval-data", p + "eval.npz", "--calib-data", p + "calib.npz",
            *_metric_args(m), *extra, "--out", out, *FAST)
    assert r.exit_code in (0, 1), r.stdout + r.stderr
    return m, r, json.loads((where / out / "report.json").read_text())


def _judged_with_the_task_metric(m, r, rep):
    """What every deploy of a zoo model must say, whatever it ships: the baseline (the device's fp32 ONNX) scores
    what the trained PyTorch model scored, with the task's metric; every output is judged; a compressed variant
    carries the metric's paired statistics; the gate's accuracy check names the metric; the exit code is the gate's."""
    base = next(v for v in rep["variants"] if v["name"] == "fp32")
    assert base["accuracy"]["metric"] == m.metric
    assert base["accuracy"]["value"] == pytest.approx(100 * m.facts["metric_fp32"], abs=1.0)  # zoo.json: 0..1
    assert base["parity"]["max_abs_err"] < 1e-3
    # every output is judged: one parity row per output of a multi-output model, at most one otherwise
    n = len(base["parity_outputs"] or {})
    assert (n == len(m.output_names)) if len(m.output_names) > 1 else n <= 1, base["parity_outputs"]
    scored = [v for v in rep["variants"] if v["name"] != "fp32" and v.get("accuracy")]
    assert scored, [v["name"] for v in rep["variants"]]
    assert all(v["accuracy"]["metric"] == m.metric for v in scored)
    assert any((v.get("accuracy_stats") or {}).get("ci95") is not None for v in scored), scored
    checks = [c for c in rep["gate"]["checks"] if c["name"] == "accuracy_drop"]
    assert all(m.metric in c["message"] for c in checks)
    assert checks or rep["search"]["selected"] == "fp32", rep["gate"]["checks"]
    assert rep["settings"]["eval_inputs"] == m.input_names
    assert r.exit_code == (0 if rep["gate"]["passed"] else 1)


# the full search (--search: every candidate) on two models; the default deploy's short search on the others
# (the same selection, fewer candidates), the two slowest at half its budget (CI's time, #23: the short search
# took 279 s on Segformer and 145 s on DETR of its 300 s)
FULL_SEARCH = ("cnn", "text")
BUDGET = {"seg": "150", "det": "150"}


@pytest.mark.parametrize("name", zoo.NAMES)
def test_search_ships_a_variant_inside_the_tolerance(cli, in_zoo_dir, name):
    extra = ("--search",) if name in FULL_SEARCH else (("--time-budget", BUDGET[name]) if name in BUDGET else ())
    m, r, rep = _deploy(cli, in_zoo_dir, name, f"results/{name}-search", *extra)
    assert rep["search"]["mode"] == ("full" if name in FULL_SEARCH else "quick")
    # the task's metric through the whole loop (one deploy a model: the fixed default recipe's own deploy of each
    # zoo model measured the same things again, ~8 min of CI's slow step; the recipe path is the default suite's)
    _judged_with_the_task_metric(m, r, rep)
    sel = rep["search"]["selected"]
    assert sel is not None, rep["search"]["candidates"]
    v = next(v for v in rep["variants"] if v["name"] == sel)
    tol = 5.0 if m.metric == "map50" else 1.0
    assert v["accuracy"]["metric"] == m.metric and v["accuracy_drop"] <= tol + 1e-9
    assert (in_zoo_dir / rep["search"]["shipped"]["file"]).is_file() or os.path.isfile(rep["search"]["shipped"]["file"])
    tfl = [c for c in rep["search"]["candidates"] if c["name"].startswith("tflite")]
    assert tfl and not [c for c in tfl if "does not exist" in str(c.get("reason"))], tfl  # the relative --out bug
    if name != "seg":  # Segformer has no TFLite route within parity today (see the closing note)
        assert [c for c in tfl if c.get("dropped_at") != "build"], tfl


@pytest.mark.parametrize("name", zoo.NAMES)
def test_convert_to_tflite_without_sample_data(cli, in_zoo_dir, name):
    m = zoo.get(name)
    p = _link(m, in_zoo_dir)
    r = cli("convert", p + "model.pt2", "--to", "tflite", "--out", f"out/{name}.tflite", "--json")
    assert r.exit_code == 0, r.stdout + r.stderr
    art = json.loads(r.stdout)
    hop = [s for s in art["lineage"] if s["kind"] == "convert"][-1]
    assert hop["metrics"]["parity_violations"] == [] and (in_zoo_dir / f"out/{name}.tflite").is_file()
    assert "synthetic" in json.dumps(hop)


@pytest.mark.parametrize("name", zoo.NAMES)
def test_convert_to_coreml(cli, in_zoo_dir, name):
    pytest.importorskip("coremltools")
    m = zoo.get(name)
    p = _link(m, in_zoo_dir)
    r = cli("convert", p + "model.pt2", "--to", "coreml", "--eval-data", p + "eval.npz", "--out", f"out/{name}.mlpackage")
    assert r.exit_code == 0, r.stdout + r.stderr
    assert (in_zoo_dir / f"out/{name}.mlpackage").exists()


@pytest.mark.parametrize("name", ["cnn", "seg"])  # text: see the closing note (400 trials, refused)
def test_accuracy_aware_quantize_with_the_task_metric(cli, in_zoo_dir, name):
    m = zoo.get(name)
    p = _link(m, in_zoo_dir)
    r = cli("quantize", p + "model.pt2", "--calib-data", p + "calib.npz", "--eval-data", p + "eval.npz",
            "--metric", m.metric, "--max-accuracy-drop", "1", "--out", f"out/{name}-int8.onnx", "--json")
    # these two are the zoo models whose INT8 meets the tolerance (text is left out, see above):
    # a refusal here is a regression, not a pass
    assert r.exit_code == 0, r.stderr
    assert (in_zoo_dir / f"out/{name}-int8.onnx").is_file()
    metrics = json.loads(r.stdout)["metrics"]
    assert metrics["metric"] == m.metric and metrics["accuracy_drop"] <= 1 + 1e-9
