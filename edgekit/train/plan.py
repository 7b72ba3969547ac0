"""The scale advisor: does this training job need more than one process?

From the data set's size, the model's parameter count and a short measured step time it estimates
the memory one device needs and the time of one epoch, then recommends one process or DDP (how many
processes and nodes), and for preprocessing Polars/DuckDB on one machine or a cluster engine.

The model (all figures are estimates; every input is in the plan so a reader can redo the sums):

* memory per device = weights (4 B/param) + gradients (4 B/param) + optimizer state (Adam 8 B/param,
  SGD+momentum 4 B/param) + DDP's gradient buckets (4 B/param, only with DDP) + activations (bytes
  saved for backward per sample, measured with saved-tensor hooks, times the per-device batch) +
  the data set when it is read into memory (``.npz``/Parquet; ``.npy`` shards are memory-mapped).
  DDP replicates the model: more processes shrink the per-device batch, never the model state.
* epoch time on one process = rows x measured seconds per sample. With k devices DDP overlaps the
  all-reduce (2(k-1)/k x 4 B/param over the link; defaults 5 GB/s within a node, 1.25 GB/s = 10 Gbit/s
  between nodes) with the backward pass, so a step takes max(compute, all-reduce); when the
  all-reduce would dominate, the plan raises the global batch until compute covers it, and says so.
* A data set read into memory that does not fit is a data-format problem, not a reason for DDP
  (every process would load it again): the plan says to write memory-mapped .npy shards.
* On CPU, processes on one node share its cores: one process with all cores as threads already uses
  them (``benchmarks/ddp_throughput.py`` measures the two side by side), so more CPU throughput means
  more nodes, not more processes per node.
* One process is recommended when the model state and a batch fit the device (80 % of its memory)
  and an epoch takes at most ``target_epoch_s`` (default 30 min): distributing such a job buys
  process start-up, a rendezvous and an all-reduce per step, and a harder job to debug, for nothing.
* Preprocessing: below ~100M rows a single machine (Polars, DuckDB) is faster and simpler than a
  cluster engine (Spark, Ray Data, Dask), whose scheduling and shuffles only pay off above that.
"""

from __future__ import annotations

import math
import os
import time
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from ..errors import BadInputError, ConfigError

SINGLE_MACHINE_ROWS = 100_000_000  # the field's rule of thumb for preprocessing on one machine
OPT_BYTES_PER_PARAM = {"adam": 8, "sgd": 4}


class PlanInputs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rows: int = Field(ge=1)
    sample_shape: tuple[int, ...]
    data_in_memory: bool = True  # False for memory-mapped .npy shards
    params: int = Field(ge=1)
    seconds_per_sample: float = Field(gt=0, description="one forward+backward+optimizer step / batch size")
    step_measured: bool  # False when the user gave it (a synthetic description)
    activation_bytes_per_sample: Optional[int] = None  # None when not measured
    batch_size: int = Field(64, ge=1)
    optimizer: Literal["adam", "sgd"] = "adam"
    device: Literal["cpu", "gpu"] = "cpu"
    device_memory_bytes: int = Field(ge=1)
    devices_per_node: int = Field(1, ge=1, description="GPUs per node; 1 for CPU (cores are threads)")
    threads: int = Field(1, ge=1)
    target_epoch_s: float = Field(1800.0, gt=0)
    intra_node_gbps: float = 5.0  # GB/s
    inter_node_gbps: float = 1.25


class MemoryEstimate(BaseModel):
    weights: int
    gradients: int
    optimizer: int
    ddp_buckets: int
    activations: Optional[int]
    data: int
    total: int


class Recommendation(BaseModel):
    mode: Literal["single", "ddp", "shard"]
    processes: int
    nproc_per_node: int
    nnodes: int
    global_batch: int
    epoch_s: float
    memory_per_device: MemoryEstimate
    why: str


class Preprocessing(BaseModel):
    engine: Literal["polars/duckdb", "cluster"]
    why: str


class Plan(BaseModel):
    inputs: PlanInputs
    single: MemoryEstimate
    epoch_s_single: float
    recommend: Recommendation
    preprocessing: Preprocessing


