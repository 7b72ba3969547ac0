"""The INT8 recovery ladder on real models of the test zoo (real onnxruntime quantization and
evaluation): the zoo BERT, whose full INT8 collapses to chance (its attention-mask Add feeds a
-3.4e38 mask into one per-tensor scale, so every attention score rounds to zero), is rescued by mixed
precision with the attention-mask nodes named in the lineage; the zoo MobileNetV2 stays full INT8 in
the fast encoding in one trial; calibration methods give different, runnable artifacts and reuse their
ranges; the sensitivity switch graph is exact with every switch off; fp16 ONNX; the registry's rungs."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgekit.inputs.data import align_to_model, load_npz
from edgekit.inputs.source import load_onnx, ort_reference_all
from edgekit.passes import PassContext, get_pass
from tests import zoo


def _onnx(name: str, out_dir: Path):
    from edgekit.convert.torch_to_onnx import export_onnx
    from edgekit.inputs.source import load_pt2

    m = zoo.get(name)
    src = load_pt2(m.pt2)
    ev = align_to_model(load_npz(m.eval, x_key=None), src.artifact.io)
    cal = align_to_model(load_npz(m.calib, x_key=None, y_key=None, require_labels=False, role="calib"),
                         src.artifact.io, role="calib")
    art = export_onnx(src, out_dir / f"{name}.onnx", [x[:4] for x in ev.xs])
    return load_onnx(Path(art.path)).artifact, cal, ev


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    return _onnx("text", tmp_path_factory.mktemp("text"))


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    return _onnx("cnn", tmp_path_factory.mktemp("cnn"))


def _top1(path, ds, optimized: bool = True) -> float:
    out = ort_reference_all(Path(path), optimized=optimized)(list(ds.xs))[0]
    return float((out.argmax(1) == ds.y).mean() * 100)


def test_bert_full_int8_collapses_and_mixed_precision_rescues_it(text, tmp_path):
    art, cal, ev = text
    ctx = PassContext(workdir=tmp_path, calib=cal, eval=ev)
    fp32 = _top1(art.path, ev)
    plain = get_pass("quantize")(art, {"activation_type": "uint8", "per_channel": False}, ctx, out_name="plain")
    assert fp32 - _top1(plain.path, ev) > 20, "plain INT8 of the zoo BERT was expected to collapse"

    started = time.perf_counter()
    aa = get_pass("quantize_accuracy_aware")(art, {"max_accuracy_drop": 1}, ctx, out_name="aa")
    seconds = time.perf_counter() - started
    m = aa.lineage[-1].metrics
    assert fp32 - _top1(aa.path, ev) <= 1 and m["accuracy"] == pytest.approx(_top1(aa.path, ev), abs=1e-3)
    assert aa.precision == "mixed" and m["rung"] == "mixed"
    assert m["full_int8"]["drop"] > 20  # the rungs before mixed precision were tried and failed
    assert [r["rung"] for r in m["rungs"]] == ["int8", "calibration", "encoding", "mixed"]
    # the nodes kept in float are named, with why: the attention-mask Adds and the Softmax they feed
    graph = onnx.load(str(art.path)).graph
    op = {n.name: n.op_type for n in graph.node}
    assert m["float_ops"] and {op[n] for n in m["float_ops"]} <= {"Add", "Softmax"}
    assert len(m["float_ops"]) <= 4 < m["quantizable_ops"] / 10
    for d in m["kept_in_float"]:
        assert d["node"] in m["float_ops"] and d["reason"] and d["unit"] and d["sensitivity_rank"] >= 1
    top = m["sensitivity"]["most_sensitive"][0]
    assert set(top["nodes"]) <= set(m["float_ops"]) and top["relative_output_error"] > 0.1
    # the search's cost is in the lineage: trials and seconds, per trial and per rung
    assert m["trials"] == len(m["trial_log"]) and 2 <= m["trials"] <= 20
    assert 0 < m["seconds"] <= seconds + 0.5 and aa.lineage[-1].seconds >= m["seconds"]
    assert all(r["seconds"] >= 0 and r["trials"] >= 0 for r in m["rungs"])
    assert sum(r["trials"] for r in m["rungs"]) == m["trials"]
    assert seconds < 60
    # the rest is really INT8
    qgraph = onnx.load(str(aa.path)).graph
    assert sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") or n.op_type.startswith("QLinear")
               for n in qgraph.node) >= 10


# the host speed probe orders the encodings by their measured speed, so the first trial depends on timing: in a CI
# run beside the other worker's load the ladder ended on rung 'calibration', not 'int8' (cause not isolated further;
# it passed in four other CI runs), so it runs alone
@pytest.mark.serial
def test_cnn_stays_full_int8_in_the_fast_encoding_in_one_trial(cnn, tmp_path):
    from edgekit.passes.accuracy_aware.config import host_device

    art, cal, ev = cnn
    ctx = PassContext(workdir=tmp_path, calib=cal, eval=ev)
    started = time.perf_counter()
    aa = get_pass("quantize_accuracy_aware")(art, {"max_accuracy_drop": 1}, ctx, out_name="aa")
    assert time.perf_counter() - started < 60
    m = aa.lineage[-1].metrics
    assert m["accuracy_drop"] <= 1 and aa.precision == "int8" and m["float_ops"] == []
    assert m["rung"] == "int8" and m["trials"] == 1 and m["device"] == host_device()
    # the encodings were ordered by their measured speed on this CPU, fp32 beside them
    probe = m["speed_probe"]
    assert set(probe["cpu_ms"]) == {"fp32", *m["encodings_tried"]} and probe["seconds"] < 20
    from edgekit.passes.accuracy_aware.config import PROBE_TIE

    fastest = min(probe["cpu_ms"][e] for e in m["encodings_tried"])
    tied = [e for e in m["encodings_tried"] if probe["cpu_ms"][e] <= fastest * (1 + PROBE_TIE)]
    assert m["encoding"] == tied[0], (tied, probe)  # the fastest, or the device table's first among ties
    if host_device() == "x86-vnni":
        assert "u8s8" in m["encoding"] and m["encoding"].endswith("-minmax")


def test_calibration_methods_give_different_runnable_artifacts_and_reuse_their_ranges(cnn, tmp_path):
    art, cal, ev = cnn
    ctx = PassContext(workdir=tmp_path, calib=cal, eval=ev)
    shas, accs = {}, {}
    for method in ("minmax", "percentile", "entropy"):
        q = get_pass("quantize")(art, {"calibration_method": method, "activation_type": "uint8", "per_channel": False},
                                 ctx, out_name=f"q-{method}")
        shas[method] = q.sha256
        accs[method] = _top1(q.path, ev, optimized=False)  # the ranges' effect, not this CPU's kernels
        assert q.lineage[-1].metrics["calibration"]["method"] == method
    assert len(set(shas.values())) == 3
    # Scored on the QDQ graph as written (the same on every CPU; fused u8s8 kernels on x86 without VNNI
    # saturate, see test_quantize_qat). minmax and percentile keep the fp32 model's accuracy (within 3 points on 160 eval samples, a sample is
    # 0.625 point; seen: fp32 88.75, minmax 88.75, percentile 88.1). Entropy (KL) calibration clips this
    # model's activations hard (seen: 69.4): still a working classifier, well above chance (25), which is
    # why the ladder measures the accuracy of what it calibrates instead of trusting one method.
    fp32 = _top1(art.path, ev)
    assert fp32 - accs["minmax"] <= 3.0 and fp32 - accs["percentile"] <= 3.0, (fp32, accs)
    assert accs["entropy"] > 50, (fp32, accs)
    # another encoding of the same model and method reuses the ranges (no calibration run)
    again = get_pass("quantize")(art, {"calibration_method": "entropy", "per_channel": True}, ctx, out_name="again")
    assert again.lineage[-1].metrics["calibration"]["reused"] is True


def test_explicit_fields_pin_the_encoding_the_rest_comes_from_the_device_table():
    from edgekit.config import validate
    from edgekit.passes.accuracy_aware.config import AccuracyAwareConfig, encodings_for

    _, encs = encodings_for(validate(AccuracyAwareConfig, {"device": "x86-vnni"}, "t"))
    assert [(e.format, e.activation_type, e.per_channel) for e in encs] == [
        ("qoperator", "uint8", False), ("qdq", "uint8", False), ("qdq", "uint8", True)]
    _, encs = encodings_for(validate(AccuracyAwareConfig, {"device": "x86-vnni", "per_channel": True}, "t"))
    assert [(e.format, e.per_channel) for e in encs] == [("qoperator", True), ("qdq", True)]
    _, encs = encodings_for(validate(AccuracyAwareConfig, {"device": "x86-vnni", "format": "qdq",
                                                           "per_channel": False}, "t"))
    assert len(encs) == 1 and encs[0].activation_type == "uint8"
    _, encs = encodings_for(validate(AccuracyAwareConfig, {"device": "arm64"}, "t"))
    assert encs[0].activation_type == "int8" and encs[0].per_channel


def test_sensitivity_switch_graph_is_fp32_when_off_and_int8_like_when_on(cnn, tmp_path):
    import onnxruntime as ort

    from edgekit.passes.accuracy_aware.ladder import quantizable_ops
    from edgekit.passes.sensitivity import SWITCH, build_switch_model

    art, cal, ev = cnn
    ctx = PassContext(workdir=tmp_path, calib=cal, eval=ev)
    q = get_pass("quantize")(art, {"activation_type": "uint8", "per_channel": False, "preprocess": False}, ctx,
                             out_name="q")
    cands = {n.name for n in onnx.load(str(art.path)).graph.node if n.op_type in quantizable_ops()}
    units, _ = build_switch_model(Path(art.path), q.path, cands, tmp_path / "sw.onnx")
    assert len(units) > 20 and {u.kind for u in units} == {"activation", "weights"}
    sess = ort.InferenceSession(str(tmp_path / "sw.onnx"), providers=["CPUExecutionProvider"])
    x = ev.xs[0][:1]
    name = art.io.inputs[0].name
    off = sess.run(None, {name: x, SWITCH: np.zeros(len(units), np.float32)})[0]
    on = sess.run(None, {name: x, SWITCH: np.ones(len(units), np.float32)})[0]
    fp32 = ort_reference_all(Path(art.path))([x])[0]
    qdq = ort_reference_all(q.path)([x])[0]
    np.testing.assert_allclose(off, fp32, rtol=1e-5, atol=1e-5)
    assert np.abs(on - fp32).max() > 1e-4  # really quantized
    assert np.abs(on - qdq).max() < 0.25 * np.abs(fp32 - qdq).max() + 0.05 * np.abs(fp32).max()


def test_fp16_onnx_keeps_float32_io_and_stays_close(cnn, tmp_path):
    art, _, ev = cnn
    h = get_pass("quantize_fp16")(art, {}, PassContext(workdir=tmp_path), out_name="h")
    assert h.precision == "fp16" and h.size_bytes < 0.7 * Path(art.path).stat().st_size
    assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in onnx.load(str(h.path)).graph.initializer)
    x = [ev.xs[0][:8]]
    a, b = ort_reference_all(Path(art.path))(x)[0], ort_reference_all(h.path)(x)[0]
    assert b.dtype == np.float32 and (a.argmax(1) == b.argmax(1)).mean() >= 0.875


def test_registry_search_candidates_are_the_ladder_rungs_and_few():
    from edgekit.formats import Format, format_spec

    names = [c.name for c in format_spec(Format.ONNX).search_candidates]
    assert {"ort-int8-qdq-u8s8", "ort-int8-qdq-s8s8", "ort-int8-mixed"} <= set(names) and len(names) <= 5
    mixed = next(c for c in format_spec(Format.ONNX).search_candidates if c.name == "ort-int8-mixed")
    assert mixed.passes[0][0] == "quantize_accuracy_aware" and mixed.needs_calib
    assert not any("fp16" in n for n in names)  # the CPU EP runs fp16 slowly on x86


def test_sensitivity_in_groups_of_switches_measures_what_one_graph_measures(cnn, tmp_path, monkeypatch):
    """The units are switched in groups, one graph per group (a graph computes every switched
    quantize-dequantize on every run): each unit's error is the one it has in a graph that switches all."""
    from edgekit.passes import sensitivity
    from edgekit.passes.accuracy_aware.ladder import quantizable_ops

    art, cal, ev = cnn
    ctx = PassContext(workdir=tmp_path, calib=cal, eval=ev)
    q = get_pass("quantize")(art, {"activation_type": "uint8", "per_channel": False, "preprocess": False}, ctx,
                             out_name="q")
    cands = {n.name for n in onnx.load(str(art.path)).graph.node if n.op_type in quantizable_ops()}
    monkeypatch.setattr(sensitivity, "GROUP", 10_000)
    one = sensitivity.measure(Path(art.path), q.path, list(ev.xs), cands, tmp_path, samples=4)
    monkeypatch.setattr(sensitivity, "GROUP", 7)  # 118 units: 17 graphs, the last one part-full
    grouped = sensitivity.measure(Path(art.path), q.path, list(ev.xs), cands, tmp_path, samples=4)
    a = {u.tensor: u.error for u in one.units}
    b = {u.tensor: u.error for u in grouped.units}
    assert len(a) > 7 * 10 and a.keys() == b.keys()
    for t in a:  # the same error, up to the float rounding of differently fused graphs
        assert b[t] == pytest.approx(a[t], rel=1e-3, abs=1e-9 + 1e-3 * one.all_quantized_error), t
    assert [u.tensor for u in one.units[:5]] == [u.tensor for u in grouped.units[:5]]
    assert grouped.all_quantized_error == pytest.approx(one.all_quantized_error, rel=1e-6)


