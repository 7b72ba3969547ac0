"""The scale advisor: pure estimates from described inputs, and `edgekit plan` measuring the real
digits model on the real digits data."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgekit.train.plan import PlanInputs, advise

GiB = 2**30


def inputs(**kw) -> PlanInputs:
    base = dict(rows=1437, sample_shape=(1, 8, 8), params=20_746, seconds_per_sample=2e-3, step_measured=True,
                activation_bytes_per_sample=25_000, batch_size=64, device="cpu", device_memory_bytes=16 * GiB,
                devices_per_node=1, threads=2)
    return PlanInputs(**{**base, **kw})


def test_small_set_is_single_process_and_says_why():
    plan = advise(inputs())
    r = plan.recommend
    assert (r.mode, r.processes, r.nnodes) == ("single", 1, 1)
    assert "trains an epoch" in r.why and "no gain" in r.why
    assert plan.preprocessing.engine == "polars/duckdb"
    m = plan.single
    # the sums a reader can redo: 4 B weights + 4 B grads + 8 B Adam per parameter, activations x batch
    assert (m.weights, m.gradients, m.optimizer, m.ddp_buckets) == (4 * 20_746, 4 * 20_746, 8 * 20_746, 0)
    assert m.activations == 25_000 * 64
    assert m.data == 1437 * (64 * 4 + 8)
    assert plan.epoch_s_single == pytest.approx(1437 * 2e-3)


def test_long_epoch_on_cpu_recommends_nodes_not_processes_per_node():
    plan = advise(inputs(rows=50_000_000, data_in_memory=False))
    r = plan.recommend
    assert r.mode == "ddp"
    assert r.nproc_per_node == 1  # CPU: one process per node uses all cores as threads
    assert r.nnodes == r.processes >= 2
    assert r.epoch_s <= 1.05 * 1800
    assert "per epoch" in r.why


def test_gpu_nodes_and_a_larger_global_batch_when_the_allreduce_would_dominate():
    plan = advise(inputs(rows=1_300_000_000, sample_shape=(3, 224, 224), params=25_600_000, seconds_per_sample=2e-3,
                         activation_bytes_per_sample=None, device="gpu", device_memory_bytes=80 * GiB,
                         devices_per_node=8, data_in_memory=False))
    r = plan.recommend
    assert r.mode == "ddp" and r.nproc_per_node == 8 and r.nnodes > 1
    assert r.global_batch > 64 and r.global_batch % r.processes == 0
    assert "raise the global batch" in r.why
    assert r.memory_per_device.activations is None  # not measured: not invented
    assert plan.preprocessing.engine == "cluster"


def test_model_state_larger_than_the_device_is_not_a_ddp_problem():
    plan = advise(inputs(params=2_000_000_000, device_memory_bytes=16 * GiB))
    assert plan.recommend.mode == "shard"
    assert "DDP replicates" in plan.recommend.why


def test_in_memory_data_that_does_not_fit_says_write_shards():
    plan = advise(inputs(rows=40_000_000, sample_shape=(1, 32, 32), seconds_per_sample=1e-6,
                         device_memory_bytes=8 * GiB))
    assert "write it as .npy shards" in plan.recommend.why
    assert plan.recommend.mode == "single"
    assert plan.inputs.data_in_memory is False


def test_preprocessing_threshold_is_100m_rows():
    assert advise(inputs(rows=99_999_999, data_in_memory=False)).preprocessing.engine == "polars/duckdb"
    assert advise(inputs(rows=100_000_000, data_in_memory=False)).preprocessing.engine == "cluster"


@pytest.fixture
def digits_train(tmp_path):
    from sklearn.datasets import load_digits

    d = load_digits()
    np.savez(tmp_path / "train.npz", x=(d.images[:1437] / 16).astype(np.float32).reshape(-1, 1, 8, 8),
             y=d.target[:1437].astype(np.int64))
    return tmp_path / "train.npz"


def test_cli_plan_measures_the_digits_model_on_the_digits_set(cli, digits_train):
    r = cli("plan", "examples/digits/model.py:DigitsCNN", "--data", digits_train, "--json")
    assert r.exit_code == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["inputs"]["step_measured"] is True
    assert plan["inputs"]["rows"] == 1437
    assert plan["inputs"]["params"] > 10_000
    assert plan["inputs"]["activation_bytes_per_sample"] > 0
    assert plan["recommend"]["mode"] == "single"


def test_cli_plan_described_set_and_bad_input(cli):
    r = cli("plan", "--rows", "500000000", "--sample-shape", "3,32,32", "--params", "11000000",
            "--step-ms-per-sample", "0.5", "--device", "gpu", "--device-memory-gb", "40", "--devices-per-node", "4")
    assert r.exit_code == 0, r.stderr
    assert "recommend: ddp" in r.stdout and "preprocessing: cluster" in r.stdout
    r = cli("plan", "--rows", "1000", "--sample-shape", "1,8,8")
    assert r.exit_code == 2 and "needs the model" in r.stderr
    r = cli("plan", "--params", "1000", "--step-ms-per-sample", "1")
    assert r.exit_code == 2 and "data set's size" in r.stderr


def test_cli_plan_bad_values_are_clear(cli):
    r = cli("plan", "--rows", "1000", "--sample-shape", "1,8,8", "--params", "1000", "--step-ms-per-sample", "1",
            "--optimizer", "lion")
    assert r.exit_code == 2 and "'lion'" in r.stderr
    r = cli("plan", "--rows", "1000", "--sample-shape", "1,8,8", "--params", "1000", "--step-ms-per-sample", "1",
            "--device", "tpu")
    assert r.exit_code == 2 and "'tpu'" in r.stderr
    r = cli("plan", "--rows", "1000", "--sample-shape", "1,a,8", "--params", "1000", "--step-ms-per-sample", "1")
    assert r.exit_code == 2
