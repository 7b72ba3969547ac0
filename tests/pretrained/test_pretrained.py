"""Real pretrained models nobody here wrote (PaddleOCR's PP-OCR text classifier, detector and recognizer,
as rapidocr-onnxruntime ships them: ONNX with dynamic axes, real weights and activation ranges) through
what a user types, from another working folder with relative paths: `edgekit convert` and the default
`edgekit deploy`, scored with a fitting metric on labelled data made here (tests/pretrained/__init__.py),
each within its budget, and the shipped file re-scored from ship/ alone."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests import pretrained

pytestmark = pytest.mark.slow
FAST = ("--runs", "10", "--min-seconds", "0", "--warmup", "2")
QUICK_BUDGET_S = 300.0  # the default deploy's short search (pipeline.QUICK_SEARCH_BUDGET_S)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Every pretrained model with its eval/calib data, in one folder the tests run from."""
    where = tmp_path_factory.mktemp("pretrained")
    for name in pretrained.NAMES:
        pretrained.prepared(name, where)
    return where


@pytest.fixture
def in_models(models, monkeypatch):
    monkeypatch.chdir(models)  # the user's working folder: every path below is relative to it
    return models


def _no_colour(obj) -> None:
    text = json.dumps(obj)
    assert "\\u001b[" not in text and "\x1b[" not in text, "ANSI colour codes reached the report"


def test_the_text_classifier_converts_as_typed_with_its_sizes_from_the_data(cli, in_models):
    r = cli("convert", "ocr_cls/model.onnx", "--to", "tflite", "--calib-data", "ocr_cls/calib.npz",
            "--out", "out/ocr_cls.tflite", "--json")
    assert r.exit_code == 0, r.stdout + r.stderr
    hop = [s for s in json.loads(r.stdout)["lineage"] if s["name"] == "onnx->tflite"][-1]
    # batch and H/W are dynamic (-1) in the file: the data's 48x192 fixes them, and the lineage says so
    assert hop["config"]["input_shapes"] == {"x": [1, 3, 48, 192]} and hop["config"]["input_shapes_from"] == "data"
    assert hop["metrics"]["parity_violations"] == [] and (in_models / "out/ocr_cls.tflite").is_file()


@pytest.mark.parametrize("name", pretrained.NAMES)
def test_default_deploy_ends_in_budget_and_the_shipped_file_scores_the_report_from_ship_alone(cli, in_models, name):
    m = pretrained.MODELS[name]
    out = f"out-{name}"
    r = cli("deploy", f"{name}/model.onnx", "--target", "local", "--eval-data", f"{name}/eval.npz",
            "--calib-data", f"{name}/calib.npz", "--metric", m.metric, "--out", out, *FAST)
    assert r.exit_code in (0, 1), r.stdout + r.stderr
    rep = json.loads((in_models / out / "report.json").read_text())
    _no_colour(rep["search"]["candidates"])
    # within the short search's budget (a build is stopped at its deadline; the report closes after it)
    assert rep["search"]["timeline"]["wall_s"] <= QUICK_BUDGET_S * 1.15, rep["search"]["timeline"]
    fp32 = next(v for v in rep["variants"] if v["name"] == "fp32")
    assert fp32["accuracy"]["metric"] == m.metric and fp32["accuracy"]["value"] >= m.fp32_floor, fp32["accuracy"]
    cands = {c["name"]: c for c in rep["search"]["candidates"]}
    # the dynamic-axis model became a TFLite file (sized by the data), not a build failure
    assert cands["tflite-fp32"]["status"] != "dropped" or cands["tflite-fp32"]["dropped_at"] != "build", cands["tflite-fp32"]
    for c in cands.values():
        if c["status"] == "dropped":
            assert c.get("reason"), c
    ship = rep["decision"]["ship"]
    assert ship is not None, rep["decision"]
    shipped = next(v for v in rep["variants"] if v["name"] == ship)
    # ship/ alone: the file, its interface (names, layout, the static shape it takes) and runtime.json
    from edgekit.metrics import get_metric
    from edgekit.orchestration.run_shipped import run_shipped

    face = json.loads((in_models / out / "ship" / "ship.json").read_text())["interface"]
    if shipped["format"] == "tflite":
        assert face["inputs"][0]["static_shape_from"] == "data" and face["batch"] == 1
    with np.load(f"{name}/eval.npz") as ev:
        x, y = ev["x"], ev["y"]
    ys = run_shipped(in_models / out / "ship", {face["inputs"][0]["source_name"]: x})
    rescored = get_metric(m.metric).evaluate([ys[face["outputs"][0]["source_name"]]], y).value
    assert rescored == pytest.approx(shipped["accuracy"]["value"], abs=1e-3), (ship, rescored, shipped["accuracy"])


