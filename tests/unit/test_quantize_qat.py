"""Rung 3 of the INT8 recovery ladder, quantization-aware fine-tuning, with real training, real
onnxruntime quantization and evaluation.

The model: a 4-hidden-layer MLP trained here on scikit-learn's 8x8 digits (a second or two), then
made *unequalized* by a function-preserving rescale: hidden unit i of every hidden layer is scaled
by s_i = 300**u_i (u_i uniform in [0, 1]) and the next layer's input column by 1/s_i. The float
function is unchanged (ReLU commutes with positive scales), but every hidden activation spans
~300x between its channels, so a per-tensor INT8 activation scale (onnxruntime quantizes
activations per tensor in every encoding) rounds the small channels away, and the next layer's
weight rows mix columns 300x apart, which per-channel weights do not fix. Every PTQ setting of
onnxruntime misses a 1.5-point tolerance here (checked below, independently of the ladder), mixed
precision needs every Gemm in float, and fine-tuning under simulated INT8 recovers it. Measured
here over 5 training seeds (seed 0 is this file's): the best of 18 onnxruntime static settings (QDQ
U8S8 and S8S8, QOperator U8S8; per-channel and per-tensor; minmax, percentile, entropy)
drops 3.3, 5.0, 2.2, 2.5, 1.7 points; after 10 QAT epochs the best drops 0.3, -0.6, -0.6, -1.4 and 1.9
(the fifth seed, whose PTQ came closest, needed 20 epochs: 0.8).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgekit.errors import DataError, PassError
from edgekit.inputs.data import load_npz
from edgekit.inputs.source import load_onnx, load_pt2, ort_reference
from edgekit.passes import PassContext, get_pass

TOL = 1.5


def _mlp():
    from torch import nn

    layers: list = [nn.Flatten()]
    for i in range(4):
        layers += [nn.Linear(64, 64), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(64, 10))


@pytest.fixture(scope="module")
def unequalized(tmp_path_factory):
    """(folder, pt2, calib, eval, train) of the unequalized digits MLP (see the module doc)."""
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from edgekit.passes._torch import torch_threads

    d = load_digits()
    x = (d.images.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    xtr, xte, ytr, yte = train_test_split(x, d.target.astype(np.int64), test_size=0.2, random_state=0, stratify=d.target)
    with torch_threads(1):
        torch.manual_seed(0)
        m = _mlp()
        opt = torch.optim.Adam(m.parameters(), lr=3e-3)
        xt, yt = torch.from_numpy(xtr), torch.from_numpy(ytr)
        g = torch.Generator().manual_seed(0)
        for _ in range(30):
            perm = torch.randperm(len(xt), generator=g)
            for i in range(0, len(xt), 64):
                idx = perm[i:i + 64]
                opt.zero_grad()
                torch.nn.functional.cross_entropy(m(xt[idx]), yt[idx]).backward()
                opt.step()
        m.eval()
        lins = [mod for mod in m if isinstance(mod, torch.nn.Linear)]
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            before = m(torch.from_numpy(xte))
            for a, b in zip(lins[:-1], lins[1:]):
                s = 300.0 ** torch.rand(a.out_features, generator=g)
                a.weight.mul_(s[:, None])
                a.bias.mul_(s)
                b.weight.div_(s[None, :])
            assert (m(torch.from_numpy(xte)).argmax(1) == before.argmax(1)).all()  # the same function in float
        out = tmp_path_factory.mktemp("unequalized")
        torch.export.save(torch.export.export(m, (torch.zeros(1, 1, 8, 8),)), str(out / "m.pt2"))  # batch 1, like users'
    np.savez(out / "calib.npz", x=xtr[:256])
    np.savez(out / "eval.npz", x=xte, y=yte)
    np.savez(out / "train.npz", x=xtr, y=ytr)
    calib = load_npz(out / "calib.npz", y_key=None, require_labels=False, role="calib")
    return out, out / "m.pt2", calib, load_npz(out / "eval.npz"), load_npz(out / "train.npz", role="train")


@pytest.fixture(scope="module")
def fp32(unequalized, tmp_path_factory):
    """(the source, its fp32 ONNX export) as deploy and `edgekit quantize` make them."""
    from edgekit.convert.torch_to_onnx import export_onnx

    _, pt2, _, ev, _ = unequalized
    src = load_pt2(pt2)
    return src, export_onnx(src, tmp_path_factory.mktemp("fp32") / "fp32.onnx", [ev.xs[0][:8]])


def _top1(path, ds) -> float:
    return float((ort_reference(Path(path))(list(ds.xs)).argmax(1) == ds.y).mean() * 100)


def _qdq_counts(path) -> tuple[int, int]:
    g = onnx.load(str(path)).graph
    qdq = sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") or n.op_type.startswith("QLinear") for n in g.node)
    int8 = sum(i.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8) for i in g.initializer)
    return qdq, int8


def _ctx(tmp_path, unequalized, source, train=True):
    _, _, calib, ev, tr = unequalized
    return PassContext(workdir=tmp_path, calib=calib, eval=ev, train=tr if train else None,
                       source=source)


def test_every_ptq_setting_misses_and_qat_rescues_within_tolerance(unequalized, fp32, tmp_path):
    _, _, calib, ev, _ = unequalized
    src, art = fp32
    base = _top1(art.path, ev)
    # PTQ, independently of the ladder: every onnxruntime static encoding and calibration method misses
    ctx = PassContext(workdir=tmp_path, calib=calib, eval=ev)
    drops = {}
    for fmt in ("qdq", "qoperator"):
        for act in ("uint8", "int8"):
            for pc in (False, True):
                for method in ("minmax", "percentile", "entropy"):
                    q = get_pass("quantize")(art, {"format": fmt, "activation_type": act, "per_channel": pc,
                                                   "calibration_method": method}, ctx, out_name="ptq")
                    drops[(fmt, act, pc, method)] = base - _top1(q.path, ev)
    assert min(drops.values()) > TOL, drops

    started = time.perf_counter()
    aa = get_pass("quantize_accuracy_aware")(art, {"max_accuracy_drop": TOL, "max_float_ops": 2},
                                             _ctx(tmp_path, unequalized, src), out_name="aa")
    seconds = time.perf_counter() - started
    m = aa.lineage[-1].metrics
    # the ladder climbed every PTQ rung, mixed precision ran out of float ops, QAT won
    assert [r["rung"] for r in m["rungs"]] == ["int8", "calibration", "encoding", "mixed", "qat"]
    assert "max_float_ops reached" in m["rungs"][3]["result"]
    assert m["rung"] == "qat" and m["qat"]["won"] and m["rungs"][-1]["result"].startswith("within tolerance")
    assert m["full_int8"]["drop"] > TOL
    # within the tolerance, measured independently of the pass's own bookkeeping
    measured = _top1(aa.path, ev)
    assert base - measured <= TOL and measured == pytest.approx(m["accuracy"], abs=1e-3)
    assert m["fp32_accuracy"] == pytest.approx(base, abs=1e-3)
    # a real INT8 ONNX: quantize/dequantize (or QLinear) ops, int8 weights, at most max_float_ops in float
    qdq, int8 = _qdq_counts(aa.path)
    assert qdq >= 10 and int8 >= 5 and len(m["float_ops"]) <= 2
    assert aa.precision == ("int8" if not m["float_ops"] else "mixed")
    # each rung's build seconds; the fine-tune's own record
    qat = m["rungs"][-1]
    assert qat["seconds"] > 0 and qat["finetune_seconds"] > 0 and qat["export_seconds"] > 0
    assert qat["seconds"] >= qat["finetune_seconds"] + qat["export_seconds"]
    assert sum(r["trials"] for r in m["rungs"]) == m["trials"] == len(m["trial_log"])
    ft = m["qat"]["finetune"]
    assert ft["epochs_run"] >= 1 and ft["task_loss"] == "cross-entropy" and ft["train_samples"] > 1000
    assert ft["holdout"]["chosen"] >= ft["holdout"]["before"] and ft["chosen_epoch"] >= 1
    assert m["train_data"].endswith("train.npz") and m["seconds"] <= seconds
    assert seconds < 60


def test_without_train_data_the_failure_names_train_data(unequalized, fp32, tmp_path):
    src, art = fp32
    with pytest.raises(PassError) as err:
        get_pass("quantize_accuracy_aware")(art, {"max_accuracy_drop": TOL, "max_float_ops": 2},
                                            _ctx(tmp_path, unequalized, src, train=False), out_name="fail")
    msg = str(err.value)
    assert "no INT8 configuration met the tolerance" in msg and "--train-data" in msg
    assert "quantization-aware fine-tuning" in msg and "no model was written" in msg
    assert err.value.exit_code == 2 and not (tmp_path / "fail.onnx").exists()


def test_mixed_precision_with_most_ops_in_float_gives_way_to_qat(unequalized, fp32, tmp_path):
    """Without a float-op limit mixed precision meets the tolerance by keeping every Gemm in float
    (a QDQ-wrapped fp32 model); with train data the QAT model meets it with fewer float ops."""
    src, art = fp32
    ctx = _ctx(tmp_path, unequalized, src)
    plain = get_pass("quantize_accuracy_aware")(art, {"max_accuracy_drop": TOL, "qat": {"above_float_fraction": 1.0}},
                                                ctx, out_name="plain")
    pm = plain.lineage[-1].metrics
    assert pm["rung"] == "mixed" and len(pm["float_ops"]) > 0.25 * pm["quantizable_ops"] and "qat" not in pm
    aa = get_pass("quantize_accuracy_aware")(art, {"max_accuracy_drop": TOL}, ctx, out_name="aa")
    m = aa.lineage[-1].metrics
    assert m["rung"] == "qat" and len(m["float_ops"]) < len(pm["float_ops"])
    assert "more than qat.above_float_fraction" in m["qat"]["why"]
    assert m["accuracy_drop"] <= TOL


def test_the_simulation_agrees_with_onnxruntime(unequalized, fp32, tmp_path):
    """Fake quantization predicts what onnxruntime's QDQ build of the same weights computes."""
    import torch

    from edgekit.passes.qat_simulation import simulate
    from edgekit.passes.quantize_ort import OrtQuantizeConfig

    _, _, calib, ev, _ = unequalized
    src, art = fp32
    for pc in (True, False):
        enc = OrtQuantizeConfig(activation_type="uint8", per_channel=pc)
        sim = simulate(src.program, src.artifact.io, calib, enc)
        with torch.no_grad():
            s = sim(torch.from_numpy(ev.xs[0])).numpy()
        q = get_pass("quantize")(art, enc.model_dump(), PassContext(workdir=tmp_path, calib=calib), out_name="q")
        # the QDQ graph as written (optimized=False): with fusion on, onnxruntime's x86 u8s8 kernels without
        # VNNI saturate pairs of products at int16 (its quantization guide), which on this deliberately
        # unequalized model moved ~3% of argmaxes on a CI machine without VNNI: that CPU's kernels (which
        # an on-device measurement sees, and which reduce_range avoids), not the simulation
        o = ort_reference(q.path, optimized=False)(list(ev.xs))
        assert (s.argmax(1) == o.argmax(1)).mean() >= 0.99, pc
        top1 = float((o.argmax(1) == ev.y).mean() * 100)
        assert abs(float((s.argmax(1) == ev.y).mean() * 100) - top1) <= 0.6