@pytest.mark.serial  # two timings compared: the budget comes from one run, the step times another
def test_layer_sensitivity_fits_the_time_left_or_does_not_start(cnn, tmp_path):
    """One run per quantized tensor took ~50 min on PP-OCRv4's recognizer (558 tensors x 5 s) inside a
    300 s search: the step measures one run, then takes fewer samples to fit half the time left, or
    does not start and says why (the search drops the candidate with that reason)."""
    from edgekit.passes.accuracy_aware.ladder import quantizable_ops
    from edgekit.passes.sensitivity import measure
    from edgekit.timeline import BudgetExceeded, Clock

    art, cal, ev = cnn
    ctx = PassContext(workdir=tmp_path, calib=cal, eval=ev)
    q = get_pass("quantize")(art, {"activation_type": "uint8", "per_channel": False, "preprocess": False}, ctx,
                             out_name="q")
    cands = {n.name for n in onnx.load(str(art.path)).graph.node if n.op_type in quantizable_ops()}
    full = measure(Path(art.path), q.path, list(ev.xs), cands, tmp_path, samples=16)
    assert full.samples == 16
    clock = Clock(budget_s=None)
    with clock.deadline_scope(time.perf_counter() + 0.05, "the build of x"):
        with pytest.raises(BudgetExceeded, match="layer sensitivity not started: .* quantized tensors x 4 samples"):
            measure(Path(art.path), q.path, list(ev.xs), cands, tmp_path, samples=16)
    # room for about 8 of the 16 samples a tensor in half the time left: the fixed part of a measurement (the
    # group graphs' builds) and its part per sample, from the runs at 16 samples above and at 4 here
    four = measure(Path(art.path), q.path, list(ev.xs), cands, tmp_path, samples=4)
    per_sample = (full.seconds - four.seconds) / 12
    fixed = max(0.0, four.seconds - 4 * per_sample)
    with clock.deadline_scope(time.perf_counter() + 2 * (fixed + 8 * per_sample), "the build of x"):
        fewer = measure(Path(art.path), q.path, list(ev.xs), cands, tmp_path, samples=16)
    assert 4 <= fewer.samples < 16, fewer.samples
