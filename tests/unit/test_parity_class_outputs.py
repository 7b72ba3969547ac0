"""Parity's top-1 agreement is a classification check (#25): on a multi-output model it is held only on the
outputs that are class distributions; a regression head's argmax (box offsets, landmarks) is reported, not
held, while cosine still judges it. Seen on MTCNN's ONet: INT8 landmarks kept cosine 0.99 and "agreed" 0.906."""

from __future__ import annotations

import numpy as np

from edgekit.convert.parity import compare, compare_outputs, parity_metrics


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _heads(seed=0, n=200):
    rng = np.random.default_rng(seed)
    box = rng.normal(0, 0.05, (n, 4))  # small offsets: near-ties everywhere, argmax is noise
    marks = rng.uniform(0.3, 0.7, (n, 10))
    logits = rng.normal(0, 3, (n, 2))
    return box, marks, logits


def _int8_like(a, seed, scale):
    return a + np.random.default_rng(seed).normal(0, scale, a.shape)


def test_a_regression_head_of_a_multi_output_model_is_judged_by_cosine_not_argmax():
    box, marks, logits = _heads()
    refs = [box, marks, _softmax(logits)]
    gots = [_int8_like(box, 1, 0.012), _int8_like(marks, 2, 0.01), _softmax(_int8_like(logits, 3, 0.01))]
    res = compare_outputs(refs, gots, "onnx", ["box", "landmarks", "prob"])
    # the regression heads' argmax flips on noise (what made ONet's INT8 fail) ...
    assert res["box"].top1_agreement < 0.9 and res["box"].cosine > 0.95, res["box"]
    assert not res["box"].top1_held and not res["landmarks"].top1_held
    # ... and is reported, not held; the class distribution's is held
    assert res["prob"].distribution and res["prob"].top1_held
    m = parity_metrics(res, "int8")
    assert m["parity_violations"] == [], m["parity_violations"]
    assert m["parity_outputs"]["box"]["top1_held"] is False and m["parity_outputs"]["box"]["top1_agreement"] < 0.9


def test_a_class_distribution_that_flips_still_fails_top1():
    box, marks, logits = _heads()
    probs = _softmax(logits)
    swapped = probs[:, ::-1].copy()  # a wrong class order: every confident prediction flips
    res = compare_outputs([box, probs], [box, swapped], "onnx", ["box", "prob"])
    assert any("prob: top-1 agreement" in v for v in parity_metrics(res, "int8")["parity_violations"])


def test_log_softmax_rows_are_a_distribution_too():
    _, _, logits = _heads()
    logp = np.log(_softmax(logits))
    res = compare_outputs([logits[:, :1] * 0 + 1.0, logp], [logits[:, :1] * 0 + 1.0, logp[:, ::-1]], "onnx",
                          ["score", "logp"])
    assert res["logp"].distribution and res["logp"].top1_held
    assert any("logp: top-1" in v for v in parity_metrics(res, "int8")["parity_violations"])


def test_a_single_output_keeps_the_argmax_bar_whatever_its_values():
    _, _, logits = _heads()
    flipped = logits[:, ::-1].copy()  # raw logits of a classifier: not a distribution, still its prediction
    r = compare(logits, flipped, "onnx")
    assert not r.distribution and r.top1_held
    res = compare_outputs([logits], [flipped], "onnx", ["logits"])
    assert any("top-1 agreement" in v for v in parity_metrics(res, "fp32")["parity_violations"])


def test_non_negative_rows_that_do_not_sum_to_one_are_not_a_distribution():
    rng = np.random.default_rng(4)
    sig = 1 / (1 + np.exp(-rng.normal(0, 2, (100, 5))))  # multi-label sigmoid: argmax is not the prediction
    res = compare_outputs([sig, _softmax(sig)], [sig[:, ::-1], _softmax(sig)], "onnx", ["tags", "prob"])
    assert not res["tags"].distribution and not res["tags"].top1_held
    assert not any("tags: top-1" in v for v in parity_metrics(res, "fp16")["parity_violations"])
    # cosine still judges it: reversed columns are far off
    assert any("tags: cosine" in v for v in parity_metrics(res, "fp16")["parity_violations"])


def test_search_int8_candidates_are_held_to_the_breakage_bar_and_convert_to_the_int8_tolerances():
    """A search's INT8 TFLite candidates face the host check's metric next, so the converter drops only broken
    files (cosine < 0.8: the padded-pool breakage read 0.04-0.17); `edgekit convert` (no metric) keeps 0.95.
    PP-OCR's detector: full INT8 cosine 0.930 with mask IoU 0.77 below fp32, dropped at build before."""
    from edgekit.convert.onnx_to_tflite import TfliteConfig
    from edgekit.formats import FORMATS, Format

    spec = next(f for f in FORMATS if f.format == Format.TFLITE)
    int8 = {c.name: dict(c.passes[0][1]) for c in spec.search_candidates if "int8" in str(c.passes)}
    assert set(int8) == {"tflite-int8", "tflite-dynamic"} and all(c["parity_bar"] == "breakage" for c in int8.values())
    floats = {c.name: dict(c.passes[0][1]).get("parity_bar") for c in spec.search_candidates if "int8" not in str(c.passes)}
    assert floats == {"tflite-fp32": None, "tflite-fp16": "breakage"}  # fp32 keeps the fp32 bar
    assert TfliteConfig().parity_bar == "precision"  # edgekit convert, the recipe's convert step

    rng = np.random.default_rng(5)
    ref = rng.uniform(0, 1, (8, 1, 16, 16))
    near = ref + rng.normal(0, 0.22, ref.shape)  # cosine ~0.93, like the detector's INT8
    broken = rng.uniform(0, 1, ref.shape)  # unrelated values: cosine ~0.75
    for got, want_precision, want_breakage in ((near, True, False), (broken, True, True)):
        res = compare_outputs([ref], [got], "onnx", ["map"])
        assert bool(parity_metrics(res, "int8")["parity_violations"]) is want_precision, res
        assert bool(parity_metrics(res, "int8-breakage")["parity_violations"]) is want_breakage, res