def test_quantize_qat_pass_writes_a_runnable_int8_onnx_and_is_deterministic(unequalized, tmp_path):
    _, pt2, calib, ev, tr = unequalized
    art = load_pt2(pt2).artifact
    ctx = PassContext(workdir=tmp_path, calib=calib, eval=ev, train=tr)
    cfg = {"epochs": 2, "activation_type": "uint8"}
    a = get_pass("quantize_qat")(art, cfg, ctx, out_name="a")
    b = get_pass("quantize_qat")(art, cfg, ctx, out_name="b")
    assert a.sha256 == b.sha256  # seeded: the same fine-tune, the same file
    m = a.lineage[-1].metrics
    assert a.format.value == "onnx" and a.precision == "int8"
    assert [i.name for i in a.io.inputs] == [i.name for i in art.io.inputs]  # the names the eval data is keyed on
    assert m["epochs_run"] == 2 and m["encoding"] == "qdq-u8s8-per-channel-minmax" and m["fake_quant_nodes"] >= 10
    assert m["batch_size"] == 64  # the batch-1 program was re-exported with a dynamic batch
    assert m["finetuned_parity"]["max_abs_err"] < 1e-3
    qdq, int8 = _qdq_counts(a.path)
    assert qdq >= 10 and int8 >= 5
    assert _top1(a.path, ev) == pytest.approx(m["eval_top1"]["qat_int8"], abs=1e-3)


