"""Deploy on models that are not one-input classifiers: two int64 inputs, per-pixel labels, several
outputs, no labels; each from the CLI with relative paths run from another working directory, and the
bad inputs of each (exit 2, the earlier report untouched)."""

from __future__ import annotations

import json
import os

import re

import numpy as np
import pytest
import torch
from torch import nn

from edgekit.report.model import Report

FAST = ("--runs", "5", "--min-seconds", "0", "--warmup", "1")


class TextClassifier(nn.Module):
    """Embedding + masked mean pooling: label = does token 7 occur among the unpadded tokens."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, input_ids, attention_mask):
        m = attention_mask.unsqueeze(-1).float()
        pooled = (self.emb(input_ids) * m).sum(1) / m.sum(1).clamp(min=1)
        return self.head(torch.relu(pooled))


class TinySeg(nn.Module):
    """Per-pixel logits (N, 3, 8, 8) and a second output (a global class score)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, padding=1)
        self.cls = nn.Linear(3, 2)

    def forward(self, x):
        logits = self.conv(x)
        return logits, self.cls(logits.mean(dim=(2, 3)))


def _text_data(n, rng):
    ids = rng.integers(0, 16, (n, 6)).astype(np.int64)
    mask = np.ones((n, 6), np.int64)
    for i in range(n):
        mask[i, rng.integers(2, 7):] = 0
    ids = np.where(mask == 1, ids, 0)
    y = ((ids == 7) & (mask == 1)).any(1).astype(np.int64)
    return ids, mask, y


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    d = tmp_path_factory.mktemp("task-models")
    text = TextClassifier()
    ids, mask, y = _text_data(600, rng)
    opt = torch.optim.Adam(text.parameters(), 0.05)
    for _ in range(150):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(text(torch.from_numpy(ids), torch.from_numpy(mask)), torch.from_numpy(y))
        loss.backward()
        opt.step()
    text.eval()
    torch.export.save(torch.export.export(text, (torch.from_numpy(ids[:1]), torch.from_numpy(mask[:1]))), d / "text.pt2")
    ids, mask, y = _text_data(64, rng)
    np.savez(d / "text-eval.npz", input_ids=ids, attention_mask=mask, y=y)
    np.savez(d / "text-eval-other-names.npz", tokens=ids, mask=mask, y=y)

    seg = TinySeg().eval()
    x = rng.standard_normal((24, 1, 8, 8)).astype(np.float32)
    with torch.no_grad():
        labels = seg(torch.from_numpy(x))[0].argmax(1).numpy()
    labels[:, 0, 0] = 255  # ignored pixels
    torch.export.save(torch.export.export(seg, (torch.from_numpy(x[:1]),)), d / "seg.pt2")
    np.savez(d / "seg-eval.npz", x=x, y=labels.astype(np.int64))
    np.savez(d / "seg-nolabels.npz", x=x)
    return d


@pytest.fixture
def elsewhere(tmp_path, models):
    """Run from another working directory with relative paths, as a user types them."""
    work = tmp_path / "work"
    work.mkdir()
    for p in models.iterdir():
        (work / p.name).symlink_to(p)
    old = os.getcwd()
    os.chdir(work)
    yield work
    os.chdir(old)


def test_two_int64_inputs_by_x_key_and_by_name(cli, elsewhere):
    r = cli("deploy", "text.pt2", "--eval-data", "text-eval-other-names.npz", "--x-key", "tokens,mask",
            "--out", "results/run1", *FAST)
    assert r.exit_code == 0, r.stderr
    rep = Report.load(elsewhere / "results/run1/report.json")
    assert rep.settings["eval_inputs"] == ["tokens", "mask"]
    base = rep.variant("fp32")
    assert base.accuracy.metric == "top1" and base.accuracy.value > 80, base.accuracy  # it learned the task
    assert base.parity.max_abs_err < 1e-4
    # arrays named like the model's inputs need no --x-key
    r2 = cli("deploy", "text.pt2", "--eval-data", "text-eval.npz", "--out", "results/run2", *FAST, "--no-search")
    assert r2.exit_code == 0, r2.stderr
    assert Report.load(elsewhere / "results/run2/report.json").settings["eval_inputs"] == ["input_ids", "attention_mask"]
    # names that match no input: exit 2 naming both, and the report of run1 stays as it was
    before = (elsewhere / "results/run1/report.json").read_bytes()
    r3 = cli("deploy", "text.pt2", "--eval-data", "text-eval-other-names.npz", "--out", "results/run1", *FAST)
    assert r3.exit_code == 2 and "input_ids" in r3.stderr and "--x-key" in r3.stderr, r3.stderr
    assert (elsewhere / "results/run1/report.json").read_bytes() == before


