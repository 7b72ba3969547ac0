"""Starting a training run: checks that fail fast in this process, then torchrun.

    python -m torch.distributed.run --nproc-per-node N (--standalone | --nnodes M --node-rank R
        --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id ID) --max-restarts K
        -m edgekit.train.worker RUN_DIR/config.json

torchrun's failure policy (documented, not reimplemented): when any worker exits non-zero, the
agent on that node stops the node's other workers and, if ``--max-restarts`` allows, restarts the
whole group (all ranks, from the last checkpoint when ``--resume`` semantics are wanted, see docs/guides/training.md);
with the default ``--max-restarts 0`` it exits with a summary naming the first failed rank. Workers on
other nodes see their peer's TCP connection close (gloo) and fail too; ``collective_timeout`` bounds
any wait that no closed connection interrupts.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from .. import errors
from ..errors import BadInputError, ConfigError, DeviceError, OutputError, TransportError
from ..fsutil import atomic_write_text
from . import checkpoint
from .config import TrainConfig
from .data import load_train_data
from .model import build_model, check_fits
from .plan import advise_for_run


class TrainFailedError(DeviceError):
    """A training process died or the process group could not be formed (exit 3)."""


@dataclass
class TrainResult:
    out: Optional[Path]  # None on a node whose processes did not hold global rank 0
    lineage_path: Optional[Path]
    metrics: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    log: Optional[Path] = None


def _absolute(cfg: TrainConfig) -> TrainConfig:
    upd: dict[str, Any] = {"data": cfg.data.resolve(), "out": cfg.out.resolve()}
    if cfg.eval_data:
        upd["eval_data"] = cfg.eval_data.resolve()
    upd["checkpoint_dir"] = cfg.run_dir.resolve()
    mod, _, attr = cfg.factory.rpartition(":")
    if mod.endswith(".py"):
        upd["factory"] = f"{Path(mod).resolve()}:{attr}"
    return cfg.model_copy(update=upd)


def _parse_endpoint(ep: str) -> tuple[str, int]:
    host, sep, port = ep.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadInputError(f"--rdzv-endpoint {ep!r} is not HOST:PORT", hint="e.g. --rdzv-endpoint 10.0.0.1:29400")
    return host.strip("[]"), int(port)


def wait_for_endpoint(ep: str, timeout: float) -> None:
    """Node R > 0 connects to node 0's rendezvous store; fail within ``timeout`` naming the endpoint."""
    host, port = _parse_endpoint(ep)
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(2.0, timeout)):
                return
        except OSError as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise TransportError(
                f"cannot reach the rendezvous endpoint {host}:{port} within {timeout:g} s ({last})",
                hint="start node 0 (--node-rank 0) first, and check the host, the port and any firewall between nodes")
        time.sleep(0.5)


def torchrun_argv(cfg: TrainConfig, config_path: Path) -> list[str]:
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(cfg.nproc_per_node),
            "--max-restarts", str(cfg.max_restarts), "--monitor-interval", "0.5"]
    if cfg.nnodes == 1 and not cfg.rdzv_endpoint:
        argv.append("--standalone")  # a private rendezvous on a free local port
    else:
        _parse_endpoint(cfg.rdzv_endpoint or "")
        t = cfg.rdzv_timeout
        argv += ["--nnodes", str(cfg.nnodes), "--node-rank", str(cfg.node_rank), "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", cfg.rdzv_endpoint, "--rdzv-id", cfg.rdzv_id or _default_rdzv_id(cfg),
                 # node 0 hosts the rendezvous store; the others only connect (never start a second one)
                 "--rdzv-conf", f"is_host={'true' if cfg.node_rank == 0 else 'false'},join_timeout={t},"
                                f"read_timeout={t},last_call_timeout=5"]
    return [*argv, "-m", "edgekit.train.worker", str(config_path)]


def _default_rdzv_id(cfg: TrainConfig) -> str:
    # the same command on every node gives the same id; paths are node-local, so only their names count
    key = f"{cfg.factory.rpartition(':')[2]}|{cfg.data.name}|{cfg.out.name}|{cfg.epochs}|{cfg.seed}"
    return "edgekit-" + hashlib.sha256(key.encode()).hexdigest()[:12]


_RDZV = re.compile(r"(RendezvousConnectionError|RendezvousTimeoutError|RendezvousClosedError|"
                   r"RendezvousStateError|DistNetworkError)")