def test_train_labels_that_do_not_fit_are_named(unequalized):
    from edgekit.inputs.data import Dataset
    from edgekit.passes.quantize_qat import task_of

    _, _, _, _, tr = unequalized
    assert task_of(tr, (None, 10), 0.5) == "classes"
    with pytest.raises(DataError, match="has no labels") as err:
        task_of(Dataset(tr.path, tr.xs, None, ("x",), None), (None, 10), 0.5)
    assert "y=labels" in str(err.value) and "alpha: 1" in str(err.value)
    assert task_of(Dataset(tr.path, tr.xs, None, ("x",), None), (None, 10), 1.0) == "none"
    with pytest.raises(DataError, match=r"class indices in \[0, 5\)"):
        task_of(tr, (None, 5), 0.5)
    with pytest.raises(DataError, match=r"labels have shape \(1437, 3\)") as err:
        task_of(Dataset(tr.path, tr.xs, np.zeros((tr.n, 3), np.float32), ("x",), "y"), (None, 10), 0.5)
    assert "(N, 10)" in str(err.value)


def test_cli_train_data_enables_the_rung(cli, unequalized, tmp_path):
    import json

    d, pt2, *_ = unequalized
    out = tmp_path / "q.onnx"
    r = cli("quantize", pt2, "--calib-data", d / "calib.npz", "--eval-data", d / "eval.npz", "--train-data",
            d / "train.npz", "--max-accuracy-drop", TOL, "--qat-epochs", 5, "--out", out, "--json")
    assert r.exit_code == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    m = doc["metrics"]
    assert m["rung"] == "qat" and m["qat"]["finetune"]["epochs_run"] <= 5 and doc["config"]["qat"]["epochs"] == 5
    assert out.is_file() and _qdq_counts(out)[0] >= 10