def test_segmentation_with_per_pixel_labels_scores_miou_and_every_output(cli, elsewhere):
    # the default top-1 does not fit per-pixel labels: exit 2 before any device time, naming both shapes
    r = cli("deploy", "seg.pt2", "--eval-data", "seg-eval.npz", "--out", "seg-out", *FAST)
    assert r.exit_code == 2 and "(24, 3, 8, 8)" in r.stderr and "(24, 8, 8)" in r.stderr and "--metric" in r.stderr
    assert not (elsewhere / "seg-out" / "report.json").exists()
    r = cli("deploy", "seg.pt2", "--eval-data", "seg-eval.npz", "--metric", "miou", "--out", "seg-out", *FAST,
            "--no-search")  # the fixed default variants: int8-dynamic is judged below
    assert r.exit_code in (0, 1), r.stderr
    rep = Report.load(elsewhere / "seg-out/report.json")
    base = rep.variant("fp32")
    assert base.accuracy.metric == "miou" and base.accuracy.units == "%" and base.accuracy.outputs == ["output_0"]
    assert base.accuracy.value == pytest.approx(100.0)  # labels are the float model's own argmax
    assert set(base.parity_outputs) == {"output_0", "output_1"}  # every output came back and was compared
    check = next(c for c in rep.gate.checks if c.name == "accuracy_drop")
    assert "miou" in check.message and "95% CI" in check.message
    v = rep.variant("int8-dynamic")
    assert v.accuracy_stats["ci95"][0] <= v.accuracy_drop <= v.accuracy_stats["ci95"][1]
    md = (elsewhere / "seg-out/report.md").read_text()
    assert "miou %" in md and "Parity per output" in md and "output_1" in md
    # the second output by name, with a metric that fits it... and an output that does not exist
    bad = cli("deploy", "seg.pt2", "--eval-data", "seg-eval.npz", "--metric", "miou", "--output", "masks",
              "--out", "seg-out", *FAST)
    assert bad.exit_code == 2 and "output_0, output_1" in bad.stderr


def test_no_labels_scores_against_the_float_model(cli, elsewhere):
    r = cli("deploy", "seg.pt2", "--eval-data", "seg-nolabels.npz", "--out", "nolab", *FAST)
    assert r.exit_code == 2 and "needs labels" in r.stderr and "mse" in r.stderr
    r = cli("deploy", "seg.pt2", "--eval-data", "seg-nolabels.npz", "--metric", "mse", "--max-metric-drop", "0.5",
            "--out", "nolab", *FAST, "--no-search")
    assert r.exit_code == 0, r.stdout + r.stderr
    doc = json.loads((elsewhere / "nolab/report.json").read_text())
    base = next(v for v in doc["variants"] if v["name"] == "fp32")
    q = next(v for v in doc["variants"] if v["name"] == "int8-dynamic")
    assert base["accuracy"]["against"] == "reference" and base["accuracy"]["direction"] == "lower"
    assert base["accuracy"]["value"] < 1e-8  # fp32 ONNX vs PyTorch: float rounding only
    assert q["accuracy_drop"] == pytest.approx(q["accuracy"]["value"] - base["accuracy"]["value"], abs=1e-6)
    assert q["accuracy_drop"] > 0  # INT8 strays further from the float model: worse, in MSE units
    assert doc["settings"]["metric"]["name"] == "mse"
    # the same drop fails a tolerance below it
    r = cli("deploy", "seg.pt2", "--eval-data", "seg-nolabels.npz", "--metric", "mse", "--max-metric-drop",
            f"{q['accuracy_drop'] / 10:.3g}", "--out", "nolab2", *FAST, "--no-search")
    assert r.exit_code == 1 and "mse" in r.stdout


def test_unknown_metric_lists_the_known_ones(cli, elsewhere):
    r = cli("deploy", "seg.pt2", "--eval-data", "seg-eval.npz", "--metric", "iou", "--out", "x", *FAST)
    assert r.exit_code == 2 and "unknown metric 'iou'" in r.stderr and "miou" in r.stderr
    assert not (elsewhere / "x" / "report.json").exists()


@pytest.mark.slow
def test_search_on_a_segmenter_from_a_relative_out_ships_within_the_miou_tolerance(cli, elsewhere):
    """--search with a task metric from a relative --out: TFLite candidates are built (not lost to the
    cwd), every candidate is judged on mIoU, the shipped file exists and its drop is inside tolerance."""
    r = cli("deploy", "seg.pt2", "--eval-data", "seg-eval.npz", "--calib-data", "seg-eval.npz", "--metric", "miou",
            "--max-metric-drop", "5", "--eval-samples", "16", "--search", "--out", "results/s1", *FAST)
    assert r.exit_code in (0, 1), r.stdout + r.stderr
    rep = json.loads((elsewhere / "results/s1/report.json").read_text())
    assert rep["settings"]["metric"]["name"] == "miou" and rep["settings"]["eval_subset"]["n"] == 16
    cands = {c["name"]: c for c in rep["search"]["candidates"]}
    tfl = [c for n, c in cands.items() if n.startswith("tflite")]
    assert tfl and all(c["status"] != "dropped" or c["dropped_at"] != "build" for c in tfl), tfl
    sel = rep["search"]["selected"]
    assert sel is not None
    v = next(v for v in rep["variants"] if v["name"] == sel)
    assert v["accuracy"]["metric"] == "miou" and v["accuracy_drop"] <= 5 + 1e-9
    assert (elsewhere / rep["search"]["shipped"]["file"]).is_file()