def _failures(tail: str) -> list[dict[str, Any]]:
    """The per-rank blocks of torchrun's ChildFailedError summary, root cause first."""
    i = tail.rfind("Failures:")
    if i < 0:
        return []
    text = tail[i:]
    root = text.find("Root Cause")
    blocks = re.split(r"\n\[\d+\]:\n", text[root:] if root >= 0 else text)[1:]
    if root >= 0:
        blocks += re.split(r"\n\[\d+\]:\n", text[:root])[1:]
    out = []
    for b in blocks:
        rm = re.search(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)", b)
        em = re.search(r"exitcode\s*:\s*(-?\d+)", b)
        if rm and em:
            out.append({"rank": int(rm.group(1)), "local_rank": int(rm.group(2)), "exitcode": int(em.group(1)),
                        "text": b})
    return out


def _raise_failure(cfg: TrainConfig, rc: int, tail: str, log: Path) -> None:
    err_dir = cfg.run_dir / "errors"
    for f in sorted(err_dir.glob("rank*.json")) if err_dir.is_dir() else []:
        info = json.loads(f.read_text())
        cls = getattr(errors, info["type"], None)
        if not (isinstance(cls, type) and issubclass(cls, errors.EdgekitError)) or cls is errors.MissingExtraError:
            cls = BadInputError
        exc = cls.__new__(cls)
        errors.EdgekitError.__init__(exc, info["message"], hint=info.get("hint"))
        if isinstance(exc, errors.ConversionError):
            exc.hop = "train"
        raise exc
    m = _RDZV.search(tail)
    if m and cfg.rdzv_endpoint:
        waited = "waiting for all nodes to join" if "Timeout" in m.group(1) else "talking to the rendezvous store"
        raise TransportError(
            f"rendezvous at {cfg.rdzv_endpoint} failed ({m.group(1)}) {waited}; {cfg.nnodes} nodes were expected, "
            f"timeout {cfg.rdzv_timeout} s", hint=f"start every node with the same --rdzv-endpoint and --nnodes; log: {log}")
    failures = _failures(tail)
    if failures:
        # torchrun's "root cause" is the earliest timestamp, which can be a survivor that noticed the
        # dead peer first (gloo: "Connection closed by peer") or that torchrun itself SIGTERMed:
        # the rank that really failed is one that was neither.
        def secondary(f: dict) -> bool:
            return f["exitcode"] == -15 or "Connection closed by peer" in f["text"] or "remote worker" in f["text"]

        cause = next((f for f in failures if not secondary(f)), failures[0])
        code = cause["exitcode"]
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        others = sorted({f["rank"] for f in failures} - {cause["rank"]})
        then = (f"; rank(s) {', '.join(map(str, others))} stopped after it" if others else "")
        raise TrainFailedError(
            f"training failed: rank {cause['rank']} (local rank {cause['local_rank']}) {how}{then}; torchrun stopped "
            f"the other processes (--max-restarts {cfg.max_restarts})",
            hint=f"see the rank's output in {log}; after fixing it, continue from the last checkpoint with --resume")
    last = "\n".join(tail.strip().splitlines()[-6:])
    raise TrainFailedError(f"torchrun exited with code {rc}:\n{last}", hint=f"full log: {log}")


def _die_with_parent() -> None:
    # torchrun dies with this process (a killed `edgekit train` leaves no torchrun behind; its workers
    # in turn die with torchrun, see worker._die_with_agent)
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def _check_devices(cfg: TrainConfig) -> None:
    """Refuse, before torchrun starts N workers, what the workers would fail on: fp16 or NCCL without a
    CUDA GPU, and more processes on a node than it has GPUs (each NCCL rank takes a GPU of its own: the
    extra rank's ``torch.cuda.set_device`` would die with "invalid device ordinal")."""
    import torch

    cuda = torch.cuda.is_available()
    if cfg.backend == "nccl" and not cuda:
        raise ConfigError("backend nccl needs a CUDA GPU, and this machine has none visible",
                          hint="use backend auto or gloo (CPU processes)")
    if cfg.precision == "fp16" and (not cuda or cfg.backend == "gloo"):
        raise ConfigError("--precision fp16 needs a CUDA GPU (CPU autocast supports bf16 only)",
                          hint="use --precision bf16 or fp32 on CPU")
    gpus = torch.cuda.device_count() if cuda and cfg.backend != "gloo" else 0
    if gpus and cfg.nproc_per_node > gpus:
        raise ConfigError(f"--nproc-per-node {cfg.nproc_per_node} on a node with {gpus} CUDA GPU(s): training on a GPU "
                          "runs one process per GPU (NCCL)",
                          hint=f"pass --nproc-per-node {gpus} or less (a larger --batch-size fills a GPU), or hide "
                               "the GPUs (CUDA_VISIBLE_DEVICES=) to train CPU processes with gloo")


