"""The pass contract: ``run(artifact, config, ctx)`` returns a new file; the base class validates
the config, checks the input format, times the work and records the lineage step. ``TorchPass`` is
the base of the passes that work on a PyTorch program: it runs ``run_torch`` with the config's
``threads`` torch threads."""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

from ..artifact import Artifact, LineageStep
from ..config import validate
from ..errors import PassError
from ..formats import Format
from ..inputs.data import Dataset

if TYPE_CHECKING:  # annotations only: the source and the metric plan import torch and the metrics
    from ..inputs.source import Source
    from ..metrics.evaluate import EvalPlan


@dataclass
class PassContext:
    """What a pass may read besides its input file and its config: the data sets, and what the run around it
    knows (each None when the run does not have it; the pass cache keys on every one: ``cache.cache_key``)."""

    workdir: Path
    calib: Dataset | None = None
    eval: Dataset | None = None
    train: Dataset | None = None
    # the model as the user gave it: convert steps to Core ML / litert-torch and the QAT rung start from its
    # PyTorch program
    source: Source | None = None
    metric_plan: EvalPlan | None = None  # the run's metric: accuracy-aware passes score with it (else top-1)
    teacher: Artifact | None = None  # distill's default teacher (the run's PyTorch model)
    arch: str | None = None  # module:Class of a state-dict model (--arch), for passes that rebuild it

    def known(self) -> dict[str, Any]:
        """The run's facts that are set, by name (the pass cache's key reads them)."""
        return {k: v for k, v in (("arch", self.arch), ("metric_plan", self.metric_plan), ("source", self.source),
                                  ("teacher", self.teacher)) if v is not None}


@dataclass
class PassOutput:
    path: Path
    precision: str
    metrics: dict[str, Any] = field(default_factory=dict)
    fmt: Format | None = None
    io: Any = None


class Pass(abc.ABC):
    name: ClassVar[str]
    Config: ClassVar[type[BaseModel]]
    input_formats: ClassVar[tuple[Format, ...]]

    def __call__(self, artifact: Artifact, config: dict | BaseModel | None, ctx: PassContext,
                 *, out_name: str | None = None) -> Artifact:
        cfg = config if isinstance(config, BaseModel) else validate(
            self.Config, config or {}, f"config of pass '{self.name}'")
        if artifact.format not in self.input_formats:
            raise PassError(f"pass '{self.name}' takes {[f.value for f in self.input_formats]} models, got "
                            f"{artifact.format.value}", hint="put a conversion step before it in the recipe")
        ctx.workdir.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        out = self.run(artifact, cfg, ctx, out_name or f"{self.name}-{artifact.sha256[:12]}")
        step = LineageStep(kind="pass", name=self.name, config=cfg.model_dump(mode="json"),
                           metrics=out.metrics, seconds=round(time.perf_counter() - start, 3))
        return artifact.derive(out.path, fmt=out.fmt, io=out.io, step=step, precision=out.precision)

    @abc.abstractmethod
    def run(self, artifact: Artifact, config: Any, ctx: PassContext, stem: str) -> PassOutput:
        """Produce the output file in ``ctx.workdir``."""


class TorchPass(Pass):
    """A pass over a PyTorch program (prune, distill, INC quantization): its config has ``threads``
    (None: torch's default), and ``run_torch`` runs with that many intra-op threads, the previous
    setting restored afterwards. torch is imported only when the pass runs."""

    input_formats: ClassVar[tuple[Format, ...]] = (Format.TORCH,)

    def run(self, artifact: Artifact, config: Any, ctx: PassContext, stem: str) -> PassOutput:
        from ._torch import torch_threads  # heavy: torch

        with torch_threads(getattr(config, "threads", None)):
            return self.run_torch(artifact, config, ctx, stem)

    @abc.abstractmethod
    def run_torch(self, artifact: Artifact, config: Any, ctx: PassContext, stem: str) -> PassOutput:
        """Produce the output file in ``ctx.workdir`` (torch threads already set)."""
