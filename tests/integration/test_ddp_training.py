"""Real DDP training through torchrun (gloo on CPU): 1 process vs 2 processes reach the same
weights, and a run killed after a checkpoint resumes and finishes with the weights an unkilled run
reaches. Each test starts real torchrun process groups, so they are slow on 2 cores."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from ddp_helpers import kill_group, max_abs_diff, popen, run, state_dict, write_digits, write_factories

pytestmark = pytest.mark.slow

EPOCHS = 2  # 2 x 22 steps of a global batch of 64 on 1437 digits


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    d = tmp_path_factory.mktemp("ddp")
    train, evald = write_digits(d)
    return d, train, evald, write_factories(d)


@pytest.fixture(scope="module")
def one_process(env):
    d, train, evald, fac = env
    out = d / "one" / "teacher.pt2"
    p = run("train", f"{fac}:nobn", "--data", train, "--eval-data", evald, "--epochs", EPOCHS, "--out", out,
            "--seed", 3, "--threads", 1, "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    return out, json.loads(p.stdout)


def test_one_process_writes_a_pt2_teacher_and_its_metrics_in_lineage(one_process, env):
    out, res = one_process
    ep = torch.export.load(str(out))
    x = torch.from_numpy(np.load(env[2])["x"][:1])
    assert ep.module()(x).shape == (1, 10)
    doc = json.loads(out.with_name("teacher.pt2.lineage.json").read_text())
    step = doc["lineage"][0]
    assert (step["kind"], step["name"]) == ("source", "train")
    m = step["metrics"]
    assert m["world_size"] == 1 and m["backend"] == "gloo" and m["precision"] == "fp32"
    assert m["global_steps"] == EPOCHS * (1437 // 64)
    assert len(m["history"]) == EPOCHS and m["history"][-1]["loss"] < m["history"][0]["loss"]
    # the recorded eval accuracy is the saved teacher's on the eval split (recomputed here from the .pt2),
    # and 2 epochs of real training put it far above the 10% of chance on 10 classes
    ev, mod = np.load(env[2]), ep.module()
    with torch.no_grad():  # the program was exported at batch 1
        pred = np.array([int(mod(torch.from_numpy(ev["x"][i:i + 1])).argmax(1)) for i in range(len(ev["y"]))])
    assert m["eval_accuracy"] == pytest.approx(float((pred == ev["y"]).mean() * 100), abs=1e-6)
    assert m["eval_accuracy"] > 50, m["eval_accuracy"]
    assert res["metrics"] == m
    from edgekit.fsutil import sha256_file

    assert doc["sha256"] == sha256_file(out)
    # the teacher is what the rest of edgekit takes (e.g. `edgekit distill --teacher teacher.pt2`)
    from edgekit.inputs.source import load_pt2

    src = load_pt2(out)
    assert src.artifact.io.inputs[0].shape == (1, 1, 8, 8)
    assert src.reference([np.load(env[2])["x"][:3]]).shape == (3, 10)


def test_two_processes_reach_the_same_weights_as_one(one_process, env):
    d, train, _, fac = env
    out = d / "two" / "teacher.pt2"
    p = run("train", f"{fac}:nobn", "--data", train, "--epochs", EPOCHS, "--out", out, "--seed", 3,
            "--nproc-per-node", 2, "--threads", 1, "--force", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(p.stdout)
    assert res["metrics"]["world_size"] == 2
    assert res["warnings"] == [] and "does not need distributed" not in p.stderr  # --force silences the advisor
    a, b = state_dict(one_process[0]), state_dict(out)
    diff = max_abs_diff(a, b)
    assert diff < 1e-4, f"1-process and 2-process weights differ by {diff}"
    assert res["metrics"]["final_loss"] == pytest.approx(one_process[1]["metrics"]["final_loss"], abs=1e-4)


def test_another_seed_gives_other_weights(one_process, env):
    # the guard for the test above: equal weights must come from equal training, not from nothing changing
    d, train, _, fac = env
    out = d / "seed4" / "teacher.pt2"
    p = run("train", f"{fac}:nobn", "--data", train, "--epochs", 1, "--out", out, "--seed", 4, "--threads", 1)
    assert p.returncode == 0, p.stdout + p.stderr
    assert max_abs_diff(state_dict(one_process[0]), state_dict(out)) > 1e-3


def test_killed_run_resumes_from_its_checkpoint_and_finishes_like_an_unkilled_one(one_process, env):
    d, train, evald, fac = env
    out = d / "resume" / "teacher.pt2"
    ckpt = d / "resume" / "teacher.ckpt" / "last.pt"
    args = ("train", f"{fac}:nobn", "--data", train, "--epochs", EPOCHS, "--out", out, "--seed", 3,
            "--threads", 1, "--checkpoint-every", 5)
    proc = popen(*args, "--nproc-per-node", 2, "--force")
    try:
        deadline = time.monotonic() + 240
        while not ckpt.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ckpt.exists(), f"no checkpoint appeared: {proc.poll()} {proc.stdout.read() if proc.poll() is not None else ''}"
    finally:
        survivors = kill_group(proc)  # SIGKILL edgekit and torchrun; the workers must follow
    assert not survivors, f"workers {survivors} kept running after torchrun was killed"
    assert not out.exists(), "killed before the end, yet a teacher was written"
    saved = torch.load(ckpt, weights_only=True)
    assert saved["global_step"] >= 5 and saved["complete"] is False
    assert {"model", "optimizer", "epoch", "step_in_epoch"} <= saved.keys()
    assert saved["optimizer"]["state"], "optimizer state (Adam moments) is in the checkpoint"

    # a fresh start over an unfinished checkpoint is refused: it would silently throw the run away
    p = run(*args)
    assert p.returncode == 2 and "--resume" in p.stderr
    # resuming with settings that change the trajectory is refused, naming the setting
    p = run(*args, "--resume", "--lr", "0.01")
    assert p.returncode == 2 and "lr was 0.001 in the checkpoint" in p.stderr
    # resume with 1 process: a global batch holds the same samples at any world size
    p = run(*args, "--resume", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    m = json.loads(p.stdout)["metrics"]
    assert m["resumed_from"]["global_step"] == saved["global_step"]
    assert m["global_steps"] == EPOCHS * (1437 // 64)
    diff = max_abs_diff(state_dict(one_process[0]), state_dict(out))
    assert diff < 1e-4, f"resumed run differs from the unkilled run by {diff}"


def test_npy_shards_train_the_same_weights_as_the_npz(one_process, env):
    """The memory-mapped shard reader, through the real worker: same samples, same order, same weights."""
    d, train, _, fac = env
    shards = d / "shards"
    shards.mkdir()
    z = np.load(train)
    for i, (a, b) in enumerate([(0, 500), (500, 1000), (1000, len(z["y"]))]):
        np.save(shards / f"x_{i:05d}.npy", z["x"][a:b])
        np.save(shards / f"y_{i:05d}.npy", z["y"][a:b])
    out = d / "from-shards" / "teacher.pt2"
    p = run("train", f"{fac}:nobn", "--data", shards, "--epochs", EPOCHS, "--out", out, "--seed", 3, "--threads", 1)
    assert p.returncode == 0, p.stdout + p.stderr
    assert max_abs_diff(state_dict(one_process[0]), state_dict(out)) < 1e-5