def test_cli_bad_train_data_is_refused_before_any_work(cli, unequalized, fp32, tmp_path):
    d, pt2, *_ = unequalized
    base = ("quantize", pt2, "--calib-data", d / "calib.npz", "--eval-data", d / "eval.npz", "--out", tmp_path / "q.onnx")
    x = np.load(d / "train.npz")["x"]
    np.savez(tmp_path / "nolabels.npz", x=x)
    r = cli(*base, "--train-data", tmp_path / "nolabels.npz")
    assert r.exit_code == 2 and "has no labels" in r.stderr and "y=labels" in r.stderr
    np.savez(tmp_path / "shape.npz", x=x[:, :, :4, :4], y=np.zeros(len(x), np.int64))
    r = cli(*base, "--train-data", tmp_path / "shape.npz")
    assert r.exit_code == 2 and "train data shape.npz: samples have shape (1, 4, 4)" in r.stderr
    np.savez(tmp_path / "onehot.npz", x=x, y=np.zeros((len(x), 3), np.float32))
    r = cli(*base, "--train-data", tmp_path / "onehot.npz")
    assert r.exit_code == 2 and "labels have shape" in r.stderr and "class indices of shape (N)" in r.stderr
    r = cli("quantize", pt2, "--calib-data", d / "calib.npz", "--train-data", d / "train.npz", "--out", tmp_path / "q.onnx")
    assert r.exit_code == 2 and "--eval-data" in r.stderr
    onnx_model = fp32[1].path
    r = cli("quantize", onnx_model, "--calib-data", d / "calib.npz", "--eval-data", d / "eval.npz",
            "--train-data", d / "train.npz", "--out", tmp_path / "q.onnx")
    assert r.exit_code == 2 and "trains the PyTorch model" in r.stderr
    assert not (tmp_path / "q.onnx").exists()


