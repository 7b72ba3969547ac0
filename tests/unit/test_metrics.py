"""Built-in metrics against hand-computed values, user metrics, bad input, and paired statistics."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from edgekit.metrics import MetricError, MetricSpec, get_metric, known_metrics
from edgekit.metrics.paired import paired_drop
from edgekit.metrics.registry import select_outputs


def score(name, outputs, labels, **opts):
    return get_metric(name, opts).evaluate(outputs, labels).value


def test_top1_and_topk_by_hand():
    logits = np.array([[3, 1, 0], [0, 2, 1], [1, 0, 2], [2, 3, 0]], np.float32)
    y = np.array([0, 2, 2, 0])
    assert score("top1", [logits], y) == pytest.approx(50.0)  # samples 0 and 2
    assert score("top2", [logits], y) == pytest.approx(100.0)  # 1 (2 is 2nd) and 3 (0 is 2nd) join
    assert score("top1", [logits], y.reshape(-1, 1)) == pytest.approx(50.0)


def test_pixel_accuracy_and_miou_by_hand():
    # one 2x2 image, 2 classes; prediction [[0,1],[1,1]], truth [[0,0],[1,1]]
    logits = np.zeros((1, 2, 2, 2), np.float32)
    pred = np.array([[0, 1], [1, 1]])
    logits[0, 1] = pred  # class 1 wins where pred == 1
    logits[0, 0] = 1 - pred
    y = np.array([[[0, 0], [1, 1]]])
    assert score("pixel_accuracy", [logits], y) == pytest.approx(75.0)
    # class 0: I=1 U=2 -> .5; class 1: I=2 U=3 -> .667; mean 58.33
    assert score("miou", [logits], y) == pytest.approx(100 * (0.5 + 2 / 3) / 2)
    # channels-last logits give the same (a third, never-winning class keeps C != H), and ignored pixels
    # do not count
    three = np.concatenate([logits, np.full((1, 1, 2, 2), -9.0, np.float32)], axis=1)
    assert score("miou", [three.transpose(0, 2, 3, 1)], y) == pytest.approx(100 * (0.5 + 2 / 3) / 2)
    y_ign = y.copy()
    y_ign[0, 0, 1] = 255  # the wrong pixel is ignored
    assert score("pixel_accuracy", [logits], y_ign) == pytest.approx(100.0)


def _det(boxes_per_image, classes=2, q=4):
    """DETR-style outputs from [(class, score, cx, cy, w, h), ...] per image."""
    n = len(boxes_per_image)
    logits = np.full((n, q, classes + 1), -8.0)
    logits[..., -1] = 8.0  # no object
    boxes = np.zeros((n, q, 4))
    for i, dets in enumerate(boxes_per_image):
        for j, (c, s, *b) in enumerate(dets):
            logits[i, j] = -8.0
            logits[i, j, c] = np.log(s / (1 - s)) if 0 < s < 1 else 8.0
            boxes[i, j] = b
    return [logits.astype(np.float32), boxes.astype(np.float32)]


def test_map_by_hand():
    y = -np.ones((2, 2, 5), np.float32)
    y[0, 0] = [0, .5, .5, .2, .2]
    y[1, 0] = [0, .3, .3, .2, .2]
    y[1, 1] = [1, .7, .7, .2, .2]
    perfect = _det([[(0, .9, .5, .5, .2, .2)], [(0, .9, .3, .3, .2, .2), (1, .8, .7, .7, .2, .2)]])
    assert score("map50", perfect, y) == pytest.approx(100.0)
    # class 1 box shifted so IoU = 1/3 < 0.5: class 1 AP 0, class 0 AP 1 -> 50
    shifted = _det([[(0, .9, .5, .5, .2, .2)], [(0, .9, .3, .3, .2, .2), (1, .8, .8, .7, .2, .2)]])
    assert score("map50", shifted, y) == pytest.approx(50.0)
    # a high-scoring false positive before the true class-0 hits: precision 1/2 at recall 1/2, 2/3 at 1
    fp = _det([[(0, .95, .1, .1, .1, .1), (0, .9, .5, .5, .2, .2)], [(0, .85, .3, .3, .2, .2), (1, .8, .7, .7, .2, .2)]])
    ap0 = (51 * (2 / 3) + 50 * (2 / 3)) / 101  # envelope: 2/3 everywhere up to recall 1
    assert score("map50", fp, y) == pytest.approx(100 * (ap0 + 1.0) / 2, abs=1e-6)
    # mAP@.5:.95 of an exact match is 100; a slightly loose box loses the strict thresholds
    assert score("map50_95", perfect, y) == pytest.approx(100.0)
    loose = _det([[(0, .9, .5, .5, .22, .22)], [(0, .9, .3, .3, .2, .2), (1, .8, .7, .7, .2, .2)]])
    assert 50 < score("map50_95", loose, y) < 100


def test_map_with_a_user_postprocess(tmp_path, monkeypatch):
    mod = tmp_path / "post.py"
    mod.write_text(textwrap.dedent("""
        import numpy as np
        def decode(outputs):  # outputs: [boxes (N,K,4), scores (N,K), classes (N,K)]
            b, s, c = outputs
            return [(b[i], s[i], c[i]) for i in range(len(b))]
    """))
    y = -np.ones((1, 1, 5), np.float32)
    y[0, 0] = [1, .5, .5, .2, .2]
    outs = [np.array([[[.5, .5, .2, .2]]]), np.array([[.9]]), np.array([[1]])]
    m = get_metric("map50", postprocess=f"{mod}:decode")
    assert m.evaluate(outs, y).value == pytest.approx(100.0)


def test_regression_metrics_by_hand():
    out = np.array([[1.0, 2.0], [3.0, 5.0]])
    tgt = np.array([[1.0, 2.0], [3.0, 4.0]])
    assert score("mse", [out], tgt) == pytest.approx(0.25)
    assert score("mae", [out], tgt) == pytest.approx(0.25)
    # peak = range of the target = 3 -> 10 log10(9 / .25)
    assert score("psnr", [out], tgt) == pytest.approx(10 * np.log10(9 / 0.25))
    assert score("snr", [out], tgt) == pytest.approx(10 * np.log10(30 / 1.0))
    c2 = (3 * 3 + 5 * 4) / (np.hypot(3, 5) * np.hypot(3, 4))
    assert score("cosine", [out], tgt) == pytest.approx((1.0 + c2) / 2)
    assert score("psnr", [tgt], tgt) == 200.0  # identical: capped, not infinite


def test_multilabel_f1_by_hand():
    logits = np.array([[5, -5, 5], [-5, 5, -5]], np.float32)  # predicts {0,2}, {1}
    y = np.array([[1, 0, 0], [0, 1, 1]])  # tp=2 (0 and 1), fp=1 (2 in sample 0), fn=1 (2 in sample 1)
    assert score("multilabel_f1", [logits], y) == pytest.approx(100 * 4 / 6)


def test_user_metric_function_and_direction(tmp_path):
    mod = tmp_path / "mymetrics.py"
    mod.write_text(textwrap.dedent("""
        import numpy as np
        def wer(outputs, labels):
            pred = outputs[0].argmax(-1)
            return (pred != labels).mean(axis=1) * 100.0   # one score per sample
        wer.direction = "lower"
        wer.units = "%"
        def broken(outputs, labels):
            raise ValueError("boom")
    """))
    m = get_metric(f"{mod}:wer")
    out = np.zeros((2, 3, 4), np.float32)
    out[0, :, 1] = 1
    out[1, :, 2] = 1
    labels = np.array([[1, 1, 1], [2, 0, 0]])
    s = m.evaluate([out], labels)
    assert s.value == pytest.approx((0 + 200 / 3) / 2) and s.direction == "lower" and s.stats is not None
    assert m.worse_by(10.0, 12.0) == pytest.approx(2.0)  # lower is better: higher error is worse
    with pytest.raises(MetricError, match="boom"):
        get_metric(f"{mod}:broken").evaluate([out], labels)


def test_bad_metric_inputs_name_the_fix():
    with pytest.raises(MetricError) as e:
        get_metric("accuracy@1")
    assert "known metrics" in e.value.hint and "miou" in e.value.hint
    with pytest.raises(MetricError, match=r"output shape\(s\) \(4, 3, 8, 8\).*label shape \(4,\)"):
        get_metric("miou").evaluate([np.zeros((4, 3, 8, 8))], np.zeros(4, np.int64))
    with pytest.raises(MetricError, match="needs labels") as e:
        get_metric("top1").evaluate([np.zeros((4, 3))], None)
    assert "mse" in e.value.hint  # names the metrics that need none
    with pytest.raises(MetricError, match="no such output") as e:
        select_outputs(get_metric("top1"), MetricSpec(outputs=["boxes"]), ["logits", "pred_boxes"])
    assert "logits, pred_boxes" in e.value.hint
    assert select_outputs(get_metric("map50"), None, ["logits", "pred_boxes", "aux"]) == [0, 1]
    assert {"top1", "top5", "pixel_accuracy", "miou", "map50", "map50_95", "mse", "mae", "psnr", "snr", "cosine",
            "multilabel_f1"} <= set(known_metrics())


def test_paired_drop_within_noise_and_significant():
    rng = np.random.default_rng(0)
    n = 300
    y = rng.integers(0, 4, n)
    logits = rng.standard_normal((n, 4))
    logits[np.arange(n), y] += 1.5  # ~75% top-1
    m = get_metric("top1")
    # within noise: 3 samples flip each way (a 0-point change) plus 1 net loss
    var = logits.copy()
    right = np.where(logits.argmax(1) == y)[0]
    wrong = np.where(logits.argmax(1) != y)[0]
    for i in right[:4]:
        var[i] = np.roll(var[i], 1)
    for i in wrong[:3]:
        var[i, y[i]] = 99
    d = paired_drop(m, [logits], [var], y)
    assert d.drop == pytest.approx(100 / n, abs=1e-9) and not d.significant and d.ci95[0] < 0 < d.ci95[1]
    assert d.p_value > 0.5 and "McNemar" in d.method
    assert d.resolution > 1.0  # 300 samples at ~75%: cannot resolve a 1-point change (the example)
    # significant: 30 of the right answers broken
    bad = logits.copy()
    for i in right[:30]:
        bad[i] = np.roll(bad[i], 1)
    d2 = paired_drop(m, [logits], [bad], y)
    assert d2.drop == pytest.approx(10.0) and d2.significant and d2.ci95[0] > 0 and d2.p_value < 1e-6


def test_paired_drop_for_a_lower_is_better_and_a_rescored_metric():
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((200, 8))
    near = ref + 0.01 * rng.standard_normal(ref.shape)
    far = ref + 0.5 * rng.standard_normal(ref.shape)
    m = get_metric("mse")
    d = paired_drop(m, [near], [far], ref)
    assert d.drop > 0 and d.significant  # the far variant's error is larger: worse
    # mAP is re-scored on resamples; an identical pair is an exact zero with no significance
    y = -np.ones((20, 1, 5), np.float32)
    y[:, 0] = [0, .5, .5, .2, .2]
    outs = _det([[(0, .9, .5, .5, .2, .2)]] * 20)
    dm = paired_drop(get_metric("map50"), outs, outs, y, resamples=50)
    assert dm.drop == 0 and not dm.significant and "re-scored" in dm.method
