"""`edgekit train` on a CUDA GPU: NCCL, autocast (bf16 where the GPU has it, fp16 with the gradient scaler), a
checkpoint written from GPU tensors and resumed, and the teacher it writes runs on a CPU. CI has no GPU, so CI
deselects these (marker ``gpu``); on a GPU machine: ``python -m pytest tests/gpu``. Without a visible CUDA GPU
each test skips and says so."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ddp_helpers import write_digits, write_factories  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible here)")]

EPOCHS = 3  # 3 x 22 steps of a global batch of 64 on 1437 digits


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    d = tmp_path_factory.mktemp("cuda")
    train, evald = write_digits(d)
    return d, train, evald, write_factories(d)


def _train(cli, env, name: str, *extra) -> tuple[Path, dict]:
    d, train, evald, fac = env
    out = d / name / "teacher.pt2"
    r = cli("train", f"{fac}:small", "--data", train, "--eval-data", evald, "--out", out, "--seed", 1, "--json", *extra)
    assert r.exit_code == 0, r.stdout + r.stderr
    return out, json.loads(r.stdout)["metrics"]


def _cpu_accuracy(out: Path, evald: Path) -> float:
    """The teacher's accuracy on the eval split, recomputed from the .pt2 on the CPU (exported at batch 1)."""
    mod = torch.export.load(str(out)).module()
    ev = np.load(evald)
    with torch.no_grad():
        pred = [int(mod(torch.from_numpy(ev["x"][i:i + 1])).argmax(1)) for i in range(len(ev["y"]))]
    return float((np.array(pred) == ev["y"]).mean() * 100)


def test_auto_trains_on_the_gpu_with_nccl_and_autocast_and_the_teacher_runs_on_a_cpu(cli, env):
    out, m = _train(cli, env, "auto", "--epochs", EPOCHS)
    want = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    assert (m["backend"], m["precision"], m["world_size"]) == ("nccl", want, 1), m
    assert m["global_steps"] == EPOCHS * (1437 // 64)
    assert m["history"][-1]["loss"] < m["history"][0]["loss"] and np.isfinite(m["final_loss"]), m["history"]
    # each rank is bound to its GPU (init_process_group's device_id): NCCL's barrier does not guess the device
    log = (out.with_suffix(".ckpt") / "torchrun-node0.log").read_text()
    assert "using the device under current context" not in log, log[-2000:]
    assert m["eval_accuracy"] > 80, m["eval_accuracy"]  # chance is 10%; the CPU fp32 run reaches ~90 in 3 epochs
    # the teacher is a CPU program: no CUDA device in its graph, and it scores what the lineage says it scored
    ep = torch.export.load(str(out))
    assert "cuda" not in str(ep.graph_module.code) and all(p.device.type == "cpu" for p in ep.state_dict.values())
    assert m["eval_accuracy"] == pytest.approx(_cpu_accuracy(out, env[2]), abs=1e-6)
    from edgekit.inputs.source import load_pt2

    assert load_pt2(out).reference([np.load(env[2])["x"][:3]]).shape == (3, 10)


def test_fp16_trains_with_the_gradient_scaler(cli, env):
    out, m = _train(cli, env, "fp16", "--epochs", EPOCHS, "--precision", "fp16")
    assert (m["backend"], m["precision"]) == ("nccl", "fp16"), m
    assert all(np.isfinite(h["loss"]) for h in m["history"]), m["history"]
    assert m["eval_accuracy"] > 80, m["eval_accuracy"]
    assert m["eval_accuracy"] == pytest.approx(_cpu_accuracy(out, env[2]), abs=1e-6)


def test_a_checkpoint_of_gpu_tensors_resumes_on_the_gpu(cli, env):
    """A finished 1-epoch run's checkpoint (GPU tensors, read back with map_location=cpu and weights_only)
    continued to 2 epochs: the model and Adam's state go back to the GPU, and training goes on from epoch 1."""
    out, m1 = _train(cli, env, "resume", "--epochs", 1)
    ck = torch.load(out.with_suffix(".ckpt") / "last.pt", map_location="cpu", weights_only=True)
    assert ck["complete"] and ck["epoch"] == 1
    out, m2 = _train(cli, env, "resume", "--epochs", 2, "--resume")
    assert m2["resumed_from"] == {"epoch": 1, "step_in_epoch": 0, "global_step": 1437 // 64}, m2["resumed_from"]
    assert m2["global_steps"] == 2 * (1437 // 64) and len(m2["history"]) == 2
    assert m2["history"][0] == m1["history"][0]  # the first epoch is the checkpoint's, not trained again
    assert m2["history"][1]["loss"] < m2["history"][0]["loss"], m2["history"]
    assert m2["eval_accuracy"] > 60, m2["eval_accuracy"]


def test_more_processes_than_gpus_is_refused_before_starting(cli, env):
    d, train, _, fac = env
    n = torch.cuda.device_count()
    out = d / "too-many" / "teacher.pt2"
    r = cli("train", f"{fac}:small", "--data", train, "--out", out, "--nproc-per-node", n + 1, "--force")
    assert r.exit_code == 2, r.stdout + r.stderr
    assert f"--nproc-per-node {n + 1} on a node with {n} CUDA GPU(s)" in r.stderr, r.stderr
    assert f"--nproc-per-node {n} or less" in r.stderr and not out.parent.exists()