def _memory(p: PlanInputs, devices: int, global_batch: Optional[int] = None) -> MemoryEstimate:
    per_dev_batch = max(1, (global_batch or p.batch_size) // devices)
    act = None if p.activation_bytes_per_sample is None else p.activation_bytes_per_sample * per_dev_batch
    # an in-memory data set is loaded by every process; memory-mapped shards live in the shared page cache
    data = p.rows * (math.prod(p.sample_shape) * 4 + 8) if p.data_in_memory else 0
    parts = dict(weights=4 * p.params, gradients=4 * p.params, optimizer=OPT_BYTES_PER_PARAM[p.optimizer] * p.params,
                 ddp_buckets=4 * p.params if devices > 1 else 0, activations=act, data=data)
    return MemoryEstimate(**parts, total=sum(v or 0 for v in parts.values()))


def _allreduce_s(p: PlanInputs, devices: int) -> float:
    gbps = p.intra_node_gbps if devices <= p.devices_per_node else p.inter_node_gbps
    return 2 * (devices - 1) / devices * 4 * p.params / (gbps * 1e9)


def _ddp(p: PlanInputs, devices: int) -> tuple[int, float]:
    """(global batch, epoch seconds) with ``devices``: DDP overlaps the all-reduce with the backward
    pass, so a step takes max(compute, all-reduce); the global batch is raised until compute is
    at least the all-reduce (else more devices only wait on the network)."""
    comm = _allreduce_s(p, devices)
    batch = max(p.batch_size, math.ceil(comm * devices / p.seconds_per_sample))
    batch = math.ceil(batch / devices) * devices
    steps = max(1, p.rows // batch)
    return batch, steps * max(batch * p.seconds_per_sample / devices, comm)


def human_s(s: float) -> str:
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def human_bytes(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if b < 1024 or unit == "TiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return f"{b:.1f} TiB"


def advise(p: PlanInputs) -> Plan:
    budget = 0.8 * p.device_memory_bytes
    notes = []
    single = _memory(p, 1)
    if p.data_in_memory and single.total > budget >= single.total - single.data:
        notes.append(f"the data set ({human_bytes(single.data)}) does not fit in memory: write it as .npy shards, "
                     "which every rank memory-maps")
        p = p.model_copy(update={"data_in_memory": False})
        single = _memory(p, 1)
    t1 = p.rows * p.seconds_per_sample
    state = single.weights + single.gradients + single.optimizer
    if single.total <= budget and t1 <= p.target_epoch_s:
        rec = Recommendation(
            mode="single", processes=1, nproc_per_node=1, nnodes=1, global_batch=p.batch_size, epoch_s=t1,
            memory_per_device=single,
            why=f"one process trains an epoch in ~{human_s(t1)} (target {human_s(p.target_epoch_s)}) and needs "
                f"~{human_bytes(single.total)} of {human_bytes(p.device_memory_bytes)}; DDP would add process "
                "start-up, a rendezvous and an all-reduce every step for no gain")
    elif state + 4 * p.params > budget:
        rec = Recommendation(
            mode="shard", processes=1, nproc_per_node=1, nnodes=1, global_batch=p.batch_size, epoch_s=t1,
            memory_per_device=single,
            why=f"the model state alone (weights, gradients, optimizer: {human_bytes(state)}) exceeds the usable "
                f"{human_bytes(budget)} of one device; DDP replicates it on every device, so it cannot help: "
                "shard the model (FSDP/ZeRO) or pick a device with more memory")
    else:
        k = max(2, math.ceil(t1 / p.target_epoch_s))
        while _memory(p, k).total > budget and k < p.batch_size:
            k += 1  # more devices shrink the per-device batch (and so the activations)
        per_node = p.devices_per_node
        nnodes = math.ceil(k / per_node)
        nproc = min(k, per_node)
        k = nproc * nnodes
        batch, tk = _ddp(p, k)
        mem = _memory(p, k, batch)
        reasons = []
        if t1 > p.target_epoch_s:
            reasons.append(f"one process needs ~{human_s(t1)} per epoch (target {human_s(p.target_epoch_s)})")
        if single.total > budget:
            reasons.append(f"one device would need ~{human_bytes(single.total)} of {human_bytes(p.device_memory_bytes)}")
        where = (f"{nnodes} node(s) x {nproc} GPU process(es)" if p.device == "gpu"
                 else f"{nnodes} CPU node(s), 1 process each with all cores as threads")
        why = (f"{' and '.join(reasons)}; DDP over {where} brings an epoch to ~{human_s(tk)} and "
               f"~{human_bytes(mem.total)} per device")
        if batch > p.batch_size:
            comm_bound = math.ceil(_allreduce_s(p, k) * k / p.seconds_per_sample) > max(p.batch_size, k)
            because = (f"at {p.batch_size} each step would wait on the all-reduce of {human_bytes(4 * p.params)} "
                       "of gradients" if comm_bound else
                       f"{p.batch_size} samples cannot feed {k} devices at one sample or more each")
            why += f"; raise the global batch from {p.batch_size} to {batch} ({batch // k} per device): {because}"
        rec = Recommendation(mode="ddp", processes=k, nproc_per_node=nproc, nnodes=nnodes, global_batch=batch,
                             epoch_s=tk, memory_per_device=mem, why=why)
    if notes:
        rec = rec.model_copy(update={"why": "; ".join([*notes, rec.why])})
    if p.rows < SINGLE_MACHINE_ROWS:
        pre = Preprocessing(engine="polars/duckdb",
                            why=f"{p.rows:,} rows is below ~100M: Polars or DuckDB on one machine is faster and "
                                "simpler than a cluster engine")
    else:
        pre = Preprocessing(engine="cluster",
                            why=f"{p.rows:,} rows is above ~100M: a cluster engine (Spark, Ray Data, Dask) spreads "
                                "the preprocessing; write the result as .npy shards that each rank memory-maps")
    return Plan(inputs=p, single=single, epoch_s_single=t1, recommend=rec, preprocessing=pre)


# --- measuring ----------------------------------------------------------------------------------
def measure_step(model, x, y, *, optimizer: str = "adam", steps: int = 3, warmup: int = 1,
                 threads: Optional[int] = None) -> tuple[float, int]:
    """(seconds per sample, activation bytes per sample) from a few real training steps on this device."""
    import torch

    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        model = model.to(device).train()
        xb, yb = torch.as_tensor(x).to(device), torch.as_tensor(y).to(device)
        opt = (torch.optim.Adam(model.parameters(), lr=1e-6) if optimizer == "adam"
               else torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9))
        saved = [0]

        def pack(t):
            saved[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.zero_grad(set_to_none=True)
        times = []
        for i in range(warmup + steps):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        times.sort()
        return times[len(times) // 2] / len(xb), saved[0] // len(xb)
    finally:
        torch.set_num_threads(old_threads)


def machine() -> tuple[str, int, int]:
    """(device kind, memory bytes of one device, devices per node) of this machine."""
    import torch

    if torch.cuda.is_available():
        return "gpu", torch.cuda.get_device_properties(0).total_memory, torch.cuda.device_count()
    return "cpu", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), 1


def param_count(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def plan_for(model=None, data=None, *, rows: Optional[int] = None, sample_shape: Optional[tuple[int, ...]] = None,
             params: Optional[int] = None, seconds_per_sample: Optional[float] = None, batch_size: int = 64,
             optimizer: str = "adam", classes: Optional[int] = None, **overrides) -> Plan:
    """Build the inputs from what is given (a model and/or data) and what is measured here."""
    import numpy as np

    if optimizer not in OPT_BYTES_PER_PARAM:
        raise BadInputError(f"optimizer {optimizer!r} is not one of {sorted(OPT_BYTES_PER_PARAM)}")
    if data is not None:
        rows = rows or data.n
        sample_shape = sample_shape or data.sample_shape
        overrides.setdefault("data_in_memory", data.kind != "npy-shards")
    if rows is None or sample_shape is None:
        raise BadInputError("the plan needs the data set's size: --data DATA, or --rows N with --sample-shape C,H,W")
    kind, mem, per_node = machine()
    overrides.setdefault("data_in_memory", False)  # a described set: assume memory-mapped shards
    act = None
    measured = False
    if model is not None:
        params = params or param_count(model)
        if seconds_per_sample is None:
            b = min(batch_size, data.n if data is not None else batch_size)
            if data is not None:
                x, y = data.take(np.arange(b))
            else:  # a synthetic description: random inputs of the described shape
                rng = np.random.default_rng(0)
                x = rng.standard_normal((b, *sample_shape), dtype=np.float32)
                y = rng.integers(0, classes or 2, size=b)
            seconds_per_sample, act = measure_step(model, x, y, optimizer=optimizer,
                                                   threads=overrides.get("threads"))
            measured = True
    if params is None or seconds_per_sample is None:
        raise BadInputError("the plan needs the model: MODULE:FACTORY (measured here), or --params N with "
                            "--step-ms-per-sample MS")
    fields = dict(rows=rows, sample_shape=tuple(sample_shape), params=params, seconds_per_sample=seconds_per_sample,
                  step_measured=measured, activation_bytes_per_sample=act, batch_size=batch_size,
                  optimizer=optimizer, device=kind, device_memory_bytes=mem, devices_per_node=per_node,
                  threads=overrides.pop("threads", None) or (os.cpu_count() or 1))
    fields.update({k: v for k, v in overrides.items() if v is not None})
    from pydantic import ValidationError


    try:
        inputs = PlanInputs(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ConfigError(f"plan input {'.'.join(map(str, first['loc']))!r}: {first['msg']} (got {first.get('input')!r})",
                          hint="see `edgekit plan --help`") from exc
    return advise(inputs)


def advise_for_run(model, data, cfg) -> Plan:
    """What `edgekit train` asks before starting DDP (a few real steps, about a second)."""
    return plan_for(model, data, batch_size=cfg.batch_size, optimizer=cfg.optimizer)