LINES_RECIPE = """baseline: fp32
variants:
  - name: int8-dynamic
    passes:
      - quantize: {mode: dynamic}
"""


def test_the_recognizer_reads_text_lines_at_two_widths_as_shape_buckets(cli, in_models):
    """PP-OCRv4's recognizer takes any width; text lines come at the width they need (160, 272 or 320 here,
    as PaddleOCR pads them), one shard per width. The deploy scores every line (the metric's per-sample
    statistics joined over both widths), times each width and weights by line count, and the shipped file
    re-scores the report from ship/ alone, width by width."""
    import onnxruntime as ort

    from edgekit.metrics import get_metric
    from edgekit.orchestration.run_shipped import run_shipped

    lines = pretrained.ocr_rec_lines(in_models / "ocr_rec")
    (in_models / "lines.yaml").write_text(LINES_RECIPE)
    r = cli("deploy", "ocr_rec/model.onnx", "--target", "local", "--eval-data", "ocr_rec/lines", "--metric",
            "ctc_accuracy", "--recipe", "lines.yaml", "--out", "out-lines", *FAST)
    assert r.exit_code in (0, 1), r.stdout + r.stderr
    rep = json.loads((in_models / "out-lines" / "report.json").read_text())
    shards = [(np.load(f), np.load(f.with_name("y" + f.name[1:]))) for f in sorted(lines.glob("x.*.npy"))]
    widths = {x.shape[-1]: len(x) for x, _ in shards}
    assert set(widths) == {160, 272, 320} and sum(widths.values()) == 48, widths
    buckets = rep["settings"]["eval_shape_buckets"]
    assert sorted((b["shapes"][0][-1], b["samples"]) for b in buckets) == sorted(widths.items())
    metric = get_metric("ctc_accuracy")

    def joined(run) -> float:
        st = np.concatenate([metric.stats([run(x)], y) for x, y in shards])
        return float(metric.reduce(st.sum(0)))

    sess = ort.InferenceSession(str(in_models / "ocr_rec/model.onnx"), providers=["CPUExecutionProvider"])
    by_hand = joined(lambda x: sess.run(None, {"x": x})[0])
    v = {v["name"]: v for v in rep["variants"]}
    assert v["fp32"]["accuracy"]["n"] == 48 and v["fp32"]["accuracy"]["value"] == pytest.approx(by_hand, abs=1e-6)
    assert by_hand >= pretrained.MODELS["ocr_rec"].fp32_floor, by_hand  # the lines are readable at both widths
    for name in ("fp32", "int8-dynamic"):
        lat = v[name]["latency_ms"]
        assert sorted((b["shapes"][0][-1], b["samples"]) for b in lat["buckets"]) == sorted(widths.items())
        assert min(b["p50"] for b in lat["buckets"]) <= lat["weighted_p50"] <= max(b["p50"] for b in lat["buckets"])
    assert v["int8-dynamic"]["accuracy_stats"]["n"] == 48
    ship = rep["decision"]["ship"]
    assert ship is not None, rep["decision"]
    face = json.loads((in_models / "out-lines" / "ship" / "ship.json").read_text())["interface"]
    name_in, name_out = face["inputs"][0]["source_name"], face["outputs"][0]["source_name"]
    rescored = joined(lambda x: run_shipped(in_models / "out-lines" / "ship", {name_in: x})[name_out])
    assert rescored == pytest.approx(v[ship]["accuracy"]["value"], abs=1e-6), (ship, rescored)