def test_a_folder_of_npy_shards_gives_the_same_metric_and_is_not_resent(cli, elsewhere, models):
    """Eval data as a folder of shards: memory-mapped, delivered shard by shard (an unchanged shard is not
    sent again), scored to the same value as the .npz holding the same samples."""
    ev = np.load(models / "text-eval.npz")
    d = elsewhere / "shards"
    d.mkdir()
    for i, sl in enumerate((slice(0, 20), slice(20, 45), slice(45, 64))):
        for k in ("input_ids", "attention_mask", "y"):
            np.save(d / f"{k}.{i:05d}.npy", ev[k][sl])
    r = cli("deploy", "text.pt2", "--eval-data", "shards", "--out", "sh1", *FAST)
    assert r.exit_code == 0, r.stderr
    r2 = cli("deploy", "text.pt2", "--eval-data", "text-eval.npz", "--out", "npz1", *FAST)
    assert r2.exit_code == 0, r2.stderr
    a, b = Report.load(elsewhere / "sh1/report.json"), Report.load(elsewhere / "npz1/report.json")
    assert a.variant("fp32").accuracy.value == b.variant("fp32").accuracy.value
    assert a.variant("fp32").accuracy.n == 64
    assert a.variant("fp32").parity.max_abs_err < 1e-4
    # again: nothing of the eval set is sent a second time (content-addressed shards)
    # (a model or a request may differ from the first run's: the short search can pick another setting)
    # 3 shards x 2 inputs (the labels stay on the host)
    assert Report.load(elsewhere / "sh1/report.json").settings["delivery"]["sent_by_kind"]["eval"] == 6
    r3 = cli("deploy", "text.pt2", "--eval-data", "shards", "--out", "sh2", *FAST)
    assert r3.exit_code == 0
    assert Report.load(elsewhere / "sh2/report.json").settings["delivery"]["sent_by_kind"].get("eval", 0) == 0
    # a shard missing for one array is refused, naming the shards
    (d / "y.00002.npy").unlink()
    bad = cli("deploy", "text.pt2", "--eval-data", "shards", "--out", "sh3", *FAST)
    assert bad.exit_code == 2 and "different shards" in bad.stderr


def test_shards_at_several_shapes_for_a_fixed_shape_model_are_refused_by_name_and_nothing_is_written(cli, elsewhere,
                                                                                                      models):
    """Text lines of two lengths as two shards (shape buckets) for a model exported at one length: exit 2
    naming the bucket, its shard and both shapes, before any build or device time; no partial output folder.
    (A model with dynamic axes scores them: tests/unit/test_shape_buckets.py.)"""
    ev = np.load(models / "text-eval.npz")
    d = elsewhere / "buckets"
    d.mkdir()
    for i, (sl, width) in enumerate(((slice(0, 32), None), (slice(32, 64), 4))):
        for k in ("input_ids", "attention_mask", "y"):
            a = ev[k][sl]
            np.save(d / f"{k}.{i:05d}.npy", a[:, :width] if width and k != "y" else a)
    bad = cli("deploy", "text.pt2", "--eval-data", "buckets", "--out", "bk1", *FAST)
    want = ev["input_ids"].shape[1:]
    assert bad.exit_code == 2, bad.stderr
    assert re.search(r"samples have shape \(4,\) \(shards 1, one of 2 shape buckets: .*\), the model input "
                     rf"'input_ids' takes \({want[0]},\)", bad.stderr), bad.stderr
    assert "dynamic axes" in bad.stderr and "Traceback" not in bad.stderr
    assert not (elsewhere / "bk1" / "report.json").exists()
    # labels of two lengths (padded per shard) are named as labels
    for i, n in ((0, 3), (1, 5)):
        np.save(d / f"input_ids.{i:05d}.npy", ev["input_ids"][:4])
        np.save(d / f"attention_mask.{i:05d}.npy", ev["attention_mask"][:4])
        np.save(d / f"y.{i:05d}.npy", -np.ones((4, n), np.int64))
    bad = cli("deploy", "text.pt2", "--eval-data", "buckets", "--out", "bk2", *FAST)
    assert bad.exit_code == 2 and "array 'y' has labels of shape (3,) in shard 0 and (5,) in shard 1" in bad.stderr
    assert "pad the labels to one length" in bad.stderr
