"""Pruning and distillation passes on the trained digits model, with real Torch-Pruning and real
training; their bad inputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgekit.errors import BadInputError, ConfigError, PassError
from edgekit.formats import Format
from edgekit.inputs.data import load_npz
from edgekit.inputs.source import load_pt2
from edgekit.passes import PassContext, get_pass

ROOT = Path(__file__).resolve().parents[2]
ARCH = f"{ROOT / 'examples' / 'digits' / 'model.py'}:DigitsCNN"
MODELS = Path(__file__).resolve().parent / "_compress_models.py"


@pytest.fixture(scope="module")
def ctx_factory(digits):
    ev, train = load_npz(digits.eval), load_npz(digits.train, role="train")
    teacher = load_pt2(digits.pt2).artifact

    def make(tmp_path, **kw):
        return PassContext(workdir=tmp_path, eval=ev, train=train, **{"arch": ARCH, "teacher": teacher, **kw})

    return make


@pytest.fixture(scope="module")
def pruned(digits, ctx_factory, tmp_path_factory):
    ctx = ctx_factory(tmp_path_factory.mktemp("pruned"))
    return get_pass("prune_structured")(load_pt2(digits.pt2).artifact, {"sparsity": 0.5, "finetune_epochs": 2}, ctx)


def test_structured_pruning_really_removes_channels(pruned, digits):
    m = pruned.lineage[-1].metrics
    assert pruned.format == Format.TORCH and pruned.path.suffix == ".pt2"
    # half the channels of every prunable layer: ~1/4 of the params and MACs of conv-conv pairs
    assert m["params_ratio"] < 0.4 and m["macs_ratio"] < 0.4
    assert m["after"]["size_bytes"] < m["before"]["size_bytes"] * 0.5
    assert m["after"]["accuracy"] > 90 and len(m["finetune"]["loss"]) == 2
    # the written program really is the smaller model, and it runs batches (later passes train it)
    import numpy as np
    import torch

    ep = torch.export.load(str(pruned.path))
    assert sum(v.numel() for v in ep.state_dict.values()) < 0.4 * sum(
        v.numel() for v in torch.export.load(str(digits.pt2)).state_dict.values())
    assert ep.module()(torch.from_numpy(np.load(digits.eval)["x"][:5])).shape == (5, 10)


def test_distilling_the_pruned_model_recovers_towards_the_teacher(pruned, ctx_factory, tmp_path):
    out = get_pass("distill")(pruned, {"epochs": 3, "temperature": 4, "alpha": 0.7}, ctx_factory(tmp_path))
    m = out.lineage[-1].metrics
    assert out.format == Format.TORCH and out.lineage[-2].name == "prune_structured"
    assert m["teacher_accuracy"] > 90
    assert m["student_accuracy"]["after"] >= m["teacher_accuracy"] - 3
    assert len(m["loss"]) == 3 and m["loss"][-1] < m["loss"][0]


def test_distill_a_fresh_student_architecture(digits, ctx_factory, tmp_path):
    teacher = load_pt2(digits.pt2).artifact
    out = get_pass("distill")(teacher, {"student": f"{MODELS}:small_student", "epochs": 3}, ctx_factory(tmp_path))
    m = out.lineage[-1].metrics
    assert m["params"]["student"] < m["params"]["teacher"] / 10
    assert m["student_accuracy"]["after"] > m["student_accuracy"]["before"] + 20


def test_feature_matching_trains_a_projection_between_named_layers(digits, ctx_factory, tmp_path):
    teacher = load_pt2(digits.pt2).artifact
    cfg = {"student": f"{MODELS}:small_student", "teacher_arch": ARCH, "feature_pairs": [["1", "head.1"]],
           "epochs": 4}
    out = get_pass("distill")(teacher, cfg, ctx_factory(tmp_path))
    m = out.lineage[-1].metrics
    assert m["feature_pairs"] == [["1", "head.1"]] and m["loss"][-1] < m["loss"][0]
    assert m["student_accuracy"]["after"] > m["student_accuracy"]["before"] + 20
    with pytest.raises(BadInputError, match="the teacher has no module 'nope'"):
        get_pass("distill")(teacher, {**cfg, "feature_pairs": [["1", "nope"]]}, ctx_factory(tmp_path))
    with pytest.raises(BadInputError, match="needs student: module:factory and teacher_arch"):
        get_pass("distill")(teacher, {**cfg, "teacher_arch": None}, ctx_factory(tmp_path))


def test_student_with_another_output_shape_is_refused(digits, ctx_factory, tmp_path):
    teacher = load_pt2(digits.pt2).artifact
    with pytest.raises(BadInputError, match=r"output shape \(1, 5\) does not match the teacher's \(1, 10\)") as err:
        get_pass("distill")(teacher, {"student": f"{MODELS}:five_class_student"}, ctx_factory(tmp_path))
    assert err.value.exit_code == 2 and not list(tmp_path.glob("*.pt2"))


def test_distill_needs_labelled_training_data(digits, tmp_path):
    teacher = load_pt2(digits.pt2).artifact
    with pytest.raises(BadInputError, match="needs training data"):
        get_pass("distill")(teacher, {"student": f"{MODELS}:small_student"}, PassContext(workdir=tmp_path))


def test_magnitude_pruning_shrinks_the_compressed_size_not_the_file(digits, ctx_factory, tmp_path):
    out = get_pass("prune_magnitude")(load_pt2(digits.pt2).artifact, {"sparsity": 0.6}, ctx_factory(tmp_path))
    m = out.lineage[-1].metrics
    assert 0.55 < m["sparsity"] <= 0.61
    assert m["compressed_size_bytes"]["after"] < 0.8 * m["compressed_size_bytes"]["before"]
    assert abs(m["size_bytes"]["after"] - m["size_bytes"]["before"]) < 0.05 * m["size_bytes"]["before"]
    assert "not dense latency" in m["note"]


@pytest.mark.parametrize("name", ["prune_structured", "prune_magnitude"])
@pytest.mark.parametrize("sparsity", [0, 1, -0.2, 1.5])
def test_sparsity_outside_0_1_is_a_config_error(digits, ctx_factory, tmp_path, name, sparsity):
    with pytest.raises(ConfigError, match="sparsity") as err:
        get_pass(name)(load_pt2(digits.pt2).artifact, {"sparsity": sparsity}, ctx_factory(tmp_path))
    assert err.value.exit_code == 2


def test_structured_pruning_without_architecture_says_what_to_give(digits, tmp_path):
    with pytest.raises(PassError, match="needs its architecture") as err:
        get_pass("prune_structured")(load_pt2(digits.pt2).artifact, {"finetune_epochs": 0},
                                     PassContext(workdir=tmp_path))
    assert "arch: module:Class" in err.value.hint


def test_torch_passes_refuse_onnx_input(tmp_path):
    from edgekit.artifact import Artifact, IOSpec

    f = tmp_path / "m.onnx"
    f.write_bytes(b"x")
    art = Artifact.from_file(f, Format.ONNX, IOSpec(inputs=(), outputs=()))
    with pytest.raises(PassError, match="takes \\['torch'\\] models"):
        get_pass("distill")(art, {}, PassContext(workdir=tmp_path))
