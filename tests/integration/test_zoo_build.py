"""The transformers zoo (tests/zoo): every model builds, re-loads from its .pt2, scores well above
an input-ignoring baseline on its eval set, and follows the I/O conventions edgekit's tests rely on.

The builds take minutes on 2 cores the first time (then the cache answers in milliseconds), so the
tests that need them are slow; the cache's own behaviour is tested fast with a stand-in builder."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests import zoo
from tests.zoo import cache, metrics

# Floors on the fp32 metric, each far above what a model that ignores its input scores (that
# baseline is also computed from the data in test_builds_and_scores):
# - 4-class top1 on 160 balanced-ish samples: chance 0.25, sd sqrt(.25*.75/160) = 0.034, so 0.6 is
#   10 sd above chance; binary text top1: chance 0.5, sd 0.04, 0.8 is 7.5 sd above.
# - seg miou: one class everywhere scores at most (its pixel share)/3 <= 1/3; 0.6 is well above.
# - det map50: one fixed set of 64 boxes for every image matches few squares at IoU 0.5 (~0.0x);
#   0.5 needs real localisation and classification.
FLOORS = {"cnn": 0.6, "hybrid": 0.6, "text": 0.8, "audio": 0.6, "seg": 0.6, "det": 0.5}


def _outputs(program, inputs: dict[str, np.ndarray], names: list[str]) -> tuple[np.ndarray, ...]:
    """Run an exported program (static batch 1) sample by sample."""
    import torch

    mod = program.module()
    outs = []
    with torch.no_grad():
        for i in range(len(inputs[names[0]])):
            outs.append(mod(*(torch.from_numpy(inputs[k][i:i + 1]) for k in names)))
    return tuple(np.concatenate([o[j].numpy() for o in outs]) for j in range(len(outs[0])))


@pytest.mark.slow
@pytest.mark.parametrize("name", zoo.NAMES)
def test_builds_and_scores(name):
    import torch

    m = zoo.get(name)
    facts = m.facts
    assert facts["name"] == name and facts["class"].startswith("transformers.")
    program = torch.export.load(str(m.pt2))
    user_inputs = [s.arg.name for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    assert user_inputs == m.input_names, "graph inputs must be named like the npz arrays"
    for split in (m.eval, m.calib, m.train):
        with np.load(split) as npz:
            assert sorted(npz.files) == sorted([*m.input_names, "y"]), split
    with np.load(m.eval) as npz:
        x = {k: npz[k] for k in m.input_names}
        y = npz["y"]
    outs = _outputs(program, x, m.input_names)
    assert len(outs) == len(m.output_names)
    for o, spec in zip(outs, facts["outputs"]):
        assert list(o.shape[1:]) == spec["shape"][1:]
    value = metrics.METRICS[m.metric](outs, y)
    assert value == pytest.approx(facts["metric_fp32"], abs=0.02), "the .pt2 should score like the eager model did"
    ignoring = metrics.METRICS[m.metric](tuple(np.repeat(o[:1], len(y), axis=0) for o in outs), y)
    assert value >= FLOORS[name], f"{name}: {m.metric}={value:.3f} (input-ignoring baseline {ignoring:.3f})"
    assert value >= ignoring + 0.25, f"{name}: {m.metric}={value:.3f} vs input-ignoring {ignoring:.3f}"


@pytest.mark.slow
def test_det_follows_the_detr_convention():
    import torch

    m = zoo.get("det")
    with np.load(m.eval) as npz:
        x, y = npz["pixel_values"], npz["y"]
    assert x.dtype == np.float32 and x.shape[1:] == (3, 64, 64)
    assert y.dtype == np.float32 and y.ndim == 3 and y.shape[2] == 5 and len(y) == len(x)
    cls = y[..., 0]
    assert set(np.unique(cls)) <= {-1.0, 0.0, 1.0, 2.0}
    assert ((cls >= 0).sum(1) >= 1).all(), "every image holds at least one object"
    real = y[cls >= 0][:, 1:]
    assert (real >= 0).all() and (real <= 1).all()
    assert (real[:, 0] - real[:, 2] / 2 >= -1e-6).all() and (real[:, 0] + real[:, 2] / 2 <= 1 + 1e-6).all()
    logits, boxes = _outputs(torch.export.load(str(m.pt2)), {"pixel_values": x[:32]}, ["pixel_values"])
    q = m.facts["outputs"][0]["shape"][1]
    assert logits.shape == (32, q, 3 + 1), "C real classes + the last 'no object' class"
    assert boxes.shape == (32, q, 4)
    assert (boxes >= 0).all() and (boxes <= 1).all(), "boxes are normalised (cx, cy, w, h)"
    # the last class really is "no object": most of the 64 cells of an image hold no square
    assert (logits.argmax(-1) == 3).mean() > 0.8


@pytest.mark.slow
def test_text_inputs_are_int64_with_real_padding():
    import torch

    m = zoo.get("text")
    with np.load(m.eval) as npz:
        ids, mask, y = npz["input_ids"], npz["attention_mask"], npz["y"]
    assert ids.dtype == np.int64 and mask.dtype == np.int64 and ids.shape == mask.shape == (len(y), 16)
    lengths = mask.sum(1)
    assert lengths.min() < 16 and len(np.unique(lengths)) > 5, "padding varies across samples"
    assert (mask[:, :-1] >= mask[:, 1:]).all(), "right padding"
    assert (ids[mask == 0] == 0).all() and (ids[mask == 1] > 0).all()
    assert set(np.unique(y)) == {0, 1}
    # The mask is honoured: writing the key token (7) into padded positions changes no prediction.
    program = torch.export.load(str(m.pt2))
    n = 64
    base = _outputs(program, {"input_ids": ids[:n], "attention_mask": mask[:n]}, m.input_names)[0]
    poisoned = np.where(mask[:n] == 0, 7, ids[:n])
    after = _outputs(program, {"input_ids": poisoned, "attention_mask": mask[:n]}, m.input_names)[0]
    assert (base.argmax(1) == after.argmax(1)).all()
    np.testing.assert_allclose(base, after, atol=1e-4)


def test_get_rejects_unknown_names():
    with pytest.raises(KeyError, match="known: cnn"):
        zoo.get("nope")


def test_cache_builds_once_across_concurrent_callers(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_ZOO_CACHE", str(tmp_path))
    calls = []

    def build(d: Path):
        calls.append(d)
        time.sleep(0.3)  # long enough for the second caller to reach the lock
        for f in cache.FILES:
            (d / f).write_text(f)

    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.ensure("fake", build))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert results[0] == results[1] == tmp_path / cache.key() / "fake"
    assert cache.complete(results[0])
    assert cache.ensure("fake", build) == results[0] and len(calls) == 1
    assert not list((tmp_path / cache.key()).glob(".tmp-*"))


def test_cache_leaves_nothing_behind_when_a_build_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_ZOO_CACHE", str(tmp_path))

    def broken(d: Path):
        (d / "model.pt2").write_text("half")
        raise RuntimeError("training diverged")

    with pytest.raises(RuntimeError, match="diverged"):
        cache.ensure("fake", broken)
    base = tmp_path / cache.key()
    assert not (base / "fake").exists() and not list(base.glob(".tmp-*"))
