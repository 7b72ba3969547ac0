"""The task metrics of real pretrained models against hand-computed values: binary masks of a text
detector (mask_iou, mask_f1), CTC recognizers (ctc_accuracy, ctc_char_accuracy) and per-frame
voice activity (frame_accuracy); their options, their errors, and one run through the deploy's
own path (recipe metric section -> MetricSpec -> eval_plan on a real ONNX model)."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.metrics import MetricError, get_metric, known_metrics
from edgekit.metrics.ctc import edit_distance, greedy_decode
from edgekit.metrics.paired import paired_drop


def score(name, outputs, labels, **opts):
    return get_metric(name, opts).evaluate(outputs, labels).value


def test_the_task_metrics_are_registered():
    assert {"mask_iou", "mask_f1", "ctc_accuracy", "ctc_char_accuracy", "frame_accuracy"} <= set(known_metrics())


# --- binary masks ------------------------------------------------------------------------------
def _masks():
    """Two 4x4 samples. Sample 0: the label is the top-left 2x2 (4 px); the map is 0.9 on three of
    them and 0.4 on two pixels outside. Sample 1: nothing anywhere (both masks empty)."""
    p = np.full((2, 1, 4, 4), 0.1, np.float32)
    p[0, 0, 0, 0] = p[0, 0, 0, 1] = p[0, 0, 1, 0] = 0.9
    p[0, 0, 3, 3] = p[0, 0, 3, 2] = 0.4
    y = np.zeros((2, 4, 4), np.uint8)
    y[0, :2, :2] = 1
    return p, y


def test_mask_iou_and_f1_by_hand():
    p, y = _masks()
    # threshold 0.3 (default): P = 5 px, I = 3, U = 6 -> IoU 1/2, F1 6/9; the empty sample scores 1
    assert score("mask_iou", [p], y) == pytest.approx(100 * (0.5 + 1) / 2)
    assert score("mask_f1", [p], y) == pytest.approx(100 * (2 / 3 + 1) / 2)
    # threshold 0.5 drops the two 0.4 pixels: P = 3, I = 3, U = 4 -> IoU 3/4, F1 6/7
    assert score("mask_iou", [p], y, threshold=0.5) == pytest.approx(100 * (0.75 + 1) / 2)
    assert score("mask_f1", [p], y, threshold=0.5) == pytest.approx(100 * (6 / 7 + 1) / 2)
    # the mean over samples, not pooled pixels (pooled: 3/6 = 50%), and per-sample stats for paired stats
    s = get_metric("mask_iou").evaluate([p], y)
    assert s.stats.tolist() == [[0.5, 1.0], [1.0, 1.0]] and s.units == "%" and s.direction == "higher"


def test_mask_layouts_and_logits_give_the_same():
    p, y = _masks()
    want = 100 * (0.5 + 1) / 2
    assert score("mask_iou", [p[:, 0]], y) == pytest.approx(want)  # (N, H, W) map
    assert score("mask_iou", [p], y[:, None]) == pytest.approx(want)  # (N, 1, H, W) labels
    assert score("mask_iou", [p.transpose(0, 2, 3, 1)], y.astype(bool)) == pytest.approx(want)  # (N, H, W, 1)
    logits = np.log(p / (1 - p))
    assert score("mask_iou", [logits], y, activation="sigmoid") == pytest.approx(want)
    assert score("mask_iou", [logits], y) != pytest.approx(want)  # logits read as probabilities: not the same


def test_mask_errors_name_the_problem_and_the_fix():
    p, y = _masks()
    with pytest.raises(MetricError, match=r"output shape\(s\) \(2, 1, 4, 4\), label shape \(2, 2, 2\)") as e:
        get_metric("mask_iou").evaluate([p], y[:, ::2, ::2])
    assert "at the map's resolution" in e.value.message and "--output" in e.value.hint
    with pytest.raises(MetricError, match="miou"):  # a C-class logit map is a different task
        get_metric("mask_f1").evaluate([np.zeros((2, 3, 4, 4), np.float32)], y)
    with pytest.raises(MetricError, match="0/1 labels; the labels also hold 255") as e:
        get_metric("mask_iou").evaluate([p], y * 255)
    assert "divide them by 255" in e.value.hint
    with pytest.raises(MetricError, match=r"threshold=1.5 is outside \[0, 1\]"):
        get_metric("mask_iou", {"threshold": 1.5})
    with pytest.raises(MetricError, match="activation='softmax'") as e:
        get_metric("mask_iou", {"activation": "softmax"})
    assert "sigmoid" in e.value.message
    with pytest.raises(MetricError, match="bad options") as e:
        get_metric("mask_iou", {"thresh": 0.5})
    assert "threshold (default 0.3)" in e.value.hint


# --- CTC -------------------------------------------------------------------------------------------
def _ctc(paths, classes):
    """(N, T, C) logits whose argmax at each step is the given path."""
    paths = np.asarray(paths)
    out = np.random.default_rng(0).uniform(-1, 1, paths.shape + (classes,)).astype(np.float32)
    np.put_along_axis(out, paths[..., None], 5.0, axis=-1)
    return out


def test_ctc_greedy_decoding_collapses_repeats_then_drops_blanks():
    out = _ctc([[1, 1, 0, 1, 2], [2, 2, 2, 3, 3], [0, 0, 0, 0, 0]], 4)
    got = [d.tolist() for d in greedy_decode(out)]
    assert got == [[1, 1, 2], [2, 3], []]  # the blank between the two 1s keeps both; repeats collapse


def test_edit_distance_by_hand():
    assert edit_distance([ord(c) for c in "kitten"], [ord(c) for c in "sitting"]) == 3
    assert edit_distance([1, 2, 3], [3]) == 2
    assert edit_distance([3], [1, 2]) == 2
    assert edit_distance([], [1, 2]) == 2 and edit_distance([1], []) == 1
    assert edit_distance([1, 2, 3, 4], [2, 3, 4, 1]) == 2  # insertion + deletion, not 4 substitutions


def test_ctc_accuracy_and_char_accuracy_by_hand():
    out = _ctc([[1, 1, 0, 1, 2],   # -> 1 1 2: equals the label only because the blank splits the 1s
                [2, 2, 2, 3, 3],   # -> 2 3: equals the label only because repeats collapse
                [1, 0, 3, 0, 0],   # -> 1 3 vs 1 2 3: one deletion, 1 - 1/3
                [1, 0, 2, 0, 3]],  # -> 1 2 3 vs 3: distance 2 > length 1, clipped at 0 (not -1)
               4)
    y = np.array([[1, 1, 2, -1], [2, 3, -1, -1], [1, 2, 3, -1], [3, -1, -1, -1]])
    assert score("ctc_accuracy", [out], y) == pytest.approx(50.0)
    assert score("ctc_char_accuracy", [out], y) == pytest.approx(100 * (1 + 1 + 2 / 3 + 0) / 4)
    s = get_metric("ctc_char_accuracy").evaluate([out], y)
    assert s.stats[:, 0] == pytest.approx([1, 1, 2 / 3, 0]) and s.units == "%"
    # probabilities (softmax) decode the same as logits
    probs = np.exp(out) / np.exp(out).sum(-1, keepdims=True)
    assert score("ctc_accuracy", [probs], y) == pytest.approx(50.0)


def test_ctc_blank_option():
    out = _ctc([[0, 2, 0, 1], [1, 1, 2, 2]], 3)  # blank = the last class (2)
    y = np.array([[0, 0, 1], [1, -1, -1]])
    assert score("ctc_accuracy", [out], y, blank=2) == pytest.approx(100.0)
    with pytest.raises(MetricError, match="the labels hold the blank class 0") as e:
        score("ctc_accuracy", [out], y)  # default blank 0 is a label class here
    assert "blank" in e.value.hint and "padded with -1" in e.value.hint
    with pytest.raises(MetricError, match="blank=5 but the output has 3 classes"):
        score("ctc_accuracy", [out], y, blank=5)
    with pytest.raises(MetricError, match="blank=-1"):
        get_metric("ctc_accuracy", {"blank": -1})


def test_ctc_errors_name_both_shapes():
    out = _ctc([[1, 2, 3]] * 2, 4)
    with pytest.raises(MetricError, match=r"output shape\(s\) \(2, 3, 4\), label shape \(2,\).*padded with -1"):
        get_metric("ctc_accuracy").evaluate([out], np.array([1, 2]))
    with pytest.raises(MetricError, match=r"time-major"):  # (T, N, C): the batch axis is not first
        get_metric("ctc_accuracy").evaluate([out.transpose(1, 0, 2)], np.array([[1, -1], [2, -1]]))
    with pytest.raises(MetricError, match="label classes below 4.*up to 7"):
        get_metric("ctc_char_accuracy").evaluate([out], np.array([[1, 7], [2, -1]]))
    with pytest.raises(MetricError, match="takes labels of kind integer"):
        get_metric("ctc_accuracy").evaluate([out], np.array([[1.0, 2.0], [2.0, -1.0]]))


# --- frames ----------------------------------------------------------------------------------------
def test_frame_accuracy_by_hand():
    p = np.array([0.2, 0.5, 0.7, 0.45, 0.9], np.float32)
    y = np.array([0, 1, 1, 1, 0])
    # >= 0.5: decisions 0 1 1 0 1 -> right on frames 0, 1, 2 (0.5 itself is speech: > would give 40)
    assert score("frame_accuracy", [p], y) == pytest.approx(60.0)
    assert score("frame_accuracy", [p[:, None]], y) == pytest.approx(60.0)  # (N, 1) output
    assert score("frame_accuracy", [p], y[:, None]) == pytest.approx(60.0)  # (N, 1) labels
    # threshold 0.4 makes 0.45 speech: right on frames 0-3
    assert score("frame_accuracy", [p], y, threshold=0.4) == pytest.approx(80.0)
    logits = np.log(p / (1 - p))
    assert score("frame_accuracy", [logits], y, activation="sigmoid", threshold=0.4) == pytest.approx(80.0)


def test_frame_accuracy_per_frame_of_a_sample():
    p = np.array([[0.9, 0.1, 0.6, 0.6], [0.2, 0.8, 0.3, 0.3]], np.float32)
    y = np.array([[1, 0, 0, 0], [0, 1, 1, 1]])
    s = get_metric("frame_accuracy").evaluate([p], y)
    assert s.value == pytest.approx(100 * 4 / 8) and s.stats.tolist() == [[2, 4], [2, 4]]
    assert score("frame_accuracy", [p[..., None]], y) == pytest.approx(50.0)  # (N, T, 1)


def test_frame_accuracy_errors():
    with pytest.raises(MetricError, match=r"output shape\(s\) \(3, 2\), label shape \(3,\).*top1"):
        get_metric("frame_accuracy").evaluate([np.zeros((3, 2), np.float32)], np.array([0, 1, 1]))
    with pytest.raises(MetricError, match=r"label shape \(2,\)"):
        get_metric("frame_accuracy").evaluate([np.zeros((3,), np.float32)], np.array([0, 1]))
    with pytest.raises(MetricError, match="0/1 labels; the labels also hold 2") as e:
        get_metric("frame_accuracy").evaluate([np.zeros((3,), np.float32)], np.array([0, 1, 2]))
    assert "binarize" in e.value.hint


def test_paired_statistics_use_the_per_sample_stats():
    rng = np.random.default_rng(0)
    n = 200
    y = rng.integers(0, 2, n)
    p = np.where(y == 1, 0.8, 0.2) + rng.uniform(-0.1, 0.1, n)
    worse = p.copy()
    worse[:40] = 1 - worse[:40]  # 40 frames flipped: 20 points worse
    d = paired_drop(get_metric("frame_accuracy"), [p], [worse], y)
    assert d.drop == pytest.approx(20.0) and d.significant and "bootstrap" in d.method


# --- through the deploy's own path -----------------------------------------------------------------
def test_metric_options_from_a_recipe_reach_the_eval_plan(tmp_path):
    """recipe `metric: {name, options}` -> resolve_metric_spec -> eval_plan on a real ONNX model (a
    sigmoid head: logits in, probability map out), as `edgekit deploy --recipe` scores every variant."""
    import onnx
    from onnx import TensorProto, helper

    from edgekit.inputs.data import load_npz
    from edgekit.inputs.recipe import load_recipe
    from edgekit.inputs.source import load_source
    from edgekit.metrics.evaluate import eval_plan
    from edgekit.orchestration.options import DeployOptions, resolve_metric_spec

    g = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["prob_map"])], "db_head",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                          [helper.make_tensor_value_info("prob_map", TensorProto.FLOAT, [1, 1, 4, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "det.onnx"))
    p, y = _masks()
    np.savez(tmp_path / "eval.npz", x=np.log(p / (1 - p)).astype(np.float32), y=y)
    (tmp_path / "recipe.yaml").write_text("metric: {name: mask_iou, options: {threshold: 0.5}}\n")

    src = load_source(tmp_path / "det.onnx", workdir=tmp_path)
    ds = load_npz(tmp_path / "eval.npz", x_key="x", y_key="y", require_labels=False, role="eval")
    spec = resolve_metric_spec(load_recipe(tmp_path / "recipe.yaml"), DeployOptions())
    plan = eval_plan(spec, src, ds)
    s = plan.score(plan.reference)
    assert s.metric == "mask_iou" and s.value == pytest.approx(100 * (0.75 + 1) / 2)  # 0.5, not the default 0.3
    assert plan.accuracy_dict(s)["outputs"] == ["prob_map"] and plan.fingerprint()["options"] == {"threshold": 0.5}
    # --metric on the command line swaps the name and keeps the recipe's options
    spec = resolve_metric_spec(load_recipe(tmp_path / "recipe.yaml"), DeployOptions(metric="mask_f1"))
    assert eval_plan(spec, src, ds).score(plan.reference).value == pytest.approx(100 * (6 / 7 + 1) / 2)
    # a metric that does not fit the labels fails when the plan is built (exit 2), before any device time
    np.savez(tmp_path / "bad.npz", x=np.log(p / (1 - p)).astype(np.float32), y=y * 255)
    bad = load_npz(tmp_path / "bad.npz", x_key="x", y_key="y", require_labels=False, role="eval")
    with pytest.raises(MetricError, match="divide them by 255"):
        eval_plan(spec, src, bad)
    # --metric-option on the command line wins over the recipe's (as `edgekit deploy --metric-option` sets it)
    from edgekit.cli.common import parse_key_values

    opts = DeployOptions(metric_options=parse_key_values(["threshold=0.3"], "--metric-option"))
    spec = resolve_metric_spec(load_recipe(tmp_path / "recipe.yaml"), opts)
    assert spec.options == {"threshold": 0.3} and eval_plan(spec, src, ds).score(plan.reference).value != s.value


def test_metric_option_words_are_checked():
    from edgekit.cli.common import parse_key_values
    from edgekit.errors import BadInputError

    assert parse_key_values(["threshold=0.5", "activation=sigmoid", "blank=0"], "--metric-option") == \
        {"threshold": 0.5, "activation": "sigmoid", "blank": 0}
    with pytest.raises(BadInputError, match="is not KEY=VALUE"):
        parse_key_values(["threshold"], "--metric-option")