@pytest.mark.slow
def test_qat_on_the_zoo_mobilenet_folds_batchnorm_and_keeps_accuracy(tmp_path):
    """A real architecture (transformers' MobileNetV2: Conv+BatchNorm, ReLU6, residual adds, a
    program with a static batch of 1): the graph is re-exported with a dynamic batch, the folded
    weights are fake-quantized (the learning-rate guard restarts a fine-tune that diverges), and the
    INT8 result runs in onnxruntime within 2 points of fp32."""
    from edgekit.inputs.data import align_to_model
    from tests import zoo

    m = zoo.get("cnn")
    src = load_pt2(m.pt2)
    io = src.artifact.io
    ev = align_to_model(load_npz(m.eval, x_key=None), io)
    cal = align_to_model(load_npz(m.calib, x_key=None, y_key=None, require_labels=False, role="calib"), io, role="calib")
    tr = align_to_model(load_npz(m.train, x_key=None), io, role="train")
    ctx = PassContext(workdir=tmp_path, calib=cal, eval=ev, train=tr)
    q = get_pass("quantize_qat")(src.artifact, {"epochs": 2, "activation_type": "uint8"}, ctx, out_name="q")
    mm = q.lineage[-1].metrics
    assert mm["batch_size"] == 64 and mm["fake_quant_nodes"] > 100
    top = mm["eval_top1"]
    assert top["fp32"] - top["qat_int8"] <= 2 and _qdq_counts(q.path)[0] > 50


def test_search_ships_the_qat_rescue(unequalized, tmp_path):
    """--train-data reaches the search: the registry's accuracy-aware candidate (ort-int8-mixed) climbs
    to the QAT rung, is built full INT8 inside the tolerance, and is the file that ships (objective size:
    the smallest file inside the gate wins, so the choice does not hang on a latency tie); without train
    data the same candidate can only keep ops in float."""
    from edgekit.inputs.targets import MeasureDefaults, load_target
    from edgekit.orchestration.options import DeployOptions
    from edgekit.variant_search import SearchOptions, search
    from edgekit.variant_search.candidates import candidate_variants

    d, pt2, *_ = unequalized
    mixed = next(v for v in candidate_variants(load_target("local"), has_calib=True, quick=True)[0]
                 if v.name == "ort-int8-mixed")
    sopts = SearchOptions(candidates=[mixed], tune_runtime=False, screening_runs=5, objective="size",
                          measure=MeasureDefaults(warmup=1, runs=5, min_seconds=0.0, threads=1))

    def cand(out, **over):
        rep = search(pt2, eval_data=d / "eval.npz", calib_data=d / "calib.npz", out=tmp_path / out, options=sopts,
                     deploy_options=DeployOptions(max_accuracy_drop=TOL, **over))
        base = next(c for c in rep.search.candidates if c.name == "fp32")
        return next(c for c in rep.search.candidates if c.name == "ort-int8-mixed"), rep, base

    c, rep, _ = cand("qat", train_data=d / "train.npz")
    assert c.status != "dropped" or c.dropped_at != "build", c.reason
    assert c.precision == "int8" and c.build_seconds > 0  # QAT won: no op left in float
    fp32_acc = rep.variant("fp32").accuracy.value
    assert c.host_accuracy is not None and fp32_acc - c.host_accuracy <= TOL
    # the rescue is what ships: selected, the decision names it, and out/ship/ holds its file, whose
    # lineage says the ladder's last rung was QAT (a float-kept or fp32 file would say otherwise)
    assert rep.search.selected == "ort-int8-mixed" and rep.decision.ship == "ort-int8-mixed", rep.decision
    shipped = rep.variant("ort-int8-mixed")
    assert shipped.selected and shipped.precision == "int8" and shipped.accuracy_drop <= TOL
    aa = shipped.lineage[-1]
    assert aa["name"] == "quantize_accuracy_aware" and aa["metrics"]["rung"] == "qat", aa["metrics"].get("rung")
    assert aa["metrics"]["float_ops"] == [] and aa["metrics"]["qat"]["finetune"]["epochs_run"] >= 1
    ship = Path(rep.search.shipped.file)
    assert ship.parent == tmp_path / "qat" / "ship" and ship.is_file(), rep.search.shipped
    assert rep.search.shipped.sha256 == shipped.sha256 and _qdq_counts(ship)[0] >= 10
    import json

    assert json.loads((ship.parent / "ship.json").read_text())["lineage"][-1]["metrics"]["rung"] == "qat"
    c2, _, _ = cand("ptq")
    assert c2.precision == "mixed"  # PTQ alone meets the tolerance only with ops in float
