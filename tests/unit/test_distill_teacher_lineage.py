"""A teacher made by `edgekit train` carries its training lineage (the .lineage.json sidecar) into
the distilled student's lineage, so the chain train -> distill -> quantize stays traceable."""

import json
import shutil
from pathlib import Path

from edgekit.inputs.data import load_npz
from edgekit.inputs.source import load_pt2
from edgekit.passes import PassContext, get_pass

MODELS = Path(__file__).resolve().parent / "_compress_models.py"


def test_teacher_training_lineage_reaches_the_student(digits, tmp_path):
    teacher_path = tmp_path / "teacher.pt2"
    shutil.copyfile(digits.pt2, teacher_path)
    step = {"kind": "pass", "name": "train", "config": {"epochs": 3, "nproc_per_node": 2}, "metrics": {"eval": 98.0}}
    (tmp_path / "teacher.pt2.lineage.json").write_text(json.dumps(step))
    ctx = PassContext(workdir=tmp_path / "w", train=load_npz(digits.train), eval=load_npz(digits.eval))
    out = get_pass("distill")(load_pt2(teacher_path).artifact, {"student": f"{MODELS}:small_student", "epochs": 1},
                              ctx)
    assert out.lineage[-1].metrics["teacher_lineage"] == [step]
    # a teacher without a sidecar says so with None, not an invented history
    out2 = get_pass("distill")(load_pt2(digits.pt2).artifact, {"student": f"{MODELS}:small_student", "epochs": 1},
                               PassContext(workdir=tmp_path / "w2", train=load_npz(digits.train),
                                           eval=load_npz(digits.eval)))
    assert out2.lineage[-1].metrics["teacher_lineage"] is None
