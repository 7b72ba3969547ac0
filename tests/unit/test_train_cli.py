"""`edgekit train` bad input: each fails before torchrun starts, with exit 2 (or 3 for an endpoint
that cannot be reached) and a message naming the problem."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from ddp_helpers import free_port, write_factories


@pytest.fixture
def setup(tmp_path):
    from sklearn.datasets import load_digits

    d = load_digits()
    np.savez(tmp_path / "train.npz", x=(d.images[:256] / 16).astype(np.float32).reshape(-1, 1, 8, 8),
             y=d.target[:256].astype(np.int64))
    return tmp_path, tmp_path / "train.npz", write_factories(tmp_path)


def test_factory_that_does_not_import(cli, setup):
    tmp, data, _ = setup
    r = cli("train", "no_such_pkg.models:teacher", "--data", data, "--out", tmp / "t.pt2")
    assert r.exit_code == 2
    assert "cannot import 'no_such_pkg.models'" in r.stderr
    bad = tmp / "broken.py"
    bad.write_text("import torch\nraise RuntimeError('boom in module')\n")
    r = cli("train", f"{bad}:teacher", "--data", data, "--out", tmp / "t.pt2")
    assert r.exit_code == 2 and "boom in module" in r.stderr
    assert not (tmp / "t.pt2").exists()


def test_factory_attribute_missing_or_not_a_module(cli, setup):
    tmp, data, fac = setup
    r = cli("train", f"{fac}:nope", "--data", data, "--out", tmp / "t.pt2")
    assert r.exit_code == 2 and "has no 'nope'" in r.stderr
    r = cli("train", f"{fac}:os", "--data", data, "--out", tmp / "t.pt2")
    assert r.exit_code == 2 and "not callable" in r.stderr


def test_labels_that_do_not_match_the_model_outputs(cli, setup):
    tmp, data, fac = setup
    r = cli("train", f"{fac}:five_classes", "--data", data, "--out", tmp / "t.pt2")
    assert r.exit_code == 2
    assert "labels in train.npz run from 0 to 9" in r.stderr and "5 outputs" in r.stderr
    assert not (tmp / "t.ckpt" / "config.json").exists()  # failed before anything was started


def test_samples_that_do_not_fit_the_model(cli, setup):
    tmp, _, fac = setup
    np.savez(tmp / "flat.npz", x=np.zeros((10, 64), np.float32), y=np.zeros(10, np.int64))
    r = cli("train", f"{fac}:small", "--data", tmp / "flat.npz", "--out", tmp / "t.pt2")
    assert r.exit_code == 2 and "cannot run on samples of shape (64,)" in r.stderr and "--input-shape" in r.stderr


def test_batch_that_does_not_split_and_bad_out(cli, setup):
    tmp, data, fac = setup
    r = cli("train", f"{fac}:small", "--data", data, "--out", tmp / "t.pt2", "--batch-size", "63", "--nproc-per-node", "2")
    assert r.exit_code == 2 and "does not split evenly over 2 processes" in r.stderr
    r = cli("train", f"{fac}:small", "--data", data, "--out", tmp / "t.onnx")
    assert r.exit_code == 2 and "must end in .pt2" in r.stderr
    r = cli("train", f"{fac}:small", "--data", data, "--out", tmp / "t.pt2", "--nnodes", "2")
    assert r.exit_code == 2 and "needs --rdzv-endpoint" in r.stderr


def test_resume_without_a_checkpoint(cli, setup):
    tmp, data, fac = setup
    r = cli("train", f"{fac}:small", "--data", data, "--out", tmp / "t.pt2", "--resume")
    assert r.exit_code == 2 and "no checkpoint" in r.stderr and "t.ckpt" in r.stderr


def test_unreachable_rendezvous_endpoint_fails_within_the_timeout_naming_it(cli, setup):
    tmp, data, fac = setup
    port = free_port()  # nothing listens there
    r = cli("train", f"{fac}:small", "--data", data, "--out", tmp / "t.pt2", "--nnodes", "2", "--node-rank", "1",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-timeout", "2", "--force")
    assert r.exit_code == 3, r.stderr
    assert f"cannot reach the rendezvous endpoint 127.0.0.1:{port} within 2 s" in r.stderr
    assert "start node 0" in r.stderr
    assert not (tmp / "t.ckpt" / "torchrun-node1.log").exists()  # torchrun was never started


def test_torchrun_failure_summary_names_the_rank_that_died_not_the_survivor(tmp_path):
    """A real torchrun summary (recorded from the rank-death integration test): its "root cause" is
    rank 0, which gloo told that its peer closed the connection; the rank that died is rank 1."""
    from edgekit.train.config import TrainConfig
    from edgekit.train.launch import TrainFailedError, _failures, _raise_failure

    tail = (Path(__file__).parent / "fixtures" / "torchrun_rank_death_summary.txt").read_text()
    assert [(f["rank"], f["exitcode"]) for f in _failures(tail)] == [(0, -15), (1, 13)]
    cfg = TrainConfig(factory="m:f", data=tmp_path / "d.npz", out=tmp_path / "t.pt2", nproc_per_node=2)
    with pytest.raises(TrainFailedError) as ei:
        _raise_failure(cfg, 1, tail, tmp_path / "log")
    assert "rank 1 (local rank 1) exited with code 13; rank(s) 0 stopped after it" in ei.value.message
    assert ei.value.exit_code == 3


def test_fp16_on_cpu_is_refused_before_starting(cli, setup):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("fp16 is valid with a GPU")
    tmp, data, fac = setup
    r = cli("train", f"{fac}:small", "--data", data, "--out", tmp / "t.pt2", "--precision", "fp16")
    assert r.exit_code == 2 and "fp16 needs a CUDA GPU" in r.stderr


def test_nccl_without_a_gpu_is_refused_before_starting(setup):
    import torch

    from edgekit.errors import ConfigError
    from edgekit.train import train

    if torch.cuda.is_available():
        pytest.skip("NCCL is valid with a GPU (tests/gpu/test_train_cuda.py checks that machine)")
    tmp, data, fac = setup
    with pytest.raises(ConfigError) as ei:
        train(f"{fac}:small", data, tmp / "t.pt2", backend="nccl")
    assert ei.value.exit_code == 2 and "backend nccl needs a CUDA GPU" in ei.value.message
    assert not (tmp / "t.ckpt").exists()  # refused before anything was written or started


def test_help_does_not_import_torch():
    import subprocess

    code = ("import sys\nfrom edgekit.cli.main import main\n"
            "for c in (['train', '--help'], ['plan', '--help']):\n"
            "    try:\n        main(c)\n    except SystemExit:\n        pass\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "--nproc-per-node" in p.stdout and "--rdzv-endpoint" in p.stdout and "--target-epoch-minutes" in p.stdout


def test_option_values_outside_their_choices_name_the_option(cli, setup):
    tmp, data, fac = setup
    r = cli("train", f"{fac}:small", "--data", data, "--out", tmp / "t.pt2", "--precision", "fp8")
    assert r.exit_code == 2 and "'precision'" in r.stderr and "'fp8'" in r.stderr
    r = cli("train", f"{fac}:small", "--data", data, "--out", tmp / "t.pt2", "--optimizer", "lion")
    assert r.exit_code == 2 and "'optimizer'" in r.stderr
    import edgekit

    with pytest.raises(edgekit.EdgekitError, match="no_such_option"):
        edgekit.train(f"{fac}:small", data, tmp / "t.pt2", no_such_option=1)
