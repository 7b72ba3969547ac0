"""Eval data at several sample shapes (shape buckets): text lines of two widths as shards of a folder,
deployed as a user types it against an ONNX model whose width is dynamic. Every bucket is scored (the
metric joins the buckets' per-sample statistics), latency is measured per bucket and weighted by sample
count, fixed-shape files are dropped naming the shapes, and the shipped file re-scores the report."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

FAST = ("--runs", "5", "--min-seconds", "0", "--warmup", "1")
WIDTHS = {16: 40, 8: 24}  # width -> samples: width 16 is the most common shape (bucket 0)


def _model(path, state: bool = False) -> None:
    """x (N, 1, 4, W), W dynamic -> Conv (kernel 4x3) -> mean over W -> logits (N, 5); ``state``: also an
    input ``state`` (1, 5) and an output ``stateN`` = state + logits (a stream's state)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((5, 1, 4, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[0, 1, 0, 1]),
             helper.make_node("ReduceMean", ["c"], ["logits"], axes=[2, 3], keepdims=0)]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1, 4, "width"])]
    outs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 5])]
    if state:
        nodes.append(helper.make_node("Add", ["state", "logits"], ["stateN"]))
        ins.append(helper.make_tensor_value_info("state", TensorProto.FLOAT, [1, 5]))
        outs.append(helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [1, 5]))
    g = helper.make_graph(nodes, "lines", ins, outs, [w, b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, str(path))


@pytest.fixture
def lines(tmp_path, monkeypatch):
    """model.onnx and lines/ (x.0000K.npy, y.0000K.npy: shards 0 and 2 at width 16, shard 1 at width 8)."""
    monkeypatch.chdir(tmp_path)
    _model(tmp_path / "model.onnx")
    sess = ort.InferenceSession(str(tmp_path / "model.onnx"))
    rng = np.random.default_rng(1)
    d = tmp_path / "lines"
    d.mkdir()
    for shard, (width, n) in enumerate(((16, 20), (8, 24), (16, 20))):
        x = rng.standard_normal((n, 1, 4, width)).astype(np.float32)
        y = sess.run(None, {"x": x})[0].argmax(1)
        y[::4] = (y[::4] + 1) % 5  # a quarter mislabelled: the metric is not 100 by construction
        np.save(d / f"x.{shard:05d}.npy", x)
        np.save(d / f"y.{shard:05d}.npy", y.astype(np.int64))
    return tmp_path


def _by_hand(where, run) -> tuple[float, int]:
    """top1 over every shard with the given runner (x -> logits), as a user would score it."""
    hits = n = 0
    for shard in range(3):
        x, y = np.load(where / f"lines/x.{shard:05d}.npy"), np.load(where / f"lines/y.{shard:05d}.npy")
        hits += int((run(x).argmax(1) == y).sum())
        n += len(y)
    return 100.0 * hits / n, n


def test_eval_data_at_two_widths_is_scored_per_bucket_timed_per_bucket_and_reshipped(cli, lines):
    r = cli("deploy", "model.onnx", "--target", "local", "--eval-data", "lines", "--out", "out", *FAST)
    assert r.exit_code in (0, 1), r.stdout + r.stderr
    rep = json.loads((lines / "out/report.json").read_text())
    buckets = rep["settings"]["eval_shape_buckets"]
    assert [(b["shapes"], b["samples"], b["shards"]) for b in buckets] == [([[1, 4, 16]], 40, [0, 2]),
                                                                          ([[1, 4, 8]], 24, [1])]
    assert rep["settings"]["eval_samples"] == 64
    said = " ".join((r.stdout + r.stderr).split())  # the summary says which shape the latency columns are at
    assert "2 sample shapes ((1, 4, 16) x40; (1, 4, 8) x24): every sample scored, latency columns at the first" in said
    sess = ort.InferenceSession(str(lines / "model.onnx"))
    want, n = _by_hand(lines, lambda x: sess.run(None, {"x": x})[0])
    fp32 = next(v for v in rep["variants"] if v["name"] == "fp32")
    assert fp32["accuracy"]["n"] == n and fp32["accuracy"]["value"] == pytest.approx(want, abs=1e-6)
    lat = fp32["latency_ms"]
    assert [(b["shapes"], b["samples"]) for b in lat["buckets"]] == [([[1, 4, 16]], 40), ([[1, 4, 8]], 24)]
    assert all(b["runs"] >= 5 and b["p50"] > 0 for b in lat["buckets"])
    p50s = [b["p50"] for b in lat["buckets"]]
    assert lat["weighted_p50"] == pytest.approx((40 * p50s[0] + 24 * p50s[1]) / 64)
    assert lat["buckets"][0]["p50"] == pytest.approx(lat["p50"])  # bucket 0's are the main timed runs
    b0, b1 = lat["buckets"]  # bucket 1 timed on its own (its timings equal bucket 0's only if copied)
    assert (b1["p50"], b1["mean"]) != (b0["p50"], b0["mean"])
    assert fp32["parity"]["n"] == 64 and fp32["parity"]["buckets"] == 2
    # a file sized to one shape cannot score both: dropped at build, naming the shapes
    cands = {c["name"]: c for c in rep["search"]["candidates"]}
    fixed = [c for c in cands.values() if "takes one fixed shape" in (c.get("reason") or "")]
    assert fixed and all(c["dropped_at"] == "build" and "(1, 4, 16) (40 samples); (1, 4, 8) (24 samples)" in c["reason"]
                         for c in fixed), cands
    tried = [c["name"] for c in cands.values() if c["name"].startswith("tflite") and c["status"] != "skipped"]
    assert {"tflite-fp32", "tflite-dynamic"} <= set(tried) <= {f["name"] for f in fixed}, cands  # not at screening
    # every variant measured scored all 64 samples; the paired statistics read every bucket's rows
    for v in rep["variants"]:
        assert v["accuracy"]["n"] == 64 and "weighted_p50" in v["latency_ms"], v["name"]
        if v["name"] != "fp32":
            assert v["accuracy_stats"]["n"] == 64 and v["speedup_weighted"] > 0, v
    # the shipped file, from ship/ alone, scores what the report says, bucket by bucket
    from edgekit.orchestration.run_shipped import run_shipped

    ship = rep["decision"]["ship"]
    shipped = next(v for v in rep["variants"] if v["name"] == ship)
    got, _ = _by_hand(lines, lambda x: run_shipped(lines / "out/ship", {"x": x})["logits"])
    assert got == pytest.approx(shipped["accuracy"]["value"], abs=1e-6), (ship, got)
    measured = json.loads((lines / "out/ship/ship.json").read_text())["measured"]
    assert [(b["shapes"], b["samples"]) for b in measured["by_shape"]] == [([[1, 4, 16]], 40), ([[1, 4, 8]], 24)]
    assert measured["weighted_p50_ms"] == pytest.approx(shipped["latency_ms"]["weighted_p50"])


def test_what_cannot_take_several_shapes_is_refused_by_name(cli, lines):
    """A subset (--eval-samples) and a metric without per-sample statistics: exit 2 naming the buckets;
    calibration data at several shapes: exit 2 naming the shards; no report written."""
    bad = cli("deploy", "model.onnx", "--target", "local", "--eval-data", "lines", "--eval-samples", "10",
              "--out", "o1", *FAST)
    assert bad.exit_code == 2 and "2 shape buckets" in bad.stderr and "(1, 4, 8) (24 samples)" in bad.stderr, bad.stderr
    bad = cli("deploy", "model.onnx", "--target", "local", "--eval-data", "lines", "--calib-data", "lines",
              "--out", "o2", *FAST)
    assert bad.exit_code == 2 and "calib data" in bad.stderr and "shard 0 and (1, 4, 8) in shard 1" in bad.stderr, \
        bad.stderr
    assert not (lines / "o1/report.json").exists() and not (lines / "o2/report.json").exists()
    assert "Traceback" not in bad.stderr


def test_a_metric_without_per_sample_scores_and_a_stream_are_refused_by_name(cli, lines):
    """Shapes are scored bucket by bucket and joined per sample: a user metric that returns one float cannot be
    joined, and a state carried sample to sample cannot cross shapes. Both exit 2 before any build."""
    (lines / "mymetric.py").write_text("import numpy as np\n\ndef acc(outputs, labels):\n"
                                       "    return float((outputs[0].argmax(1) == labels).mean())\n")
    bad = cli("deploy", "model.onnx", "--target", "local", "--eval-data", "lines", "--metric", "mymetric.py:acc",
              "--out", "o4", *FAST)
    assert bad.exit_code == 2 and "is not scored per sample" in bad.stderr and "one score per sample" in bad.stderr, \
        bad.stderr
    _model(lines / "stream.onnx", state=True)
    bad = cli("deploy", "stream.onnx", "--target", "local", "--eval-data", "lines", "--state", "stateN:state",
              "--out", "o5", *FAST)
    assert bad.exit_code == 2 and "a stream runs at one shape" in bad.stderr, bad.stderr
    assert not (lines / "o4/report.json").exists()
    assert not (lines / "o5/report.json").exists() and "Traceback" not in bad.stderr


def test_a_recipe_asking_for_a_fixed_shape_file_is_refused_before_the_device(cli, lines):
    (lines / "r.yaml").write_text("baseline: fp32\nvariants:\n  - name: tfl\n    passes:\n"
                                  "      - convert: {to: tflite}\n")
    bad = cli("deploy", "model.onnx", "--target", "local", "--eval-data", "lines", "--recipe", "r.yaml",
              "--out", "o3", *FAST)
    assert bad.exit_code == 2 and "variant tfl: input 'x' takes one fixed shape" in bad.stderr, bad.stderr
    assert not (lines / "o3/report.json").exists()


def test_a_measurement_reused_from_the_cache_keeps_every_bucket(cli, lines, monkeypatch):
    """The measurement cache stores a bucketed run's outputs per bucket: a re-deploy reuses them and scores
    the same 64 samples to the same value."""
    monkeypatch.setenv("EDGEKIT_NO_MEASURE_CACHE", "0")
    monkeypatch.setenv("EDGEKIT_HOME", str(lines / "home"))  # a cache of this test's own
    reps = []
    for out in ("c1", "c2"):
        r = cli("deploy", "model.onnx", "--target", "local", "--eval-data", "lines", "--no-search", "--out", out, *FAST)
        assert r.exit_code in (0, 1), r.stdout + r.stderr
        reps.append({v["name"]: v for v in json.loads((lines / out / "report.json").read_text())["variants"]})
    first, again = reps
    assert again["fp32"]["measurement"]["reused"] is True, again["fp32"].get("measurement")
    for name, v in again.items():
        assert v["accuracy"]["n"] == 64 and v["accuracy"]["value"] == first[name]["accuracy"]["value"], name
        assert [b["samples"] for b in v["latency_ms"]["buckets"]] == [40, 24]
