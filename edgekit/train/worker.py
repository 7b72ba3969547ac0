"""The training worker that torchrun starts once per process:

    python -m torch.distributed.run --nproc-per-node N ... -m edgekit.train.worker RUN_DIR/config.json

edgekit neither launches processes nor reduces gradients itself: torchrun starts and supervises the
workers, ``DistributedDataParallel`` all-reduces the gradients (gloo on CPU, NCCL on GPUs).

Equivalence with 1-process training. With the same seed and the same GLOBAL batch B over W processes,
every rank takes B/W samples per step from its DistributedSampler shard, and the W shards of a step
together hold exactly the samples that one process would take (DistributedSampler deals the epoch's
permutation round-robin). DDP averages the per-rank mean gradients, which is the mean over the global
batch. The last incomplete global batch of an epoch is dropped so that no rank pads. What remains
different is float summation order, and BatchNorm on CPU: SyncBatchNorm needs a GPU, so on CPU each
rank normalises with its own B/W samples (a warning says so).

Precision: ``auto`` is bf16 autocast on GPUs that support bf16, fp16 autocast + GradScaler on older
GPUs, and fp32 on CPU (bf16 autocast on CPU is opt-in with ``--precision bf16``: it helps only on CPUs
with native bf16 and gives up the exact 1-vs-N-process equivalence).
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np

from ..artifact import LineageStep
from ..errors import ConfigError, EdgekitError
from ..fsutil import atomic_write_text, sha256_file
from . import checkpoint
from .config import TrainConfig
from .data import load_train_data
from .model import build_model, check_fits


def _log(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"edgekit-train: {msg}", flush=True)


def _precision(cfg: TrainConfig, device) -> str:
    import torch

    if cfg.precision != "auto":
        if cfg.precision == "fp16" and device.type != "cuda":
            raise ConfigError("--precision fp16 needs a CUDA GPU (CPU autocast supports bf16 only)",
                              hint="use --precision bf16 or fp32 on CPU")
        return cfg.precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "fp32"


def _write_error(cfg: TrainConfig, rank: int, exc: EdgekitError) -> None:
    d = cfg.run_dir / "errors"
    d.mkdir(parents=True, exist_ok=True)
    atomic_write_text(d / f"rank{rank}.json", json.dumps(
        {"type": type(exc).__name__, "message": exc.message, "hint": exc.hint, "exit_code": exc.exit_code}))


def _attempt_store(rank: int, world: int, timeout):
    """The store torchrun's env:// rendezvous would give, under a prefix per restart attempt.

    With --standalone, torchrun keeps one store across --max-restarts; a restarted group would read
    the dead attempt's keys (the gloo addresses of processes that no longer exist) and fail to
    connect, or hang. The prefix gives every attempt its own keys."""
    from torch.distributed import PrefixStore, TCPStore

    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    base = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size=world,
                    is_master=not agent_store and rank == 0, timeout=timeout, multi_tenant=not agent_store)
    return PrefixStore(f"edgekit/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", base)


def train_worker(cfg: TrainConfig) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data.distributed import DistributedSampler

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    use_cuda = cfg.backend == "nccl" or (cfg.backend == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    backend = "nccl" if use_cuda else "gloo"
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    timeout = timedelta(seconds=cfg.collective_timeout)
    # device_id: NCCL binds this rank to its GPU (without it every barrier warns that it guesses the device)
    dist.init_process_group(backend, store=_attempt_store(rank, world, timeout), rank=rank, world_size=world,
                            timeout=timeout, **({"device_id": device} if use_cuda else {}))
    try:
        _train(cfg, rank, world, device, backend, torch, dist, DDP, DistributedSampler)
    finally:
        dist.destroy_process_group()


def _train(cfg, rank, world, device, backend, torch, dist, DDP, DistributedSampler) -> None:
    data = load_train_data(cfg.data, x_key=cfg.x_key, y_key=cfg.y_key, input_shape=cfg.input_shape)
    torch.manual_seed(cfg.seed)  # every rank builds identical initial weights (DDP also broadcasts rank 0's)
    model = build_model(cfg.factory)
    classes = check_fits(model, data, cfg.factory)
    has_bn = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    if world > 1 and has_bn:
        if device.type == "cuda":
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        else:
            _log(rank, "warning: BatchNorm on CPU normalises over each process's share of the batch "
                       "(SyncBatchNorm needs a GPU); results differ slightly from 1-process training")
    model.to(device)
    precision = _precision(cfg, device)
    params = model.parameters()
    opt = (torch.optim.Adam(params, lr=cfg.lr) if cfg.optimizer == "adam"
           else torch.optim.SGD(params, lr=cfg.lr, momentum=0.9))
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None

    G = cfg.batch_size
    per_rank = G // world
    steps_per_epoch = data.n // G
    if steps_per_epoch == 0:
        raise ConfigError(f"{data.n} training samples are fewer than one global batch of {G}",
                          hint=f"pass --batch-size {max(world, data.n // world * world)} or less")
    fp = checkpoint.fingerprint(cfg, data.n)
    epoch, step_in_epoch, global_step, history, resumed_from = 0, 0, 0, [], None
    state = None
    if cfg.resume:
        state = checkpoint.load(cfg.run_dir)
    elif int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0 and (cfg.run_dir / checkpoint.CHECKPOINT).is_file():
        # torchrun restarted the group after a failure (--max-restarts): continue from this run's last
        # checkpoint (the launcher removed any earlier run's before starting)
        state = checkpoint.load(cfg.run_dir)
    if state is not None:
        checkpoint.check_compatible(state["fingerprint"], fp, cfg.run_dir / checkpoint.CHECKPOINT)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        epoch, step_in_epoch, global_step = int(state["epoch"]), int(state["step_in_epoch"]), int(state["global_step"])
        history = json.loads(state["history"])
        resumed_from = {"epoch": epoch, "step_in_epoch": step_in_epoch, "global_step": global_step}
        _log(rank, f"resuming from {cfg.run_dir / checkpoint.CHECKPOINT}: epoch {epoch}, step {step_in_epoch}")

    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None) if world > 1 else model
    sampler = DistributedSampler(range(data.n), num_replicas=world, rank=rank, shuffle=True, seed=cfg.seed)
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)

    def save_checkpoint(complete: bool = False) -> None:
        if rank != 0:
            return
        checkpoint.save(cfg.run_dir, {
            "model": model.state_dict(), "optimizer": opt.state_dict(), "rng": torch.get_rng_state(),
            "epoch": epoch, "step_in_epoch": step_in_epoch, "global_step": global_step,
            "history": json.dumps(history), "fingerprint": fp, "complete": complete, "world_size": world,
        })

    t_start, steps_run = time.perf_counter(), 0
    while epoch < cfg.epochs:
        sampler.set_epoch(epoch)
        order = np.fromiter(iter(sampler), dtype=np.int64)
        sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss*n, correct, n over this epoch
        if history and history[-1]["epoch"] == epoch:  # resumed mid-epoch: carry the partial sums
            part = history.pop()
            sums += torch.tensor([part["_loss_sum"], part["_correct"], part["_n"]], dtype=torch.float64,
                                 device=device) / world
        t_epoch = time.perf_counter()
        ddp.train()
        while step_in_epoch < steps_per_epoch:
            idx = order[step_in_epoch * per_rank:(step_in_epoch + 1) * per_rank]
            xb, yb = data.take(idx)
            xb, yb = torch.from_numpy(xb).to(device), torch.from_numpy(yb).to(device)
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                logits = ddp(xb)
                loss = torch.nn.functional.cross_entropy(logits.float(), yb)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            with torch.no_grad():
                sums += torch.stack([loss.detach().double() * len(yb),
                                     (logits.argmax(1) == yb).sum().double(),
                                     torch.tensor(float(len(yb)), dtype=torch.float64, device=device)])
            step_in_epoch += 1
            global_step += 1
            steps_run += 1
            if cfg.checkpoint_every and global_step % cfg.checkpoint_every == 0 and step_in_epoch < steps_per_epoch:
                total = sums.clone()
                dist.all_reduce(total)
                history.append({"epoch": epoch, "_loss_sum": total[0].item(), "_correct": total[1].item(),
                                "_n": total[2].item()})
                save_checkpoint()
                history.pop()
        dist.all_reduce(sums)  # metrics only; the gradients were reduced by DDP
        loss_sum, correct, n = (float(v) for v in sums.tolist())
        history.append({"epoch": epoch, "loss": loss_sum / n, "train_accuracy": 100.0 * correct / n,
                        "samples": int(n), "seconds": round(time.perf_counter() - t_epoch, 3)})
        _log(rank, f"epoch {epoch + 1}/{cfg.epochs} loss {loss_sum / n:.4f} "
                   f"train accuracy {100.0 * correct / n:.2f}% ({int(n)} samples, world {world}, {backend}, {precision})")
        epoch += 1
        step_in_epoch = 0
        save_checkpoint(complete=epoch >= cfg.epochs)
    seconds = time.perf_counter() - t_start
    dist.barrier()
    if rank == 0:
        _finish(cfg, model, data, classes, history, world, backend, precision, steps_per_epoch, global_step,
                steps_run, seconds, resumed_from, torch)
    dist.barrier()


def _finish(cfg, model, data, classes, history, world, backend, precision, steps_per_epoch, global_step,
            steps_run, seconds, resumed_from, torch) -> None:
    model = model.to("cpu").float().eval()
    eval_acc = None
    if cfg.eval_data is not None:
        ev = load_train_data(cfg.eval_data, x_key=cfg.x_key, y_key=cfg.y_key, input_shape=cfg.input_shape)
        x, y = ev.take(np.arange(ev.n))
        with torch.no_grad():
            eval_acc = float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean() * 100)
    x1, _ = data.take(np.arange(1))
    ep = torch.export.export(model, (torch.from_numpy(x1),))
    # temp + rename like fsutil.atomic_path, but the temp name keeps the .pt2 suffix torch.export expects
    tmp = cfg.out.with_name(f".{cfg.out.name}.{os.getpid()}.tmp.pt2")
    try:
        torch.export.save(ep, str(tmp))
        os.replace(tmp, cfg.out)
    finally:
        tmp.unlink(missing_ok=True)
    metrics = {
        "epochs": cfg.epochs, "global_steps": global_step, "steps_per_epoch": steps_per_epoch,
        "final_loss": history[-1]["loss"], "final_train_accuracy": history[-1]["train_accuracy"],
        "eval_accuracy": eval_acc, "classes": classes, "train_samples": data.n,
        "world_size": world, "backend": backend, "precision": precision,
        # throughput of this launch only (a resumed run counts its own steps)
        "samples_per_s": round(steps_run * cfg.batch_size / seconds, 2) if steps_run and seconds > 0 else None,
        "seconds": round(seconds, 3), "resumed_from": resumed_from,
        "history": history,
    }
    config = {k: v for k, v in cfg.model_dump(mode="json").items()
              if k in ("factory", "data", "epochs", "batch_size", "lr", "optimizer", "seed", "precision",
                       "nproc_per_node", "nnodes", "input_shape")}
    step = LineageStep(kind="source", name="train", config=config, metrics=metrics, seconds=round(seconds, 3))
    doc = {"schema_version": 1, "artifact": str(cfg.out), "sha256": sha256_file(cfg.out),
           "lineage": [step.model_dump(mode="json")]}
    atomic_write_text(cfg.lineage_path, json.dumps(doc, indent=2))
    atomic_write_text(cfg.run_dir / "result.json", json.dumps(doc))
    print(f"edgekit-train: wrote {cfg.out} and {cfg.lineage_path}", flush=True)


def _die_with_agent() -> None:
    """torchrun starts each worker in a session of its own, so a SIGKILLed agent (a killed job, an
    OOM kill) would leave its workers training unsupervised, writing checkpoints under a resumed run.
    On Linux, ask the kernel to kill this worker when its parent, the agent, dies."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    ppid = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != ppid:  # the agent died before the request took effect
        os._exit(1)


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import record

    _die_with_agent()
    argv = sys.argv[1:] if argv is None else argv
    cfg = TrainConfig.model_validate_json(Path(argv[0]).read_text())
    rank = int(os.environ.get("RANK", "0"))

    @record  # torchrun shows the failing rank's traceback in its summary
    def run() -> int:
        try:
            train_worker(cfg)
        except EdgekitError as exc:  # bad input: the launcher re-raises it with its own exit code
            _write_error(cfg, rank, exc)
            print(f"edgekit-train: rank {rank}: {exc}", file=sys.stderr, flush=True)
            return exc.exit_code
        return 0

    return run()


if __name__ == "__main__":
    sys.exit(main())
