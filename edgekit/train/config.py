"""The typed settings of one training run. The launcher writes it as JSON into the run folder and
every torchrun worker reads the same file, so all ranks train with identical settings."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..errors import ConfigError

Precision = Literal["auto", "fp32", "bf16", "fp16"]


class TrainConfig(BaseModel):
    """Defaults are the documented ones: Adam, lr 1e-3, global batch 64, seed 0, checkpoint every epoch."""

    model_config = ConfigDict(extra="forbid")

    factory: str  # "module:factory" or "path/to/file.py:factory"; called with no arguments
    data: Path
    out: Path  # the .pt2 teacher; its metrics go to OUT.lineage.json
    epochs: int = Field(1, ge=1)
    batch_size: int = Field(64, ge=1, description="GLOBAL batch: split evenly over all processes")
    lr: float = Field(1e-3, gt=0)
    optimizer: Literal["adam", "sgd"] = "adam"
    seed: int = 0
    precision: Precision = "auto"
    x_key: str = "x"
    y_key: str = "y"
    input_shape: Optional[tuple[int, ...]] = None  # per sample, for flat Parquet/.npy features
    eval_data: Optional[Path] = None
    checkpoint_dir: Optional[Path] = None  # default: OUT with suffix .ckpt
    checkpoint_every: int = Field(0, ge=0, description="steps between checkpoints; 0 = at each epoch end")
    resume: bool = False
    # distribution (passed to torchrun, never interpreted by edgekit itself)
    nproc_per_node: int = Field(1, ge=1)
    nnodes: int = Field(1, ge=1)
    node_rank: int = Field(0, ge=0)
    rdzv_endpoint: Optional[str] = None  # host:port, required when nnodes > 1
    rdzv_id: Optional[str] = None
    rdzv_timeout: int = Field(300, ge=1, description="seconds to reach the endpoint / wait for all nodes")
    collective_timeout: int = Field(300, ge=1, description="seconds a collective may wait for a peer")
    max_restarts: int = Field(0, ge=0, description="torchrun restarts of the whole worker group")
    threads: Optional[int] = Field(None, ge=1, description="torch threads per process (default cores/nproc)")
    backend: Literal["auto", "gloo", "nccl"] = "auto"

    @model_validator(mode="after")
    def _check(self) -> "TrainConfig":
        if self.node_rank >= self.nnodes:
            raise ConfigError(f"--node-rank {self.node_rank} is not below --nnodes {self.nnodes}",
                              hint="node ranks run from 0 to nnodes-1")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ConfigError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (where node 0 hosts the rendezvous)",
                              hint="e.g. --rdzv-endpoint 10.0.0.1:29400 on every node")
        world = self.world_size
        if self.batch_size % world:
            raise ConfigError(f"global batch size {self.batch_size} does not split evenly over {world} processes",
                              hint=f"pass --batch-size as a multiple of {world}")
        return self

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def run_dir(self) -> Path:
        return self.checkpoint_dir or self.out.with_suffix(".ckpt")

    @property
    def lineage_path(self) -> Path:
        return lineage_path(self.out)


def lineage_path(out: Path) -> Path:
    """Where the training metrics of a teacher live: beside it, ``teacher.pt2.lineage.json``."""
    return out.with_name(out.name + ".lineage.json")
