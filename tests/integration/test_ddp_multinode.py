"""Two "nodes" on this machine: separate torchrun process groups (one per `edgekit train`
command) that meet through a c10d rendezvous on 127.0.0.1, as two machines would; and failures
while a group runs: a rank that dies, a node whose peer never comes."""

from __future__ import annotations

import json
import subprocess

import pytest

from ddp_helpers import free_port, max_abs_diff, popen, run, state_dict, write_digits, write_factories

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    d = tmp_path_factory.mktemp("nodes")
    train, evald = write_digits(d)
    return d, train, evald, write_factories(d)


def _finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        from ddp_helpers import kill_group

        kill_group(proc)
        raise
    return proc.returncode, out


def test_two_nodes_on_loopback_train_one_teacher(env):
    d, train, _, fac = env
    ep = f"127.0.0.1:{free_port()}"
    out = d / "shared" / "teacher.pt2"  # both "nodes" see one folder, as with a shared filesystem
    common = ("train", f"{fac}:nobn", "--data", train, "--epochs", 1, "--out", out, "--seed", 5, "--threads", 1,
              "--nnodes", 2, "--nproc-per-node", 1, "--rdzv-endpoint", ep, "--rdzv-timeout", 120, "--force", "--json")
    node0 = popen(*common, "--node-rank", 0)
    node1 = popen(*common, "--node-rank", 1)
    rc1, out1 = _finish(node1)
    rc0, out0 = _finish(node0)
    assert rc0 == 0 and rc1 == 0, out0 + "\n----\n" + out1
    docs = [json.loads(o.strip().splitlines()[-1]) for o in (out0, out1)]
    metrics = [doc["metrics"] for doc in docs if doc["metrics"]]
    assert metrics and metrics[0]["world_size"] == 2
    log0 = (d / "shared" / "teacher.ckpt" / "torchrun-node0.log").read_text()
    assert "--rdzv-backend c10d" in log0 and f"--rdzv-endpoint {ep}" in log0 and "is_host=true" in log0
    assert "is_host=false" in (d / "shared" / "teacher.ckpt" / "torchrun-node1.log").read_text()

    # the same training as one process with the same seed and global batch
    ref = d / "ref" / "teacher.pt2"
    p = run("train", f"{fac}:nobn", "--data", train, "--epochs", 1, "--out", ref, "--seed", 5, "--threads", 1)
    assert p.returncode == 0, p.stderr
    assert max_abs_diff(state_dict(ref), state_dict(out)) < 1e-4


def test_a_rank_that_dies_stops_the_others_with_a_clear_error(env):
    d, train, _, fac = env
    out = d / "dies" / "teacher.pt2"
    # the subprocess timeout is the bound: a hang fails the test instead of blocking the suite
    p = run("train", f"{fac}:dies_on_rank1", "--data", train, "--epochs", 2, "--out", out, "--threads", 1,
            "--nproc-per-node", 2, timeout=300)
    assert p.returncode == 3, p.stdout + p.stderr
    # without --force, the advisor first says that the digits set does not need DDP, and why
    assert "does not need distributed training" in p.stderr and "no gain" in p.stderr
    assert "rank 1 (local rank 1) exited with code 13" in p.stderr
    assert "--max-restarts 0" in p.stderr and "--resume" in p.stderr
    assert not out.exists()


def test_max_restarts_restarts_the_group_from_the_last_checkpoint(env):
    d, train, _, fac = env
    out = d / "restart" / "teacher.pt2"
    p = run("train", f"{fac}:dies_once_on_rank1", "--data", train, "--epochs", 1, "--out", out, "--threads", 1,
            "--nproc-per-node", 2, "--checkpoint-every", 2, "--max-restarts", 1, "--force", "--json", timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (d / "died-once.marker").exists(), "rank 1 did not die: the test tested nothing"
    m = json.loads(p.stdout)["metrics"]
    assert m["resumed_from"] is not None and m["resumed_from"]["global_step"] >= 2
    assert m["global_steps"] == 1437 // 64 and out.exists()


def test_a_node_whose_peers_never_come_times_out_naming_the_endpoint(env):
    d, train, _, fac = env
    ep = f"127.0.0.1:{free_port()}"
    p = run("train", f"{fac}:nobn", "--data", train, "--epochs", 1, "--out", d / "alone" / "t.pt2",
            "--nnodes", 2, "--node-rank", 0, "--rdzv-endpoint", ep, "--rdzv-timeout", 5, "--force", timeout=300)
    assert p.returncode == 3, p.stdout + p.stderr
    assert f"rendezvous at {ep} failed" in p.stderr and "2 nodes were expected" in p.stderr