def run(cfg: TrainConfig, *, echo: Optional[Callable[[str], None]] = None, check: bool = True,
        force: bool = False) -> TrainResult:
    """Validate, then train with torchrun; returns where the teacher and its metrics were written."""

    cfg = _absolute(cfg)
    _check_devices(cfg)
    if os.getcwd() not in sys.path:  # `edgekit train mypkg.models:teacher` resolves mypkg from here
        sys.path.insert(0, os.getcwd())
    data = load_train_data(cfg.data, x_key=cfg.x_key, y_key=cfg.y_key, input_shape=cfg.input_shape)
    warnings: list[str] = []
    if check:
        model = build_model(cfg.factory)
        check_fits(model, data, cfg.factory)
        if cfg.world_size > 1 and not force:
            advice = advise_for_run(model, data, cfg)
            if advice.recommend.processes == 1:
                warnings.append(f"this data set does not need distributed training: {advice.recommend.why} "
                                "(pass --force to silence this warning)")
        del model
    if cfg.eval_data:
        load_train_data(cfg.eval_data, x_key=cfg.x_key, y_key=cfg.y_key, input_shape=cfg.input_shape)
    if cfg.out.suffix != ".pt2":
        raise OutputError(f"--out {cfg.out} must end in .pt2 (the teacher is a torch.export program)")
    try:
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        cfg.out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create {cfg.run_dir} ({exc.strerror or exc})",
                          hint="choose another --out or --checkpoint-dir") from exc
    ck = cfg.run_dir / checkpoint.CHECKPOINT
    if ck.is_file() and not cfg.resume:
        if not checkpoint.load(cfg.run_dir).get("complete"):
            raise BadInputError(f"an unfinished run's checkpoint is in {ck}",
                                hint="pass --resume to continue it, or delete it (or pick another --checkpoint-dir) "
                                     "to start over")
        # a finished run's checkpoint: this run starts over, and a torchrun restart (--max-restarts)
        # must not mistake it for this run's
        ck.unlink()
    if cfg.resume:  # fail here, not in N workers: no checkpoint, or one of another trajectory
        saved = checkpoint.load(cfg.run_dir)
        checkpoint.check_compatible(saved.get("fingerprint", {}), checkpoint.fingerprint(cfg, data.n), ck)
    shutil.rmtree(cfg.run_dir / "errors", ignore_errors=True)
    (cfg.run_dir / "result.json").unlink(missing_ok=True)
    config_path = cfg.run_dir / "config.json"
    atomic_write_text(config_path, cfg.model_dump_json(indent=2))
    if cfg.nnodes > 1 and cfg.node_rank > 0:
        wait_for_endpoint(cfg.rdzv_endpoint or "", cfg.rdzv_timeout)
    for w in warnings:
        (echo or (lambda s: print(s, file=sys.stderr)))(f"warning: {w}")

    log = cfg.run_dir / f"torchrun-node{cfg.node_rank}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)}
    threads = cfg.threads or max(1, (os.cpu_count() or 1) // cfg.nproc_per_node)
    env["OMP_NUM_THREADS"] = str(threads)  # torchrun would force 1 with several processes per node
    env.setdefault("PYTHONUNBUFFERED", "1")
    tail: collections.deque[str] = collections.deque(maxlen=300)
    argv = torchrun_argv(cfg, config_path)
    with open(log, "w", encoding="utf-8") as logf:
        logf.write("$ " + " ".join(argv) + "\n")
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                errors="replace", preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        try:
            for line in proc.stdout or ():
                logf.write(line)
                tail.append(line)
                if echo and line.startswith("edgekit-train: "):
                    echo(line.rstrip("\n")[len("edgekit-train: "):])
            rc = proc.wait()
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    if rc != 0:
        _raise_failure(cfg, rc, "".join(tail), log)
    result = cfg.run_dir / "result.json"
    if not result.is_file():  # global rank 0 ran on another node and wrote the teacher there
        return TrainResult(None, None, {}, warnings, log)
    doc = json.loads(result.read_text())
    return TrainResult(cfg.out, cfg.lineage_path, doc["lineage"][0]["metrics"], warnings, log)
